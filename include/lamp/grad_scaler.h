#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lamp/export.h>
#include <lamp/state_dict.h>

namespace lamp {
namespace dist {
class ProcessGroup;
} // namespace dist

/// Options of `GradScaler`; defaults are those of `torch.amp.GradScaler`.
struct LAMP_API GradScalerOptions {
  /// Initial scale factor. Default: 65536 (2^16).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Factor the scale is multiplied by after `growth_interval` consecutive
  /// steps without inf/NaN gradients. Must be > 1. Default: 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Factor the scale is multiplied by after a step with inf/NaN gradients.
  /// Must be < 1. Default: 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Number of consecutive unskipped steps before the scale grows. Must be
  /// > 0. Default: 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// When false, every method is a pass-through: `scale` returns its input,
  /// `step` calls `optimizer.step()`, `update` does nothing. Default: true.
  TORCH_ARG(bool, enabled) = true;
  /// When set, the inf/NaN flag is combined (maximum) over the group's
  /// ranks on the device, so that every rank skips the same steps even when
  /// their gradients differ, e.g. when stepping on gradients accumulated
  /// under `DistributedDataParallel::no_sync()`. Not needed with averaged
  /// DDP gradients: those are identical on every rank. Costs one tiny
  /// allreduce per `unscale_`/`step`, no host sync. Default: none (lamp
  /// extension; Python's GradScaler has no such option).
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, process_group) = nullptr;
};

