#pragma once

// Internal: clip_grad_norm_ (2-norm) over many gradient tensors in two
// kernels, or in one after GradScaler's unscale computed the sums. Plain CUDA,
// no LibTorch types, so nvcc compiles it without LibTorch's headers;
// src/optim/fused_clip_grad.cpp is its caller.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::detail {

enum class ClipFormat : uint8_t { kFloat, kHalf, kBFloat16 };

// Up to kMax tensors, each `bytes` long from `data` (dense: every byte of the
// range is an element's), each in its own format. Passed by value as the
// kernels' argument, so it must stay below CUDA's 4 KB parameter limit; more
// tensors than kMax go in several lists, one launch of each kernel a list,
// sharing one `partials` buffer (the lists' blocks one after another).
struct ClipList {
  static constexpr int kMax = 176; // ResNet-50 has 161 parameters
  void* data[kMax];
  int64_t bytes[kMax];
  // The first thread block of each tensor (launch_clip_grad_norm sets them).
  int32_t first_block[kMax];
  ClipFormat format[kMax];
  int count = 0;
};

// The total 2-norm of the tensors in `lists[0..count)` (fp32 sums of
// squares), written to *norm in `norm_format`, and every element multiplied
// by min(max_norm / (norm + 1e-6), 1) computed in fp32 as Python's
// clip_grad_norm_ computes it for fp32 tensors (a NaN or inf norm gives a
// NaN or 0 coefficient, as there). `partials` holds
// clip_grad_norm_blocks(lists, count) floats of scratch. Deterministic: the
// same sums in the same order on every call.
cudaError_t launch_clip_grad_norm(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    float* partials,
    cudaStream_t stream);

// GradScaler's unscale fused with the first of those kernels: every
// element of the lists (fp32 or fp16; bf16 is an error, as in ATen) checked
// and multiplied by *inv_scale as ATen's
// _amp_foreach_non_finite_check_and_unscale_ does (*found_inf = 1 where an
// element is not finite), and `partials` written as launch_clip_grad_norm's
// first kernel would write them for the unscaled tensors.
cudaError_t launch_unscale_sum_squares(
    ClipList* lists,
    int count,
    const float* inv_scale,
    float* found_inf,
    float* partials,
    cudaStream_t stream);

// The second of launch_clip_grad_norm's kernels, on the `partials` that
// launch_unscale_sum_squares wrote for the same lists (unchanged since):
// together bitwise launch_clip_grad_norm after that unscale.
cudaError_t launch_clip_scale(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    const float* partials,
    cudaStream_t stream);

// The total 2-norm as launch_clip_grad_norm computes it (bitwise), written
// to *norm, and 1 / min(max_norm / (norm + 1e-6), 1) to *divisor (fp32),
// the tensors left as they are: the clip's scaling is left to a step that
// divides the gradients by *divisor as it reads them (the fused optimizers'
// grad_scale). Two kernels, or one with `kept_partials` (what
// launch_unscale_sum_squares wrote for the same lists, unchanged since;
// `partials` then unused).
cudaError_t launch_clip_norm_divisor(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    float* divisor,
    float* partials,
    const float* kept_partials,
    cudaStream_t stream);

// The scratch `partials` needs for the lists: one float a thread block.
int64_t clip_grad_norm_blocks(const ClipList* lists, int count);

} // namespace lamp::detail
