#pragma once

// Internal: GradScaler's inf check for fused optimizers, which unscale the
// gradients themselves.

#include <ATen/core/Tensor.h>

#include <vector>

namespace lamp::detail {

/// Sets `found_inf` (a one-element float tensor on the gradients' device)
/// to 1 when an element of `grads` is an inf or a NaN, reading each
/// gradient once and writing none: one kernel for up to 192 CUDA fp32 or
/// fp16 tensors that are dense (non-overlapping, no gaps). The answer is
/// that of ATen's `_amp_foreach_non_finite_check_and_unscale_` with
/// inv_scale 1 (Python's `_check_inf_per_device`), which also writes every
/// gradient back unchanged: half the memory traffic. Returns the tensors it
/// left to the caller: not CUDA, not dense, or another dtype (bf16 too,
/// which ATen's kernel refuses with Python's error); all of them in a build
/// without CUDA.
std::vector<at::Tensor> check_non_finite(
    const std::vector<at::Tensor>& grads,
    const at::Tensor& found_inf);

} // namespace lamp::detail
