#pragma once

// Internal: the fused Adam/AdamW step through lamp's own kernel
// (adam_kernel.cu) where it applies, ATen's _fused_adam_ elsewhere
// (optim.cpp decides).

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace lamp::detail {

/// Whether adam_cuda takes these lists: fp32 CUDA tensors on one device,
/// each parameter's gradient and moments laid out as it is (same sizes and
/// strides, non-overlapping and dense), fp32 step counts there, no AMSGrad.
bool adam_cuda_applies(
    const std::vector<at::Tensor>& params,
    const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs,
    const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& steps,
    bool amsgrad,
    const std::optional<at::Tensor>& lr,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf);

/// One Adam (AdamW with `decoupled`) step, the values of ATen's
/// _fused_adam_ / _fused_adamw_ with maximize off, on the current stream.
/// `lr`, where given, is read on the device (graph replays see changes);
/// else `lr_value`. `copies` is empty or one tensor a parameter: where
/// defined, a bf16 or fp16 tensor laid out as the parameter (all of one
/// dtype), which gets the stepped parameter's values rounded to it.
/// Unless `store_grads`, gradients divided by `grad_scale` are not stored
/// back (the caller drops them).
void adam_cuda(
    const std::vector<at::Tensor>& params,
    const std::vector<at::Tensor>& copies,
    const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs,
    const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& steps,
    const std::optional<at::Tensor>& lr,
    double lr_value,
    double beta1,
    double beta2,
    double weight_decay,
    double eps,
    bool decoupled,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf,
    bool store_grads = true);

} // namespace lamp::detail
