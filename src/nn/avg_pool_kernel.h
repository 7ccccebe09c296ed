#pragma once

// Internal: the backward kernel of lamp::nn::global_avg_pool2d for
// channels-last (NHWC) tensors. Plain CUDA, no LibTorch types, so nvcc
// compiles it without LibTorch's headers; src/nn/avg_pool.cpp is the
// autograd function.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class AvgPoolDtype { kFloat, kHalf, kBFloat16 };

// dx[n, p, c] = dy[n, c] * (1 / pixels) for an NHWC dx of n x pixels x
// channels and a dense n x channels dy, computed in float and rounded once,
// as ATen's mean backward (expand, then a multiplication by the reciprocal,
// BinaryDivTrueKernel.cu). `vector`: elements a thread writes at once, 16
// bytes' worth (8 fp16/bf16, 4 fp32) where channels divide by it and dx is
// 16-byte aligned, else 1.
cudaError_t launch_global_avg_pool_backward(
    AvgPoolDtype dtype,
    int64_t n,
    int64_t pixels,
    int64_t channels,
    const void* dy,
    void* dx,
    int vector,
    cudaStream_t stream);

} // namespace lamp::nn::detail
