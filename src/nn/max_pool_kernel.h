#pragma once

// Internal: lamp's own max pooling kernels for channels-last (NHWC) fp16 and
// bf16 tensors. Plain CUDA, no LibTorch types, so nvcc compiles them without
// LibTorch's headers; src/nn/max_pool_cuda.cpp is the autograd function.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class PoolDtype { kHalf, kBFloat16 };

// A square window of `kernel` x `kernel` elements, `stride` apart, with
// `padding` on every side (dilation 1, floor mode), over an NHWC input of
// n x height x width x channels; the output is n x out_height x out_width x
// channels. The kernels need kernel * kernel <= 255 (the argmax is a byte).
struct PoolGeometry {
  int64_t n;
  int64_t channels;
  int64_t height;
  int64_t width;
  int64_t out_height;
  int64_t out_width;
  int kernel;
  int stride;
  int padding;
};

// Writes the output y and, per output element, the position of its maximum
// in the window, (row - row0) * kernel + (column - column0) with (row0,
// column0) the window's unclipped top-left corner. The maximum is ATen's
// (max_pool_forward_nhwc): the first in (row, column) order, except that a
// NaN always wins (so the last NaN does), padding is never chosen.
// `vector` (8 or 1): channels per thread; 8 needs channels % 8 == 0 and
// 16-byte aligned x and y.
cudaError_t launch_max_pool_forward(
    PoolDtype dtype,
    const PoolGeometry& g,
    const void* x,
    void* y,
    uint8_t* argmax,
    int vector,
    cudaStream_t stream);

// dx from dy and the forward's argmax: each input element gathers, in the
// order of ATen's max_pool_backward_nhwc (output rows, then columns), the
// float sum of the gradients of the windows whose maximum it was.
cudaError_t launch_max_pool_backward(
    PoolDtype dtype,
    const PoolGeometry& g,
    const void* dy,
    const uint8_t* argmax,
    void* dx,
    int vector,
    cudaStream_t stream);

} // namespace lamp::nn::detail
