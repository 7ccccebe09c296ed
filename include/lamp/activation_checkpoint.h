#pragma once

// Activation checkpointing: a part of the forward pass whose activations are
// not kept for the backward pass but recomputed there, trading compute for
// memory. Python's twin is torch.utils.checkpoint.checkpoint (the reentrant
// form, use_reentrant=True).

#include <torch/arg.h>
#include <torch/types.h>

#include <functional>
#include <vector>

#include <lamp/export.h>

namespace lamp {

/// Options of lamp::checkpoint, as torch.utils.checkpoint.checkpoint's.
struct LAMP_API CheckpointOptions {
  /// Replay the random numbers of the forward pass in the recompute (the
  /// default generators of the CPU and of the CUDA devices the inputs are
  /// on), so that dropout drops the same elements twice. Default true, as
  /// Python's. Inside a CUDA graph capture (GraphedStep) the replay is
  /// captured too. False saves a few host operations when `fn` draws no
  /// random numbers.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Keep what lamp::nn::qkv_attention's cuDNN path computes in the
  /// forward call (its output and the softmax's log-sum-exp: B*T*C values
  /// in the input's dtype and B*H*T floats a call) for the recompute, which
  /// then skips attention's forward kernel: for a GPT block, a sixth of the
  /// recompute's time for ~4 % of the block's activations. Default false
  /// (only the inputs are kept). Python's twin: selective activation
  /// checkpointing with a policy that saves the SDPA op's outputs
  /// (torch.utils.checkpoint.create_selective_checkpoint_contexts).
  TORCH_ARG(bool, keep_attention) = false;
};

/// The function a checkpoint recomputes: tensors in, tensors out.
using CheckpointFunction = std::function<std::vector<torch::Tensor>(
    const std::vector<torch::Tensor>&)>;

/// Runs `fn(inputs)` without keeping its intermediate tensors for the
/// backward pass; the backward pass runs `fn` again, with gradients, and
/// backpropagates through that run. Only `inputs` and the outputs are kept.
///
/// - The recompute runs under the autocast state (CUDA and CPU: enabled,
///   dtype, cache) of the forward call, and, by default, replays the
///   forward call's random numbers (CheckpointOptions::preserve_rng_state).
/// - Gradients reach the parameters `fn` uses (accumulated into their
///   `grad()`, as any backward pass does) and the inputs that require grad.
///   At least one input must require grad when grad mode is on, or the
///   parameters inside `fn` would silently get no gradient: that is a
///   c10::ValueError. Without grad mode (evaluation) `fn` just runs.
/// - Backpropagate with `backward()`, not `torch::autograd::grad()`: the
///   recompute's backward pass accumulates into `.grad()`, which `grad()`
///   does not read (as in Python; a clear error).
/// - Works inside lamp::GraphedStep: the capture records the recompute.
/// - Undefined tensors among `inputs` reach `fn` undefined.
/// - `fn` is called twice per step: it must compute the same thing both
///   times (no state changed by the first call, e.g. no BatchNorm running
///   statistics, which the recompute would update again).
///
/// Example (a transformer block whose activations are recomputed):
/// \code
///   auto y = lamp::checkpoint(
///       [block](const std::vector<torch::Tensor>& in) {
///         return std::vector<torch::Tensor>{block->forward(in[0])};
///       },
///       {x})[0];
/// \endcode
LAMP_API std::vector<torch::Tensor> checkpoint(
    const CheckpointFunction& fn,
    const std::vector<torch::Tensor>& inputs,
    CheckpointOptions options = {});

/// Whether this thread is running a lamp::checkpoint recompute: `fn` called
/// again by the backward pass, as opposed to the forward call (or code
/// outside any checkpoint). A function can do less there, e.g. cast its
/// block's weights in one kernel (lamp::CastWeightsGuard) where the forward
/// call's caller cast the whole model's, or leave uncomputed an output that
/// the recompute's backward pass needs only as a root
/// (lamp::nn::GeluMlpOptions::skip_output_in_recompute). Python has no twin
/// (torch.utils.checkpoint keeps the equivalent state private).
LAMP_API bool is_recomputing();

/// One tensor in, one out:
/// `lamp::checkpoint([mlp](const torch::Tensor& x) { return mlp(x); }, x)`.
LAMP_API torch::Tensor checkpoint(
    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
    const torch::Tensor& input,
    CheckpointOptions options = {});

} // namespace lamp
