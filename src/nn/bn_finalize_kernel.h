#pragma once

// Internal: BatchNorm's statistics from a convolution's per-channel sums, in
// one kernel (src/nn/bn_finalize.cpp is its caller). Plain CUDA, no
// LibTorch types.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class FoldDtype { kFloat, kHalf, kBFloat16 };

// For each of `channels` channels, from float sums over `count` values:
//   mean = sum / count, var = max(sum_of_squares / count - mean^2, 0)
//   (in double), invstd = 1 / sqrt(var + eps);
//   running_mean = (1 - momentum) * running_mean + momentum * mean and
//   running_var likewise with var * count / (count - 1), when running_mean
//   is not null;
//   scale = weight * invstd, shift = bias - mean * scale (weight 1 and
//   bias 0 when null), written as `fold` (the next convolution's prologue
//   takes them in its input's dtype).
// mean and invstd are float32 (what BatchNorm's backward needs).
struct BnFinalizeArgs {
  int64_t channels = 0;
  const float* sum = nullptr;
  const float* sum_of_squares = nullptr;
  double count = 0;
  const float* weight = nullptr;
  const float* bias = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
  double momentum = 0;
  double eps = 0;
  float* mean = nullptr;
  float* invstd = nullptr;
  FoldDtype fold = FoldDtype::kFloat;
  void* scale = nullptr;
  void* shift = nullptr;
};

cudaError_t launch_bn_finalize(const BnFinalizeArgs& args, cudaStream_t stream);

} // namespace lamp::nn::detail
