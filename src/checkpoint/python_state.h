#pragma once

// Internal: modules, optimizers and the RNG as Python's `state_dict()`s (nested
// dicts of CPU tensors and numbers), and back.
//
// Loading is two-phase so that a bad checkpoint changes nothing: `check_*`
// reads the whole dict and throws `c10::Error` naming the first offending
// key; `load_*` then assigns, and cannot fail on a dict that passed its
// check (short of CUDA errors).

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace lamp::detail {

/// A host copy of `t` for a checkpoint: for a device tensor, a copy into
/// pinned memory enqueued on the current stream and not waited for (many
/// small blocking copies were the bulk of a save's pause); for a CPU
/// tensor, `t` itself (detached). TrainingState::state_dict() waits for
/// the copies (wait_for_host_copies) before it returns.
at::Tensor host_copy(const at::Tensor& t);
/// Waits for the copies host_copy() enqueued on this thread's current
/// streams.
void wait_for_host_copies();

/// Python's `module.state_dict()`: each module's parameters, then its
/// buffers, then its children's, by dotted name; CPU tensors.
c10::impl::GenericDict module_state_dict(const torch::nn::Module& module);
/// Throws for a key that is missing or unexpected, or a tensor whose shape
/// or dtype differs from the module's (both shapes in the message).
void check_module_state_dict(
    const torch::nn::Module& module,
    const c10::IValue& state);
/// Copies every tensor into the module's, in place (storage kept, so that
/// captured CUDA graphs stay valid).
void load_module_state_dict(
    torch::nn::Module& module,
    const c10::IValue& state);

/// Whether `optimizer`'s state has Python's layout (torch::optim Adam,
/// AdamW, SGD and lamp's FusedAdam, FusedAdamW, FusedSGD); others are
/// saved in LibTorch's own archive format inside the dict.
bool has_python_layout(const torch::optim::Optimizer& optimizer);
/// Python's `optimizer.state_dict()`: {"state": {index: {...}},
/// "param_groups": [{hyperparameters..., "params": [indices]}]}, indices
/// counting parameters over all groups in order; CPU tensors.
c10::impl::GenericDict optimizer_state_dict(
    const torch::optim::Optimizer& optimizer);
/// Throws for a dict that does not fit `optimizer`: other group or
/// parameter counts, missing or mistyped hyperparameters, state tensors of
/// another shape. Not possible for optimizers without Python's layout
/// (their load may throw instead).
void check_optimizer_state_dict(
    const torch::optim::Optimizer& optimizer,
    const c10::IValue& state);
/// Sets hyperparameters and state as Python's `load_state_dict` does,
/// copying into existing state tensors in place.
void load_optimizer_state_dict(
    torch::optim::Optimizer& optimizer,
    const c10::IValue& state);

/// This process's RNG states, {"cpu": ByteTensor, "cuda": [ByteTensor per
/// device]}, as torch.get_rng_state() and torch.cuda.get_rng_state_all().
c10::impl::GenericDict rng_state();

/// "[2, 3]" for error messages.
std::string shape_string(c10::IntArrayRef sizes);

} // namespace lamp::detail
