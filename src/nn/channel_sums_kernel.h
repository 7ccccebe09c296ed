#pragma once

// Internal: per-channel sums of an NHWC fp16/bf16 activation, what cuDNN's
// genstats gives conv2d_stats in the convolution's epilogue, for the
// composite path where cuDNN has no such plan (bf16 on an H200 with cuDNN
// 9.19); without the squares, the column sums that are a linear layer's
// bias gradient. One read of the tensor, float32, summed in a fixed order
// (deterministic, no atomics). Plain CUDA, no LibTorch types (conv_stats.cpp
// and linear_cuda.cpp are the callers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bn_add_relu_kernel.h" // ActDtype

namespace lamp::nn::detail {

struct ChannelSumsArgs {
  ActDtype dtype = ActDtype::kHalf;
  // x is (rows, channels) row-major (NHWC with rows = N*H*W), 16-byte
  // aligned, channels a multiple of 8.
  int64_t rows = 0;
  int64_t channels = 0;
  const void* x = nullptr;
  float* partials = nullptr; // channel_sums_partial_floats(rows, channels)
  float* sum = nullptr; // [channels], or null: the rounded sums only
  // [channels] in `dtype`, or null: the sums rounded once to x's type (a
  // bias gradient, written by the fold instead of a cast kernel after it).
  void* sum_rounded = nullptr;
  float* sum_of_squares = nullptr; // [channels], or null: the sums only
};

// The scratch floats launch_channel_sums needs for this shape.
int64_t channel_sums_partial_floats(int64_t rows, int64_t channels);

// Enqueues the sums on `stream`: per-block partials, then one fold.
cudaError_t launch_channel_sums(
    const ChannelSumsArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
