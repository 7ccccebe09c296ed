#include <lamp/grad_scaler.h>

#include <lamp/clip_grad.h>
#include <lamp/config.h>
#include <lamp/dist/process_group.h>
#include <lamp/optim.h>

#include "../optim/fused_clip_grad.h"
#include "../optim/multi_tensor.h"
#include "../optim/unique_params.h"
#include "non_finite_check.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

#include <algorithm>
#include <cmath>
#include <functional>

namespace lamp {
namespace {

constexpr int64_t kLampStateVersion = 1;

using detail::on_device;

// The devices' inf/NaN flags added up on the scale's device (what a fused
// optimizer's step takes as found_inf); nullopt when none was recorded.
std::optional<torch::Tensor> total_found_inf(
    const std::vector<std::pair<c10::Device, torch::Tensor>>& per_device,
    const torch::Tensor& scale) {
  torch::Tensor found_inf;
  for (const auto& [device, t] : per_device) {
    const auto moved = on_device(t, scale.device());
    found_inf = found_inf.defined() ? found_inf + moved : moved;
  }
  return found_inf.defined() ? std::optional(found_inf) : std::nullopt;
}

// Python's _MultiDeviceReplicator: one copy of a tensor per device, made on
// first use.
torch::Tensor& replica(
    std::vector<std::pair<c10::Device, torch::Tensor>>& replicas,
    c10::Device device,
    const std::function<torch::Tensor()>& make) {
  for (auto& [d, t] : replicas) {
    if (d == device) {
      return t;
    }
  }
  replicas.emplace_back(device, make());
  return replicas.back().second;
}

} // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)) {
  if (!options_.enabled()) {
    return;
  }
  // Python checks the first two with these messages; the others guard
  // against a scale that could never recover.
  TORCH_CHECK(
      options_.growth_factor() > 1.0,
      "The growth factor must be > 1.0. (lamp::GradScalerOptions::"
      "growth_factor is ",
      options_.growth_factor(),
      ")");
  TORCH_CHECK(
      options_.backoff_factor() < 1.0,
      "The backoff factor must be < 1.0. (lamp::GradScalerOptions::"
      "backoff_factor is ",
      options_.backoff_factor(),
      ")");
  TORCH_CHECK(
      options_.backoff_factor() > 0.0,
      "lamp::GradScalerOptions::backoff_factor must be > 0, got ",
      options_.backoff_factor());
  TORCH_CHECK(
      options_.growth_interval() > 0,
      "lamp::GradScalerOptions::growth_interval must be > 0, got ",
      options_.growth_interval());
  TORCH_CHECK(
      std::isfinite(options_.init_scale()) && options_.init_scale() > 0.0,
      "lamp::GradScalerOptions::init_scale must be finite and > 0, got ",
      options_.init_scale());
}

void GradScaler::check_scale(const char* funcname) const {
  const char* fix =
      "This may indicate your script did not use scaler.scale(loss or "
      "outputs) earlier in the iteration.";
  TORCH_CHECK(
      scale_.defined(), "Attempted ", funcname, " but _scale is None.  ", fix);
  TORCH_CHECK(
      growth_tracker_.defined(),
      "Attempted ",
      funcname,
      " but _growth_tracker is None.  ",
      fix);
}

GradScaler::OptimizerState& GradScaler::state_of(
    const torch::optim::Optimizer& optimizer) {
  for (auto& state : per_optimizer_states_) {
    if (state.optimizer == &optimizer) {
      return state;
    }
  }
  per_optimizer_states_.push_back({&optimizer});
  return per_optimizer_states_.back();
}

void GradScaler::lazy_init_scale_growth_tracker(c10::Device device) {
  const auto options = at::TensorOptions().device(device);
  scale_ = at::full({}, options_.init_scale(), options.dtype(at::kFloat));
  growth_tracker_ = at::full({}, init_growth_tracker_, options.dtype(at::kInt));
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  if (!scale_.defined()) {
    lazy_init_scale_growth_tracker(outputs.device());
  }
  return outputs * on_device(scale_, outputs.device());
}

