#pragma once

#include <torch/arg.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <lamp/export.h>

namespace lamp::detail {
struct KeptCast; // src/amp/kept_casts.h
} // namespace lamp::detail

namespace lamp::optim {

/// An optimizer whose step can unscale the gradients and skip itself on the
/// device, like Python optimizers with `_step_supports_amp_scaling`.
/// `lamp::GradScaler::step` hands such an optimizer the scale and the
/// inf/NaN flag instead of reading the flag on the host, so a mixed-precision
/// step needs no host synchronisation.
///
/// One tensor is one parameter: a tensor listed more than once in a param
/// group (a weight shared by two modules, which LibTorch's `parameters()`
/// lists once per name) is kept once, with a warning, and a tensor in two
/// groups is an error (`c10::ValueError`), as in Python, where
/// `model.parameters()` lists a shared weight once.
class LAMP_API FusedOptimizer : public torch::optim::Optimizer {
 public:
  FusedOptimizer(
      const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
      std::unique_ptr<torch::optim::OptimizerOptions> defaults);

  /// `torch::optim::Optimizer::add_param_group` with each tensor once (see
  /// above); throws `c10::ValueError` if a tensor is already in a group.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  /// Runs `closure` (if any) with gradients enabled, then one plain step.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// One step in which every gradient is first divided by `grad_scale` (when
  /// given), and which leaves parameters, optimizer state and step counters
  /// untouched when `found_inf` (when given) is nonzero. Both are 0-dim
  /// float32 tensors; they are moved to each parameter's device.
  virtual void step_scaled(
      const std::optional<torch::Tensor>& grad_scale,
      const std::optional<torch::Tensor>& found_inf) = 0;

  /// Clips the gradients' total 2-norm to `max_norm` and steps: the same
  /// update as `lamp::clip_grad_norm_(params, max_norm)` followed by
  /// `step_scaled(std::nullopt, found_inf)` (Python's `clip_grad_norm_`
  /// then `step()`), over every group's parameters, each tensor once.
  /// Returns the total norm before clipping (0-dim, on the gradients'
  /// device; `torch.tensor(0.0)` when no parameter has a gradient).
  ///
  /// Why: the clip's scaling is a pass of its own over every gradient (a
  /// read and a write; 4.5 ms of a gpt2-xl step on an H100). Here the step's
  /// kernel applies it as it reads the gradient: the norm is computed on
  /// the device, its coefficient `min(max_norm / (norm + 1e-6), 1)` becomes
  /// the step's `grad_scale` (its reciprocal), and the step divides by it.
  /// So the step sees the clipped gradients within fp32 rounding of
  /// Python's (bitwise when the coefficient is 1, i.e. no clipping), and
  /// after it `param.grad()` holds them clipped, as after Python's clip and
  /// step (the fused kernels store a gradient they unscaled). A step that
  /// `found_inf` skips leaves the gradients unclipped. CUDA gradients on
  /// one device (fp32, fp16, bf16) take lamp's clip kernels (two small
  /// launches; one after `GradScaler::unscale_`, Note [Sums kept from the
  /// unscale]); elsewhere `lamp::get_total_norm`. No host sync; capturable
  /// by `lamp::GraphedStep`. With a `GradScaler`, call its
  /// `clip_grad_norm_and_step` instead (it unscales first).
  ///
  /// Example:
  /// \code
  ///   loss.backward();
  ///   torch::Tensor norm = optimizer.clip_grad_norm_and_step(1.0);
  ///   optimizer.zero_grad();
  /// \endcode
  torch::Tensor clip_grad_norm_and_step(
      double max_norm,
      const std::optional<torch::Tensor>& found_inf = std::nullopt);

