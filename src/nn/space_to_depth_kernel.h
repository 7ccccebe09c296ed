#pragma once

// Internal: the input's rearrangement of lamp::nn::space_to_depth_conv2d
// (see Note [A stride-2 convolution as a stride-1 one] in
// space_to_depth_conv.cpp) in one kernel: zero padding, 2x2 space-to-depth,
// zero channels and the cast to the convolution's dtype in one read of the
// input and one write. Plain CUDA, no LibTorch types
// (space_to_depth_cuda.cpp is the caller).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class DepthDtype { kFloat, kHalf, kBFloat16 };

struct SpaceToDepthArgs {
  DepthDtype in_dtype = DepthDtype::kFloat;
  DepthDtype out_dtype = DepthDtype::kHalf;
  // The input x[n, c, h, w] at x + n*stride_n + c*stride_c + h*stride_h +
  // w*stride_w (elements): any layout.
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t stride_n = 0, stride_c = 0, stride_h = 0, stride_w = 0;
  const void* x = nullptr;
  // out[n, i, j, k] (dense NHWC, `channels` a multiple of 8, >= 4c, 16-byte
  // aligned) = x[n, k / 4, 2i + (k / 2) % 2 - pad, 2j + k % 2 - pad], zero
  // outside x and for k >= 4c.
  int64_t pad = 0, h2 = 0, w2 = 0, channels = 0;
  void* out = nullptr;
};

// Enqueues the rearrangement on `stream`.
cudaError_t launch_space_to_depth(
    const SpaceToDepthArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
