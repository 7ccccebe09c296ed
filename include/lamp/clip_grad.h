#pragma once

// Gradient clipping that returns the norm as a device tensor: Python's
// torch.nn.utils clip_grad_norm_, get_total_norm, clip_grads_with_norm_ and
// clip_grad_value_ (torch 2.11, torch/nn/utils/clip_grad.py), op for op.
//
// One tensor is one tensor: a tensor listed more than once (a weight shared
// by two modules, which LibTorch's `parameters()` lists once per name) is
// counted and clipped once, as Python's `parameters()` lists it once.

#include <torch/types.h>

#include <optional>
#include <vector>

#include <lamp/export.h>

namespace lamp {

/// The norm of all `tensors` together, as if they were concatenated into one
/// vector: Python's `torch.nn.utils.get_total_norm`. Returns a 0-dim tensor
/// on the first tensor's device (dtype: the promoted dtype of the tensors),
/// or `torch.tensor(0.0)` (CPU, default dtype) for an empty list.
///
/// The tensors are grouped by device and dtype exactly as Python groups
/// them; each group's norms come from `at::_foreach_norm` (`foreach`
/// nullopt or true, on CPU, CUDA, XPU, MTIA and PrivateUse1 devices) or
/// from one `at::linalg_vector_norm` per tensor (`foreach` false, or other
/// devices when nullopt); `foreach` true on another device throws. The
/// total is the `norm_type` norm of the stacked norms. On CPU the result is
/// bitwise Python's.
///
/// \param norm_type the p of the p-norm: any double, e.g. 1, 2, 0 (number of
///   nonzeros), 0.5, `std::numeric_limits<double>::infinity()` (largest
///   magnitude). Default: 2.
/// \param error_if_nonfinite throw `c10::Error` (Python's message) when the
///   total norm is inf or NaN. This reads one bool on the host, a device
///   sync, as Python does; leave it false (the default) in a sync-free or
///   CUDA-graphed step.
/// \param foreach see above. Default: nullopt.
///
/// No host synchronisation otherwise (unless the tensors span several
/// devices, where the per-device norms are copied to the first device as
/// Python does), so it can be captured in a CUDA graph.
///
/// Example:
/// \code
///   std::vector<torch::Tensor> grads;
///   for (const auto& p : model->parameters()) {
///     if (p.grad().defined()) {
///       grads.push_back(p.grad());
///     }
///   }
///   torch::Tensor norm = lamp::get_total_norm(grads); // device tensor
/// \endcode
LAMP_API torch::Tensor get_total_norm(
    const std::vector<torch::Tensor>& tensors,
    double norm_type = 2.0,
    bool error_if_nonfinite = false,
    std::optional<bool> foreach = std::nullopt);

/// `get_total_norm` of one tensor.
///
/// Example:
/// \code
///   torch::Tensor norm = lamp::get_total_norm(linear->weight.grad(), 1.0);
/// \endcode
LAMP_API torch::Tensor get_total_norm(
    const torch::Tensor& tensor,
    double norm_type = 2.0,
    bool error_if_nonfinite = false,
    std::optional<bool> foreach = std::nullopt);

/// Scales the gradients of `parameters` in place by
/// `min(max_norm / (total_norm + 1e-6), 1)`, computed on the device:
/// Python's `torch.nn.utils.clip_grads_with_norm_`. Parameters without a
/// gradient are skipped. The multiplication runs even when the factor is 1,
/// as in Python: deciding would need the factor on the host. `foreach` as in
/// `get_total_norm` (`at::_foreach_mul_` or one `mul_` per gradient). No
/// host synchronisation; capturable in a CUDA graph.
///
/// Example:
/// \code
///   // Same as lamp::clip_grad_norm_(model->parameters(), 1.0), in two
///   // steps: the norm could be combined over shards in between.
///   auto norm = lamp::get_total_norm(grads);
///   lamp::clip_grads_with_norm_(model->parameters(), 1.0, norm);
/// \endcode
LAMP_API void clip_grads_with_norm_(
    const std::vector<torch::Tensor>& parameters,
    double max_norm,
    const torch::Tensor& total_norm,
    std::optional<bool> foreach = std::nullopt);

/// `clip_grads_with_norm_` of one parameter.
///
/// Example:
/// \code
///   lamp::clip_grads_with_norm_(linear->weight, 1.0, norm);
/// \endcode
LAMP_API void clip_grads_with_norm_(
    const torch::Tensor& parameter,
    double max_norm,
    const torch::Tensor& total_norm,
    std::optional<bool> foreach = std::nullopt);

/// Clips the gradient norm of `parameters` to `max_norm`, in place, and
/// returns the total norm before clipping as a 0-dim tensor on the first
/// gradient's device: Python's `torch.nn.utils.clip_grad_norm_`, i.e.
/// `get_total_norm` of the gradients followed by `clip_grads_with_norm_`.
/// Parameters without a gradient are skipped; with none, it returns
/// `torch.tensor(0.0)` (CPU) and touches nothing.
///
/// Why lamp has it: LibTorch's `torch::nn::utils::clip_grad_norm_` returns
/// the norm as a `double`, which reads it on the host: one device sync per
/// step. That breaks the sync-free step of `lamp::GradScaler` with a
/// `lamp::optim::FusedOptimizer` and cannot be captured by
/// `lamp::GraphedStep`. This one keeps the norm on the device (read it with
/// `.item()` only when you want to log it) and, with the default
/// `error_if_nonfinite = false`, never synchronises, so it can be captured
/// in a CUDA graph. CPU results are bitwise Python's.
///
/// `foreach` as in `get_total_norm`, with one addition: left at nullopt,
/// with `norm_type` 2 and `error_if_nonfinite` false, CUDA gradients (one
/// device; fp32, fp16 or bf16; dense; any number of them) are clipped by
/// lamp's own two kernels, a sum of squares and a scale (two more for each
/// further 176 gradients), instead of ATen's seven or eight (`_foreach_norm`,
/// the norm of the norms, the coefficient's arithmetic, `_foreach_mul_`): a
/// graphed step pays each kernel's launch. They sum in fp32 in another order,
/// so the norm and the gradients equal Python's within fp32 rounding rather
/// than bit for bit; pass `foreach = true` for Python's kernels exactly. Right
/// after `GradScaler::unscale_` of the same fp32 or fp16 gradients (unchanged
/// since, listed in the optimizer's order, same stream) the sum of squares
/// was already computed by the unscale's own kernel, and the clip is one
/// kernel: the same result, bit for bit.
///
/// With `GradScaler`, clip between `unscale_` and `step`, as in Python. On
/// an overflowing step the unscaled gradients hold inf/NaN, the total norm
/// is inf (or NaN), the factor is 0 (or NaN), so clipping turns the inf
/// elements into NaN (inf * 0) and the finite ones into 0 (or everything
/// into NaN). The scaler recorded the overflow in `unscale_`, so `step`
/// still skips the update and `update` backs off the scale, exactly as in
/// Python.
///
/// Example (the usual mixed-precision recipe):
/// \code
///   lamp::GradScaler scaler;
///   lamp::optim::FusedAdam optimizer(model->parameters());
///   for (auto& [x, y] : batches) {
///     optimizer.zero_grad();
///     torch::Tensor loss;
///     {
///       lamp::AutocastGuard autocast(torch::kCUDA);
///       loss = torch::cross_entropy_loss(model->forward(x), y);
///     }
///     scaler.scale(loss).backward();
///     scaler.unscale_(optimizer);
///     torch::Tensor norm = lamp::clip_grad_norm_(model->parameters(), 1.0);
///     scaler.step(optimizer);
///     scaler.update();
///   }
/// \endcode
LAMP_API torch::Tensor clip_grad_norm_(
    const std::vector<torch::Tensor>& parameters,
    double max_norm,
    double norm_type = 2.0,
    bool error_if_nonfinite = false,
    std::optional<bool> foreach = std::nullopt);

/// `clip_grad_norm_` of one parameter.
///
/// Example:
/// \code
///   auto norm = lamp::clip_grad_norm_(linear->weight, 0.5);
/// \endcode
LAMP_API torch::Tensor clip_grad_norm_(
    const torch::Tensor& parameter,
    double max_norm,
    double norm_type = 2.0,
    bool error_if_nonfinite = false,
    std::optional<bool> foreach = std::nullopt);

/// Clamps every gradient of `parameters` into `[-clip_value, clip_value]`,
/// in place: Python's `torch.nn.utils.clip_grad_value_`
/// (`at::_foreach_clamp_min_` then `at::_foreach_clamp_max_`, or one
/// `clamp_` per gradient; `foreach` as in `get_total_norm`). Parameters
/// without a gradient are skipped; with none it does nothing (Python
/// throws an internal error there). No host synchronisation.
///
/// Example:
/// \code
///   scaler.unscale_(optimizer);
///   lamp::clip_grad_value_(model->parameters(), 0.1);
///   scaler.step(optimizer);
/// \endcode
LAMP_API void clip_grad_value_(
    const std::vector<torch::Tensor>& parameters,
    double clip_value,
    std::optional<bool> foreach = std::nullopt);

/// `clip_grad_value_` of one parameter.
///
/// Example:
/// \code
///   lamp::clip_grad_value_(linear->weight, 0.1);
/// \endcode
LAMP_API void clip_grad_value_(
    const torch::Tensor& parameter,
    double clip_value,
    std::optional<bool> foreach = std::nullopt);

} // namespace lamp