std::vector<torch::Tensor> GradScaler::scale(
    const std::vector<torch::Tensor>& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  std::vector<torch::Tensor> scaled;
  scaled.reserve(outputs.size());
  PerDevice scales;
  for (const auto& output : outputs) {
    if (!scale_.defined()) {
      lazy_init_scale_growth_tracker(output.device());
    }
    scaled.push_back(output * replica(scales, output.device(), [&] {
                       return on_device(scale_, output.device());
                     }));
  }
  return scaled;
}

GradScaler::PerDevice GradScaler::unscale_grads_(
    torch::optim::Optimizer& optimizer,
    const torch::Tensor& inv_scale,
    bool allow_fp16,
    bool keep_sums) {
  struct Group {
    c10::Device device;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    std::vector<torch::Tensor> grads{};
  };
  std::vector<Group> groups;
  torch::NoGradGuard no_grad;
  // One tensor is one parameter: a tied weight is unscaled once.
  for (const auto& params :
       detail::unique_group_params(optimizer, "lamp::GradScaler")) {
    for (const auto& param : params) {
      auto& grad = param.mutable_grad();
      if (!grad.defined()) {
        continue;
      }
      TORCH_CHECK_VALUE(
          allow_fp16 || grad.scalar_type() != at::kHalf,
          "Attempting to unscale FP16 gradients.");
      torch::Tensor to_unscale = grad;
      if (grad.is_sparse()) {
        if (grad.scalar_type() == at::kHalf) {
          grad = grad.coalesce();
        }
        to_unscale = grad._values();
      }
      auto group = std::find_if(groups.begin(), groups.end(), [&](auto& g) {
        return g.device == to_unscale.device() &&
            g.dtype == to_unscale.scalar_type();
      });
      if (group == groups.end()) {
        groups.push_back({to_unscale.device(), to_unscale.scalar_type(), {}});
        group = groups.end() - 1;
      }
      group->grads.push_back(to_unscale);
    }
  }
  PerDevice found_inf_per_device;
  PerDevice inv_scales;
  for (auto& group : groups) {
    auto& found_inf = replica(found_inf_per_device, group.device, [&] {
      return at::zeros({}, inv_scale.options().device(group.device));
    });
    const auto& inv = replica(inv_scales, group.device, [&] {
      return on_device(inv_scale, group.device);
    });
    if (inv_scale.is_same(ones_)) {
      // Only the check (the fused optimizer unscales): a read-only kernel
      // where it can, ATen's unscale by 1 for what it leaves.
      group.grads = detail::check_non_finite(group.grads, found_inf);
      if (group.grads.empty()) {
        continue;
      }
    }
    // One kernel that also keeps the sums of squares for a clip_grad_norm_
    // next (Note [Sums kept from the unscale]); ATen's where it does not
    // apply.
    if (keep_sums && !inv_scale.is_same(ones_) &&
        detail::unscale_keeping_sums(group.grads, found_inf, inv)) {
      continue;
    }
    detail::launch_multi_tensor({&group.grads}, nullptr, [&] {
      at::_amp_foreach_non_finite_check_and_unscale_(
          group.grads, found_inf, inv);
    });
  }
  if (const auto& pg = options_.process_group()) {
    for (const auto& [device, found_inf] : found_inf_per_device) {
      TORCH_CHECK(
          device == pg->device(),
          "lamp::GradScaler: gradients on ",
          device,
          " but the process group's device is ",
          pg->device(),
          "; with GradScalerOptions::process_group every gradient must be "
          "on this rank's device.");
      pg->allreduce(found_inf, dist::ReduceOp::kMax);
    }
  }
  return found_inf_per_device;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  unscale_checked_(optimizer, /*keep_sums=*/true);
}

