#pragma once

// Internal: clip_grad_norm_ of CUDA gradients in two kernels
// (clip_grad_kernel.cu) instead of ATen's seven or eight, or in one after
// GradScaler's unscale.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace lamp::detail {

/// Python's clip_grad_norm_(grads, max_norm, norm_type=2) for gradients
/// that are all on one CUDA device, fp32/fp16/bf16, dense, any number of
/// them: returns the total norm (0-dim, their promoted dtype) after scaling
/// them in place. Two kernels (two more a further ClipList::kMax
/// gradients), no host sync, capturable. The sums of squares
/// are fp32 and added in another order than ATen's, so the norm and the
/// gradients equal Python's within fp32 rounding, not bitwise. nullopt (and
/// nothing done) where it does not apply, including builds without CUDA.
std::optional<at::Tensor> fused_clip_grad_norm_(
    const std::vector<at::Tensor>& grads,
    double max_norm);

/// The total norm of `grads` (0-dim, their promoted dtype) and the divisor
/// (0-dim fp32) `1 / min(max_norm / (norm + 1e-6), 1)`, on the device, the
/// gradients left unscaled: a fused optimizer's step dividing them by it
/// (its grad_scale) clips them. The norm is fused_clip_grad_norm_'s, bit
/// for bit (from kept sums too). nullopt where fused_clip_grad_norm_ does
/// not apply, or every gradient is empty.
struct NormDivisor {
  at::Tensor norm, divisor;
};
std::optional<NormDivisor> fused_clip_norm_divisor(
    const std::vector<at::Tensor>& grads,
    double max_norm);

/// GradScaler's unscale of one group of gradients (one CUDA device, all
/// fp32 or all fp16, dense): ATen's
/// _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
/// in one kernel that also keeps the sums of squares of the unscaled
/// gradients, so that a fused_clip_grad_norm_ of the same gradients next
/// (unchanged since) is one kernel. See Note [Sums kept from the unscale].
/// Returns false (and does nothing) where it does not apply; the caller
/// then calls ATen.
bool unscale_keeping_sums(
    const std::vector<at::Tensor>& grads,
    const at::Tensor& found_inf,
    const at::Tensor& inv_scale);

/// How many clips on this thread were one kernel on kept sums (for tests).
int64_t clips_from_kept_sums();

} // namespace lamp::detail
