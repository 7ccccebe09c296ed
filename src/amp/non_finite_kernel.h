#pragma once

// Internal: a read-only inf/NaN check over many gradient tensors in one
// kernel. Plain CUDA, no LibTorch types, so nvcc compiles it without
// LibTorch's headers; src/amp/non_finite_check.cpp is its caller.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::detail {

enum class FloatFormat { kFloat, kHalf };

// Up to kMax tensors of one format, each `bytes` long from `data` (dense:
// every byte of the range is an element's). Passed by value as the kernel's
// argument, so it must stay below CUDA's 4 KB parameter limit.
struct NonFiniteList {
  static constexpr int kMax = 192;
  const void* data[kMax];
  int64_t bytes[kMax];
  // The first thread block of each tensor (the kernel fills in the grid
  // from these; launch_non_finite_check sets them).
  int32_t first_block[kMax];
  int count = 0;
};

// Sets *found_inf to 1 when an element of a tensor in `list` is an inf or a
// NaN (leaves it as it is otherwise).
cudaError_t launch_non_finite_check(
    FloatFormat format,
    NonFiniteList& list,
    float* found_inf,
    cudaStream_t stream);

} // namespace lamp::detail