void GradScaler::unscale_checked_(
    torch::optim::Optimizer& optimizer,
    bool keep_sums) {
  if (!options_.enabled()) {
    return;
  }
  check_scale("unscale_");
  auto& state = state_of(optimizer);
  TORCH_CHECK(
      state.stage != Stage::kUnscaled,
      "unscale_() has already been called on this optimizer since the last "
      "update().");
  TORCH_CHECK(
      state.stage != Stage::kStepped,
      "unscale_() is being called after step().");
  // NOTE: Python's scale.double().reciprocal().float() in one kernel: the
  // division runs in double (the common dtype) and is rounded to the float
  // output once, so the result is bitwise the same; two kernels fewer in a
  // graphed step.
  auto inv_scale = at::empty_like(scale_);
  at::div_out(inv_scale, at::scalar_tensor(1.0, at::kDouble), scale_);
  state.found_inf_per_device =
      unscale_grads_(optimizer, inv_scale, false, keep_sums);
  state.stage = Stage::kUnscaled;
}

void GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return;
  }
  check_scale("step");
  auto* state = &state_of(optimizer);
  TORCH_CHECK(
      state->stage != Stage::kStepped,
      "step() has already been called since the last update().");

  if (auto* fused = dynamic_cast<optim::FusedOptimizer*>(&optimizer)) {
    // The optimizer unscales (unless unscale_ did) and skips on the device.
    if (state->stage == Stage::kReady) {
      // Python's _check_inf_per_device: an inf check with inv_scale 1.
      if (!ones_.defined()) {
        ones_ = at::ones_like(scale_);
      }
      state->found_inf_per_device = unscale_grads_(optimizer, ones_, true);
    }
    std::optional<torch::Tensor> grad_scale;
    if (state->stage == Stage::kReady) {
      grad_scale = scale_;
    }
    fused->step_scaled(
        grad_scale, total_found_inf(state->found_inf_per_device, scale_));
    state->stage = Stage::kStepped;
    return;
  }

  if (state->stage == Stage::kReady) {
    // No clip can come between this unscale and the step: ATen's kernel.
    unscale_checked_(optimizer, /*keep_sums=*/false);
    state = &state_of(optimizer);
  }
  TORCH_CHECK(
      !state->found_inf_per_device.empty(),
      "No inf checks were recorded for this optimizer.");
#if LAMP_WITH_CUDA
  for (const auto& [device, t] : state->found_inf_per_device) {
    TORCH_CHECK(
        !device.is_cuda() ||
            c10::cuda::currentStreamCaptureStatusMayInitCtx() ==
                c10::cuda::CaptureStatus::None,
        "lamp::GradScaler::step: a torch::optim optimizer inside CUDA graph "
        "capture. Skipping its step needs found_inf on the host, which a "
        "graph cannot capture; use lamp::optim::FusedAdam, FusedAdamW or "
        "FusedSGD, which skip on the device.");
  }
#endif
  double found = 0.0;
  for (const auto& [device, t] : state->found_inf_per_device) {
    found += t.item<double>(); // host sync, as Python's _maybe_opt_step
  }
  if (found == 0.0) {
    optimizer.step();
  }
  state->stage = Stage::kStepped;
}

