// ReduceLROnPlateau: reduces the learning rates when a metric stalls.

#include <lamp/lr_scheduler/plateau.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "state.h"

namespace lamp::optim {

ReduceLROnPlateau::ReduceLROnPlateau(
    torch::optim::Optimizer& optimizer,
    ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer, NoInit{}) {
  TORCH_CHECK_VALUE(!(options.factor() >= 1.0), "Factor should be < 1.0.");
  factor_ = options.factor();
  const size_t groups = optimizer.param_groups().size();
  const auto& min_lr = options.min_lr();
  if (min_lr.is_list()) {
    TORCH_CHECK_VALUE(
        min_lr.values().size() == groups,
        "expected ",
        groups,
        " min_lrs, got ",
        min_lr.values().size());
    default_min_lr_ = std::nullopt;
    min_lrs_ = min_lr.values();
  } else {
    default_min_lr_ = min_lr.values().front();
    min_lrs_.assign(groups, min_lr.values().front());
  }
  patience_ = options.patience();
  cooldown_ = options.cooldown();
  eps_ = options.eps();
  last_epoch_ = 0;
  last_lr_ = group_lrs();
  init_is_better(options.mode(), options.threshold(), options.threshold_mode());
  // Python's _reset()
  best_ = mode_worse_;
  cooldown_counter_ = 0;
  num_bad_epochs_ = 0;
}

void ReduceLROnPlateau::init_is_better(
    const std::string& mode,
    double threshold,
    const std::string& threshold_mode) {
  TORCH_CHECK_VALUE(
      mode == "min" || mode == "max", "mode ", mode, " is unknown!");
  TORCH_CHECK_VALUE(
      threshold_mode == "rel" || threshold_mode == "abs",
      "threshold mode ",
      threshold_mode,
      " is unknown!");
  mode_worse_ = mode == "min" ? std::numeric_limits<double>::infinity()
                              : -std::numeric_limits<double>::infinity();
  mode_ = mode;
  threshold_ = threshold;
  threshold_mode_ = threshold_mode;
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  if (mode_ == "min" && threshold_mode_ == "rel") {
    const double rel_epsilon = 1.0 - threshold_;
    return a < best * rel_epsilon;
  }
  if (mode_ == "min" && threshold_mode_ == "abs") {
    return a < best - threshold_;
  }
  if (mode_ == "max" && threshold_mode_ == "rel") {
    const double rel_epsilon = threshold_ + 1.0;
    return a > best * rel_epsilon;
  }
  return a > best + threshold_;
}

void ReduceLROnPlateau::step() {
  TORCH_CHECK(
      false,
      "ReduceLROnPlateau.step() needs the metric: call step(metric) with "
      "the value to watch (e.g. the validation loss).");
}

void ReduceLROnPlateau::step(double metrics) {
  const double current = metrics;
  last_epoch_ = last_epoch_ + 1;
  if (is_better(current, best_)) {
    best_ = current;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (in_cooldown()) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0; // ignore any bad epochs in cooldown
  }
  if (num_bad_epochs_ > patience_) {
    reduce_lr();
    cooldown_counter_ = cooldown_;
    num_bad_epochs_ = 0;
  }
  last_lr_ = group_lrs();
}

void ReduceLROnPlateau::reduce_lr() {
  auto& groups = optimizer().param_groups();
  if (groups.size() != min_lrs_.size()) {
    TORCH_CHECK(
        default_min_lr_.has_value(),
        "The number of param groups in the `optimizer` (",
        groups.size(),
        ") differs from when `ReduceLROnPlateau` was initialized (",
        min_lrs_.size(),
        "), usually due to a new param group being added to the optimizer. "
        "Please modify the `min_lrs` field to match the length of the "
        "`optimizer` param groups.");
    min_lrs_.assign(groups.size(), *default_min_lr_);
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const double old_lr = groups[i].options().get_lr();
    // NOTE: Python's max(a, b) returns b only when b > a, as std::max.
    const double new_lr = std::max(old_lr * factor_, min_lrs_[i]);
    if (old_lr - new_lr > eps_) {
      groups[i].options().set_lr(new_lr);
    }
  }
}

LRScheduler::StateDict ReduceLROnPlateau::state_dict() const {
  auto state = lamp::new_state_dict();
  state.insert("factor", factor_);
  state.insert(
      "default_min_lr",
      default_min_lr_ ? c10::IValue(*default_min_lr_) : c10::IValue());
  state.insert("min_lrs", detail::double_list(min_lrs_));
  state.insert("patience", patience_);
  state.insert("cooldown", cooldown_);
  state.insert("eps", eps_);
  state.insert("last_epoch", last_epoch_);
  state.insert("_last_lr", detail::double_list(last_lr_));
  state.insert("mode_worse", mode_worse_);
  state.insert("mode", mode_);
  state.insert("threshold", threshold_);
  state.insert("threshold_mode", threshold_mode_);
  state.insert("best", best_);
  state.insert("cooldown_counter", cooldown_counter_);
  state.insert("num_bad_epochs", num_bad_epochs_);
  return state;
}

std::function<void()> ReduceLROnPlateau::check_state_dict(
    const c10::impl::GenericDict& state,
    const std::string& where) {
  detail::StateReader reader(state, where);
  const size_t groups = optimizer().param_groups().size();
  const double factor = reader.get_double("factor");
  const auto default_min_lr = reader.get_optional_double("default_min_lr");
  auto min_lrs = reader.get_double_list("min_lrs", groups);
  const int64_t patience = reader.get_int("patience");
  const int64_t cooldown = reader.get_int("cooldown");
  const double eps = reader.get_double("eps");
  const int64_t last_epoch = reader.get_int("last_epoch");
  auto last_lr = reader.get_double_list("_last_lr", groups);
  reader.get_double("mode_worse"); // recomputed from `mode`, as Python
  auto mode = reader.get_string("mode");
  if (mode != "min" && mode != "max") {
    reader.fail("mode", "'min' or 'max'", "'" + mode + "'");
  }
  const double threshold = reader.get_double("threshold");
  auto threshold_mode = reader.get_string("threshold_mode");
  if (threshold_mode != "rel" && threshold_mode != "abs") {
    reader.fail("threshold_mode", "'rel' or 'abs'", "'" + threshold_mode + "'");
  }
  const double best = reader.get_double("best");
  const int64_t cooldown_counter = reader.get_int("cooldown_counter");
  const int64_t num_bad_epochs = reader.get_int("num_bad_epochs");
  return [=,
          min_lrs = std::move(min_lrs),
          last_lr = std::move(last_lr),
          mode = std::move(mode),
          threshold_mode = std::move(threshold_mode)]() mutable {
    factor_ = factor;
    default_min_lr_ = default_min_lr;
    min_lrs_ = std::move(min_lrs);
    patience_ = patience;
    cooldown_ = cooldown;
    eps_ = eps;
    last_epoch_ = last_epoch;
    last_lr_ = std::move(last_lr);
    mode_worse_ = mode == "min" ? std::numeric_limits<double>::infinity()
                                : -std::numeric_limits<double>::infinity();
    mode_ = std::move(mode);
    threshold_ = threshold;
    threshold_mode_ = std::move(threshold_mode);
    best_ = best;
    cooldown_counter_ = cooldown_counter;
    num_bad_epochs_ = num_bad_epochs;
  };
}

} // namespace lamp::optim