  /// Keep each param group's learning rate in a 0-dim CUDA tensor that the
  /// kernels read, instead of passing it by value, so that a step captured
  /// in a CUDA graph follows later changes of `lr`. `lamp::GraphedStep`
  /// turns this on. Default: off.
  void use_device_lr(bool enabled) {
    device_lr_ = enabled;
  }
  bool uses_device_lr() const {
    return device_lr_;
  }
  /// Let every step leave the gradients it stepped with undefined, as
  /// `zero_grad()` (which sets them to none) right after it would, so that
  /// it need not store them. Default: off.
  ///
  /// Why: a step that divides the gradients (by `GradScaler`'s scale, or
  /// by the clip's coefficient in `clip_grad_norm_and_step`) stores them
  /// divided, as Python's fused kernels do, so that `param.grad()` holds
  /// what the step used: a write of 4 bytes a parameter (gpt2-xl: 6.2 GB,
  /// ~2 ms of an H100 step) that a loop calling `zero_grad()` next throws
  /// away. With this on, `FusedAdam`'s and `FusedAdamW`'s kernel for fp32
  /// CUDA parameters skips that store; other steps store as before and
  /// then drop the gradients (the same result). Parameters, optimizer
  /// state and the returned norm are bitwise what they are with it off; a
  /// step that `found_inf` skips drops the gradients too. Only for loops
  /// that do not read `param.grad()` after the step (the next backward
  /// makes new gradients, as after `zero_grad()`). Works inside
  /// `lamp::GraphedStep` and with `lamp::DistributedDataParallel`.
  ///
  /// Example:
  /// \code
  ///   optimizer.zero_grad_in_step(true);
  ///   scaler.scale(loss).backward();
  ///   scaler.clip_grad_norm_and_step(optimizer, 1.0); // grads now undefined
  ///   scaler.update();
  /// \endcode
  void zero_grad_in_step(bool enabled) {
    zero_grad_in_step_ = enabled;
  }
  bool zeroes_grad_in_step() const {
    return zero_grad_in_step_;
  }
  /// Internal (the steps): leaves the gradients of `params` undefined when
  /// `zeroes_grad_in_step()`. Call after the step's kernels are launched.
  void finish_grads(const std::vector<torch::Tensor>& params) const;

  /// Creates the device tensor of every param group on every CUDA device
  /// its parameters are on (once), and copies changed learning rates into
  /// them (one small kernel each, only when changed). `step()` does the
  /// copy, except during CUDA graph capture; `lamp::GraphedStep` calls this
  /// before the capture and before every replay, so that no tensor is
  /// created (and its value baked in) during a capture.
  void sync_device_lr();
  /// The device tensor holding param group `group`'s learning rate on
  /// `device`, or nullopt when device lr is off or `device` is not CUDA.
  /// Throws during a CUDA graph capture if the tensor does not exist yet
  /// (see `sync_device_lr`).
  std::optional<torch::Tensor> device_lr(size_t group, c10::Device device);

  /// Keep a 16-bit copy (`dtype`: `torch::kBFloat16` or `torch::kHalf`) of
  /// each fp32 parameter that a `lamp::CastWeightsGuard` casts to `dtype`,
  /// written by every step as it writes the parameter, and let the guard
  /// take the copy instead of casting. `torch::kFloat` (the default) keeps
  /// none and frees the copies.
  ///
  /// Why: under autocast each step casts every weight to 16 bits again, a
  /// read of 4 bytes and a write of 2 a parameter, right after the step
  /// wrote the fp32 values (gpt2-xl: 3 ms of an H100 step, twice that with
  /// activation checkpointing). `FusedAdam` and `FusedAdamW` write the copy
  /// in their kernel for fp32 CUDA parameters (2 bytes more a parameter);
  /// other steps and devices cast after the step (no gain, the same
  /// values). The forward sees the same bits as with a cast, so training
  /// is unchanged. A copy is made at a guard's first use (2 bytes a
  /// parameter, kept) and used only while its parameter's version counter
  /// and storage are what they were when it was written: an in-place
  /// change (under `torch::NoGradGuard`), `set_data` or loading a
  /// checkpoint makes the next guard cast it again; a change made through
  /// `.data()` cannot be seen (its version counter is another tensor's):
  /// call `keep_weight_casts` again after one. `lamp::GraphedStep` checks
  /// the copies its graph reads before every replay.
  ///
  /// Example:
  /// \code
  ///   lamp::optim::FusedAdamW optimizer(model->parameters());
  ///   optimizer.keep_weight_casts(torch::kBFloat16);
  ///   {
  ///     lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
  ///     lamp::CastWeightsGuard cast(*model); // takes the copies
  ///     loss = model->forward(x).mean();
  ///   }
  /// \endcode
  void keep_weight_casts(c10::ScalarType dtype);
  /// The dtype of the kept copies; `torch::kFloat` when none are kept.
  c10::ScalarType kept_weight_casts() const {
    return kept_dtype_;
  }
  /// Internal (GraphedStep): the kept copies that exist now, which a step
  /// writes.
  std::vector<std::shared_ptr<lamp::detail::KeptCast>> kept_casts_in_use()
      const;
  /// Internal (the steps): the kept copies of `params` for a step to write
  /// (undefined where a parameter has none yet).
  std::vector<torch::Tensor> kept_copies(
      const std::vector<torch::Tensor>& params) const;
  /// After a step wrote `params`: casts them into `copies` (from
  /// kept_copies) unless `written` (the step's kernel wrote them), and
  /// records the copies current. Call after the params' versions moved.
  void finish_kept_copies(
      const std::vector<torch::Tensor>& params,
      const std::vector<torch::Tensor>& copies,
      bool written);