torch::Tensor GradScaler::clip_grad_norm_and_step(
    torch::optim::Optimizer& optimizer,
    double max_norm) {
  auto* fused = dynamic_cast<optim::FusedOptimizer*>(&optimizer);
  if (options_.enabled()) {
    check_scale("clip_grad_norm_and_step");
    auto& state = state_of(optimizer);
    TORCH_CHECK(
        state.stage != Stage::kStepped,
        "clip_grad_norm_and_step(): step() has already been called since "
        "the last update().");
    if (state.stage == Stage::kReady) {
      // Keeping the sums: the clip's norm is then one small kernel.
      unscale_checked_(optimizer, /*keep_sums=*/true);
    }
    if (fused) {
      auto& unscaled = state_of(optimizer);
      auto norm = fused->clip_grad_norm_and_step(
          max_norm, total_found_inf(unscaled.found_inf_per_device, scale_));
      unscaled.stage = Stage::kStepped;
      return norm;
    }
  } else if (fused) {
    return fused->clip_grad_norm_and_step(max_norm);
  }
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  auto norm = clip_grad_norm_(params, max_norm);
  step(optimizer);
  return norm;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled()) {
    return;
  }
  check_scale("update");
  if (new_scale) {
    scale_.fill_(*new_scale);
    last_found_inf_ = torch::Tensor();
  } else {
    std::vector<torch::Tensor> found_infs;
    for (const auto& state : per_optimizer_states_) {
      for (const auto& [device, t] : state.found_inf_per_device) {
        found_infs.push_back(on_device(t, scale_.device()));
      }
    }
    TORCH_CHECK(
        !found_infs.empty(), "No inf checks were recorded prior to update.");
    auto combined = found_infs[0];
    for (size_t i = 1; i < found_infs.size(); ++i) {
      combined += found_infs[i];
    }
    at::_amp_update_scale_(
        scale_,
        growth_tracker_,
        combined,
        options_.growth_factor(),
        options_.backoff_factor(),
        options_.growth_interval());
    last_found_inf_ = combined;
  }
  per_optimizer_states_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) {
    return 1.0;
  }
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

StateDict GradScaler::state_dict() const {
  auto state = new_state_dict();
  if (!options_.enabled()) {
    return state;
  }
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert(
      "_growth_tracker",
      growth_tracker_.defined() ? growth_tracker_.item<int64_t>()
                                : init_growth_tracker_);
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled()) {
    return;
  }
  TORCH_CHECK(
      !state.empty(),
      "The source state dict is empty, possibly because it was saved from a "
      "disabled instance of GradScaler.");
  auto read = [&](const char* key, bool integer) {
    const auto it = state.find(key);
    TORCH_CHECK(
        it != state.end(),
        "lamp::GradScaler::load_state_dict: missing key '",
        key,
        "'");
    const auto& v = it->value();
    TORCH_CHECK(
        v.isInt() || (!integer && v.isDouble()),
        "lamp::GradScaler::load_state_dict: key '",
        key,
        "' should be ",
        integer ? "an int" : "a number",
        ", found ",
        v.tagKind());
    return v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble();
  };
  if (const auto it = state.find("lamp_version"); it != state.end()) {
    TORCH_CHECK(
        it->value().isInt() && it->value().toInt() <= kLampStateVersion,
        "lamp::GradScaler::load: the state was written by a newer lamp "
        "(state version ",
        it->value(),
        ", this lamp reads up to ",
        kLampStateVersion,
        "); upgrade lamp.");
  }
  const double scale = read("scale", false);
  const double growth_factor = read("growth_factor", false);
  const double backoff_factor = read("backoff_factor", false);
  const auto growth_interval =
      static_cast<int64_t>(read("growth_interval", true));
  const auto tracker = static_cast<int64_t>(read("_growth_tracker", true));
  // Everything read: now assign.
  options_.init_scale(scale);
  options_.growth_factor(growth_factor);
  options_.backoff_factor(backoff_factor);
  options_.growth_interval(growth_interval);
  init_growth_tracker_ = tracker;
  if (scale_.defined()) {
    scale_.fill_(scale);
  }
  if (growth_tracker_.defined()) {
    growth_tracker_.fill_(tracker);
  }
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("lamp_version", c10::IValue(kLampStateVersion));
  for (const auto& entry : state_dict()) {
    archive.write(entry.key(), entry.value());
  }
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!options_.enabled()) {
    return;
  }
  auto state = new_state_dict();
  for (const auto* key :
       {"lamp_version",
        "scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "_growth_tracker"}) {
    c10::IValue value;
    if (archive.try_read(key, value)) {
      state.insert(key, value);
    }
  }
  if (state.size() == 1 && state.contains("lamp_version")) {
    state.clear(); // saved from a disabled scaler: Python's error
  }
  load_state_dict(state);
}

torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive,
    const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive,
    GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

} // namespace lamp
