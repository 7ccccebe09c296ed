#pragma once

// Internal: delayed FP8 scaling's update (fp8_linear.h's
// fp8_update_delayed) in one kernel: what ATen does in about a dozen small
// launches a layer (amax of each history row, fp8 max / amax, the margin,
// the where, the roll, the zeroed column), bit for bit; and the same for
// many layers in one launch (lamp::update_fp8_scales). Plain CUDA, no
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

/// Layers one launch of launch_fp8_scale_updates takes (their pointers
/// travel in the kernel's parameters: 2 KiB of the 4 KiB it may have).
inline constexpr int kFp8UpdatesPerLaunch = 128;

/// The update of `n` layers on `stream`, a block each, in
/// ceil(n / kFp8UpdatesPerLaunch) launches: `histories[i]` and `scales[i]`
/// as `shared`'s `history` and `scale` (whose own pointers are ignored);
/// `len`, `most_recent` and `margin_scale` are every layer's.
cudaError_t launch_fp8_scale_updates(
    const Fp8ScaleUpdateArgs& shared,
    float* const* histories,
    float* const* scales,
    int n,
    cudaStream_t stream);

} // namespace lamp::nn::detail