/// Dynamic loss scaling for mixed-precision training, with the semantics,
/// method names and error messages of Python's `torch.amp.GradScaler`
/// (torch 2.11, `torch/amp/grad_scaler.py`).
///
/// `scale(loss)` multiplies the loss by the scale so that small fp16
/// gradients do not flush to zero; `unscale_(optimizer)` divides the
/// optimizer's gradients by it in place and records whether any is inf/NaN;
/// `step(optimizer)` unscales if needed and skips `optimizer.step()` when a
/// gradient was inf/NaN; `update()` then backs the scale off after an
/// overflow, or grows it after `growth_interval` clean steps. Each optimizer
/// goes READY → UNSCALED → STEPPED between two `update()` calls, and misuse
/// (unscaling twice, stepping twice, unscaling after stepping) throws
/// `c10::Error` with Python's message.
///
/// The scale and the growth tracker live on the device of the first tensor
/// passed to `scale()`. Gradients may be spread over several devices and
/// dtypes; they are grouped per device and dtype as in Python.
///
/// Host synchronisation: with a `torch::optim` optimizer, `step()` reads the
/// inf/NaN flag on the host (one sync per step, as in Python). With a
/// `lamp::optim::FusedOptimizer` (`FusedAdam`, `FusedAdamW`, `FusedSGD`) the
/// kernel unscales and skips on the device and the whole
/// `scale`/`step`/`update` sequence never synchronises, so it can be
/// captured in a CUDA graph. `get_scale()` synchronises; watch
/// `get_scale_async()` and `get_found_inf_async()` instead. Clip between
/// `unscale_` and `step` with `lamp::clip_grad_norm_` (clip_grad.h), which
/// keeps the norm on the device (and, on CUDA, finds its sums of squares
/// already computed by `unscale_`); LibTorch's
/// `torch::nn::utils::clip_grad_norm_` returns a double, a sync per step.
///
/// Example:
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
///     scaler.unscale_(optimizer);  // optional: to clip unscaled grads
///     lamp::clip_grad_norm_(model->parameters(), 1.0);  // no host sync
///     scaler.step(optimizer);
///     scaler.update();
///   }
///   torch::save(scaler, "scaler.pt");
/// \endcode
class LAMP_API GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  ~GradScaler() = default;

  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// `outputs * scale`, the scale moved to `outputs`' device. The first call
  /// puts the scale on that device. Pass-through when disabled.
  torch::Tensor scale(const torch::Tensor& outputs);
  /// Each tensor times the scale (one copy of the scale per device).
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides the gradients of `optimizer`'s parameters by the scale, in
  /// place, and records whether any was inf/NaN. Optional: `step()` does it
  /// when it was not called. At most once per optimizer between `update()`s,
  /// and not after `step()`. Throws for fp16 gradients.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales the gradients if `unscale_` was not called, then runs
  /// `optimizer.step()` unless a gradient was inf/NaN. A
  /// `lamp::optim::FusedOptimizer` does both on the device without a host
  /// sync. At most once per optimizer between `update()`s.
  void step(torch::optim::Optimizer& optimizer);

  /// `unscale_(optimizer)` (unless called), `lamp::clip_grad_norm_` of its
  /// parameters to `max_norm`, then `step(optimizer)`: Python's
  /// \code{.py}
  ///   scaler.unscale_(optimizer)
  ///   norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
  ///   scaler.step(optimizer)
  /// \endcode
  /// in one call that returns the norm (a device tensor). With a
  /// `lamp::optim::FusedOptimizer` the clip's scaling is done by the step's
  /// kernel (`FusedOptimizer::clip_grad_norm_and_step`): one pass over the
  /// gradients fewer, no host sync. Disabled, it clips and steps. Call
  /// `update()` after it, as after `step`.
  ///
  /// Example:
  /// \code
  ///   scaler.scale(loss).backward();
  ///   torch::Tensor norm = scaler.clip_grad_norm_and_step(optimizer, 1.0);
  ///   scaler.update();
  /// \endcode
  torch::Tensor clip_grad_norm_and_step(
      torch::optim::Optimizer& optimizer,
      double max_norm);

  /// Ends the iteration: backs off the scale if any optimizer stepped (or
  /// was unscaled) with inf/NaN gradients this iteration, else counts a
  /// clean step and grows the scale every `growth_interval` clean steps.
  /// `new_scale` sets the scale instead.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (synchronises with the device); `init_scale` before
  /// the first `scale()`, 1 when disabled.
  double get_scale() const;
  /// The scale as a 0-dim float32 device tensor, without a sync; undefined
  /// before the first `scale()` or when disabled.
  torch::Tensor get_scale_async() const {
    return scale_;
  }
  /// 0-dim float32 tensor on the scale's device, nonzero when the last
  /// `update()` saw inf/NaN gradients (that step was skipped); undefined
  /// before the first `update()`. Overwritten by the next `update()`.
  torch::Tensor get_found_inf_async() const {
    return last_found_inf_;
  }
  bool is_enabled() const {
    return options_.enabled();
  }

  double get_growth_factor() const {
    return options_.growth_factor();
  }
  void set_growth_factor(double new_factor) {
    options_.growth_factor(new_factor);
  }
  double get_backoff_factor() const {
    return options_.backoff_factor();
  }
  void set_backoff_factor(double new_factor) {
    options_.backoff_factor(new_factor);
  }
  int64_t get_growth_interval() const {
    return options_.growth_interval();
  }
  void set_growth_interval(int64_t new_interval) {
    options_.growth_interval(new_interval);
  }

  /// Python's `state_dict()`: `scale`, `growth_factor`, `backoff_factor`,
  /// `growth_interval`, `_growth_tracker`; empty when disabled. Reads the
  /// scale and tracker from the device (a host sync).
  StateDict state_dict() const;
  /// Python's `load_state_dict()`. Checks every key and type first: a bad
  /// dict throws `c10::Error` naming the key and changes nothing. Throws
  /// for an empty dict (saved from a disabled scaler), as Python. No-op
  /// when disabled.
  void load_state_dict(const StateDict& state);

  /// Writes `scale`, `growth_factor`, `backoff_factor`, `growth_interval`
  /// and `_growth_tracker` (Python's state_dict keys; nothing when disabled)
  /// and `lamp_version`.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what `save` wrote. Throws if the archive holds no scaler state
  /// (e.g. it was saved from a disabled scaler). No-op when disabled.
  void load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  using PerDevice = std::vector<std::pair<c10::Device, torch::Tensor>>;
  struct OptimizerState {
    const torch::optim::Optimizer* optimizer = nullptr;
    Stage stage = Stage::kReady;
    PerDevice found_inf_per_device{};
  };

  void lazy_init_scale_growth_tracker(c10::Device device);
  void check_scale(const char* funcname) const;
  OptimizerState& state_of(const torch::optim::Optimizer& optimizer);
  // keep_sums: also keep the sums of squares for a clip_grad_norm_ next
  // (only an explicit unscale_ can be followed by one).
  PerDevice unscale_grads_(
      torch::optim::Optimizer& optimizer,
      const torch::Tensor& inv_scale,
      bool allow_fp16,
      bool keep_sums = false);
  void unscale_checked_(torch::optim::Optimizer& optimizer, bool keep_sums);

  GradScalerOptions options_;
  torch::Tensor scale_;
  torch::Tensor growth_tracker_;
  torch::Tensor ones_; // inv_scale of the fused path's inf check
  int64_t init_growth_tracker_ = 0;
  torch::Tensor last_found_inf_;
  std::vector<OptimizerState> per_optimizer_states_{};
};

/// Serializes `scaler` so that `torch::save(scaler, path)` works.
LAMP_API torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive,
    const GradScaler& scaler);
/// Deserializes into `scaler` so that `torch::load(scaler, path)` works.
LAMP_API torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive,
    GradScaler& scaler);

} // namespace lamp