 private:
  // Entries for the fp32 parameters of every group (keep_weight_casts).
  void update_kept_casts();

  struct DeviceLr {
    size_t group;
    c10::Device device;
    torch::Tensor lr; // 0-dim float32 on `device`
    double value; // what `lr` holds
  };
  bool device_lr_ = false;
  bool zero_grad_in_step_ = false;
  std::vector<DeviceLr> device_lrs_;
  c10::ScalarType kept_dtype_ = c10::ScalarType::Float;
  std::unordered_map<
      const c10::TensorImpl*,
      std::shared_ptr<lamp::detail::KeptCast>>
      kept_;
};

/// Per-parameter state of `FusedAdam` and `FusedAdamW`: as
/// `torch::optim::AdamParamState`, but `step` is a 0-dim float32 tensor on
/// the parameter's device (as Python's fused Adam), so that a step skipped on
/// the device does not advance it.
struct LAMP_API FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, max_exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

namespace detail {

/// FusedAdam's and FusedAdamW's one implementation: `Options` is
/// torch::optim::AdamOptions (L2 weight decay, `at::_fused_adam_`) or
/// AdamWOptions (decoupled, `at::_fused_adamw_`).
template <typename Options>
class LAMP_API FusedAdamBase : public FusedOptimizer {
 public:
  FusedAdamBase(
      const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
      Options defaults);

  void step_scaled(
      const std::optional<torch::Tensor>& grad_scale,
      const std::optional<torch::Tensor>& found_inf) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

extern template class FusedAdamBase<torch::optim::AdamOptions>;
extern template class FusedAdamBase<torch::optim::AdamWOptions>;

} // namespace detail

/// Adam on `at::_fused_adam_`: one kernel per device and dtype, as Python's
/// `torch.optim.Adam(fused=True)`. Options and defaults are
/// `torch::optim::AdamOptions`. Parameters must be floating point on CPU or
/// CUDA; sparse gradients are not supported.
///
/// Example:
/// \code
///   lamp::optim::FusedAdam optimizer(
///       model->parameters(), torch::optim::AdamOptions(1e-4));
/// \endcode
class LAMP_API FusedAdam
    : public detail::FusedAdamBase<torch::optim::AdamOptions> {
 public:
  explicit FusedAdam(
      const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
      torch::optim::AdamOptions defaults = {})
      : FusedAdamBase(param_groups, std::move(defaults)) {}
  explicit FusedAdam(
      std::vector<torch::Tensor> params,
      torch::optim::AdamOptions defaults = {})
      : FusedAdam(
            {torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}
};

/// AdamW (decoupled weight decay) on `at::_fused_adamw_`, as Python's
/// `torch.optim.AdamW(fused=True)`. Options and defaults are
/// `torch::optim::AdamWOptions` (weight decay 1e-2).
///
/// Example:
/// \code
///   lamp::optim::FusedAdamW optimizer(model->parameters());
/// \endcode
class LAMP_API FusedAdamW
    : public detail::FusedAdamBase<torch::optim::AdamWOptions> {
 public:
  explicit FusedAdamW(
      const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
      torch::optim::AdamWOptions defaults = {})
      : FusedAdamBase(param_groups, std::move(defaults)) {}
  explicit FusedAdamW(
      std::vector<torch::Tensor> params,
      torch::optim::AdamWOptions defaults = {})
      : FusedAdamW(
            {torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}
};

/// SGD with momentum, dampening, Nesterov and weight decay on
/// `at::_fused_sgd_`, as Python's `torch.optim.SGD(fused=True)`. Options
/// and state are `torch::optim::SGDOptions` / `SGDParamState` (the learning
/// rate has no default).
///
/// NOTE: the momentum buffers are created zero-filled at the first step; if
/// that very step is skipped for inf/NaN, the next one updates the zero
/// buffer (`buf = (1 - dampening) * grad`) instead of copying the gradient,
/// which differs only when dampening is nonzero. Python's fused SGD starts
/// from an uninitialised buffer there.
///
/// Example:
/// \code
///   lamp::optim::FusedSGD optimizer(
///       model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
/// \endcode
class LAMP_API FusedSGD : public FusedOptimizer {
 public:
  explicit FusedSGD(
      const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
      torch::optim::SGDOptions defaults);
  explicit FusedSGD(
      std::vector<torch::Tensor> params,
      torch::optim::SGDOptions defaults)
      : FusedSGD(
            {torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}

  void step_scaled(
      const std::optional<torch::Tensor>& grad_scale,
      const std::optional<torch::Tensor>& found_inf) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

} // namespace lamp::optim
