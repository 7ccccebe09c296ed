#pragma once

// Internal: lamp::nn::batch_norm_act on cuDNN's fused NHWC batch-norm kernels.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace lamp::nn::detail {

/// `relu(batch_norm(input) + residual)` with batch statistics (training
/// mode) on cuDNN's fused kernels, as an autograd function whose backward is
/// one fused cuDNN call too. Updates `running_mean` / `running_var` (both
/// undefined, or both defined) with weight `momentum`. Returns nullopt and
/// says why in `why` when these inputs are not for cuDNN (not CUDA, not
/// channels-last fp16/bf16, ...) or cuDNN rejected them; nothing ran then.
/// The caller has checked ranks and sizes.
std::optional<at::Tensor> cudnn_batch_norm_act(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double momentum,
    double eps,
    bool relu,
    std::string& why);

} // namespace lamp::nn::detail
