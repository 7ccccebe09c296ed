#pragma once

// Internal: the tail of a ResNet bottleneck after its convolutions,
// relu(bn(y) + shortcut), as two passes over NHWC activations whose
// BatchNorm statistics are already known (from the convolutions' sums,
// src/nn/conv_stats.h and bn_finalize.h), and its backward as two more
// (src/nn/conv_bn_add_relu.cpp is the caller). Plain CUDA, no LibTorch
// types.
//
// The shortcut is either a tensor added as it is (the identity), or the
// downsampling convolution's raw output with its own BatchNorm folded in:
// both normalisations, the add and the ReLU are one pass, which writes the
// output and one bit a value (the ReLU's mask: 1/16 of an fp16 tensor, so
// the backward need not read the output again).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class ActDtype { kHalf, kBFloat16 };

// All activations are (rows, channels) row-major (NHWC with rows = N*H*W),
// 16-byte aligned, channels a multiple of 8. Per-channel vectors float32;
// scale, shift, mean and the coefficients 32-byte aligned (lamp allocates
// them); weights need not be.
struct BnAddReluForwardArgs {
  ActDtype dtype = ActDtype::kHalf;
  int64_t rows = 0;
  int64_t channels = 0;
  const void* y = nullptr;
  const float* scale = nullptr; // bn's weight * invstd
  const float* shift = nullptr; // bn's bias - mean * scale
  const void* z = nullptr; // the shortcut
  const float* z_scale = nullptr; // null: z added as it is
  const float* z_shift = nullptr;
  void* out = nullptr; // relu(y * scale + shift + [z * z_scale + z_shift | z])
  uint8_t* mask = nullptr; // rows * channels / 8 bytes: out > 0, bit i of
                           // byte k for value 8k + i
};

cudaError_t launch_bn_add_relu_forward(
    const BnAddReluForwardArgs& args,
    cudaStream_t stream);

// The backward, from dout (the gradient of out) and the mask, g = dout where
// out > 0 else 0; for each normalised branch (y, and z when it was
// normalised) with x its input, M = rows, xhat = (x - mean) * invstd:
//   dbias = sum(g), dweight = sum(g * xhat),
//   dx = weight * invstd * (g - dbias / M - xhat * dweight / M);
// and for the identity shortcut dz = g.
struct BnAddReluBackwardArgs {
  ActDtype dtype = ActDtype::kHalf;
  int64_t rows = 0;
  int64_t channels = 0;
  const void* dout = nullptr;
  const uint8_t* mask = nullptr;
  const void* y = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* weight = nullptr;
  const void* z = nullptr; // null: the identity shortcut
  const float* z_mean = nullptr;
  const float* z_invstd = nullptr;
  const float* z_weight = nullptr;
  // Scratch, float32: partial_floats(rows, channels) and
  // 6 * channels (the dx coefficients).
  float* partials = nullptr;
  float* coefficients = nullptr;
  // Outputs: dy; dz (either branch's); dweight, dbias (float32 [C]) of
  // bn and, when z was normalised, of z's BatchNorm.
  void* dy = nullptr;
  void* dz = nullptr;
  float* dweight = nullptr;
  float* dbias = nullptr;
  float* z_dweight = nullptr;
  float* z_dbias = nullptr;
};

// The float32 scratch the backward's first pass needs for its per-block
// partial sums.
int64_t bn_add_relu_partial_floats(int64_t rows, int64_t channels);

cudaError_t launch_bn_add_relu_backward(
    const BnAddReluBackwardArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
