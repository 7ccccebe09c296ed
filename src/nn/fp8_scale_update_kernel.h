#pragma once

// Internal: delayed FP8 scaling's update (fp8_linear.h's
// fp8_update_delayed) in one kernel: what ATen does in about a dozen small
// launches a layer (amax of each history row, fp8 max / amax, the margin,
// the where, the roll, the zeroed column), bit for bit. Plain CUDA, no
// LibTorch types.

#include <cuda_runtime_api.h>

namespace lamp::nn::detail {

/// Histories this kernel takes: at most this many columns.
inline constexpr int kFp8UpdateMaxHistory = 1024;

struct Fp8ScaleUpdateArgs {
  float* history = nullptr; // [3, len], contiguous: input, weight, gradient
  float* scale = nullptr; // [3]
  int len = 0; // 1 ... kFp8UpdateMaxHistory
  bool most_recent = false; // amax: column 0, else the row's largest
  // 2^-margin as ATen's division by 2^margin computes it (its reciprocal,
  // in fp32).
  float margin_scale = 1.0f;
};

/// Enqueues the update on `stream`: one block, a warp a row.
cudaError_t launch_fp8_scale_update(
    const Fp8ScaleUpdateArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
