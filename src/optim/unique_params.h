#pragma once

// Internal: one tensor is one parameter.
//
// LibTorch's Module::parameters() lists a tensor once per name it is
// registered under, so a weight tied the usual way (a GPT's LM head sharing
// the token embedding) is listed twice; Python's parameters() lists it once.
// Wherever lamp walks parameters or gradients (the fused optimizers,
// GradScaler, clipping, DDP, checkpoints) it goes through these, so that a
// tensor is stepped, unscaled, counted, reduced and saved once.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace lamp::detail {

/// `tensors` with each tensor (TensorImpl) once, in the order first seen.
/// Undefined tensors are kept as they are.
std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& tensors);

/// The parameters of each of `optimizer`'s param groups, each tensor once.
/// A tensor listed twice in one group counts once, with one warning a
/// process (TORCH_WARN_ONCE, as Python's optimizers warn); a tensor in two
/// groups is an error (c10::ValueError, as Python's add_param_group raises),
/// since its two groups' options would both apply to it. `who` starts the
/// messages.
std::vector<std::vector<at::Tensor>> unique_group_params(
    const torch::optim::Optimizer& optimizer,
    const char* who);

/// `groups` with each group's repeats removed, under the same rules as
/// unique_group_params (for an optimizer's constructor).
std::vector<torch::optim::OptimizerParamGroup> unique_param_groups(
    const std::vector<torch::optim::OptimizerParamGroup>& groups,
    const char* who);

} // namespace lamp::detail
