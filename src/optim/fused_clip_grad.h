#pragma once

// Internal: clip_grad_norm_ of CUDA gradients in two kernels
// (clip_grad_kernel.cu) instead of ATen's seven or eight.

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace lamp::detail {

/// Python's clip_grad_norm_(grads, max_norm, norm_type=2) for gradients
/// that are all on one CUDA device, fp32/fp16/bf16, dense, at most 176 of
/// them: returns the total norm (0-dim, their promoted dtype) after scaling
/// them in place. Two kernels, no host sync, capturable. The sums of squares
/// are fp32 and added in another order than ATen's, so the norm and the
/// gradients equal Python's within fp32 rounding, not bitwise. nullopt (and
/// nothing done) where it does not apply, including builds without CUDA.
std::optional<at::Tensor> fused_clip_grad_norm_(
    const std::vector<at::Tensor>& grads,
    double max_norm);

} // namespace lamp::detail
