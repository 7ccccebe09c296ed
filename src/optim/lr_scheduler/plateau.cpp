// ReduceLROnPlateau: reduces the learning rates when a metric stalls.

#include <lamp/lr_scheduler/plateau.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "state.h"

namespace lamp::optim {

namespace {

// Python's `mode_worse`: the worst value of the metric in `mode`.
double mode_worse(const std::string& mode) {
  return mode == "min" ? std::numeric_limits<double>::infinity()
                       : -std::numeric_limits<double>::infinity();
}

} // namespace

ReduceLROnPlateau::ReduceLROnPlateau(
    torch::optim::Optimizer& optimizer,
    ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer, NoInit{}) {
  TORCH_CHECK_VALUE(!(options.factor() >= 1.0), "Factor should be < 1.0.");
  const size_t groups = optimizer.param_groups().size();
  const auto& min_lr = options.min_lr();
  TORCH_CHECK_VALUE(
      !min_lr.is_list() || min_lr.values().size() == groups,
      "expected ",
      groups,
      " min_lrs, got ",
      min_lr.values().size());
  if (!min_lr.is_list()) {
    default_min_lr_ = min_lr.values().front();
  }
  min_lrs_ = min_lr.is_list() ? min_lr.values()
                              : std::vector<double>(groups, *default_min_lr_);
  // Python's _init_is_better
  TORCH_CHECK_VALUE(
      options.mode() == "min" || options.mode() == "max",
      "mode ",
      options.mode(),
      " is unknown!");
  TORCH_CHECK_VALUE(
      options.threshold_mode() == "rel" || options.threshold_mode() == "abs",
      "threshold mode ",
      options.threshold_mode(),
      " is unknown!");
  factor_ = options.factor();
  patience_ = options.patience();
  cooldown_ = options.cooldown();
  eps_ = options.eps();
  mode_ = options.mode();
  threshold_ = options.threshold();
  threshold_mode_ = options.threshold_mode();
  mode_worse_ = mode_worse(mode_);
  best_ = mode_worse_; // Python's _reset()
  last_epoch_ = 0;
  last_lr_ = group_lrs();
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  const bool rel = threshold_mode_ == "rel";
  if (mode_ == "min") {
    return rel ? a < best * (1.0 - threshold_) : a < best - threshold_;
  }
  return rel ? a > best * (threshold_ + 1.0) : a > best + threshold_;
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

std::vector<LRScheduler::StateField> ReduceLROnPlateau::state_fields() {
  return {
      {"factor", &factor_},
      {"default_min_lr", &default_min_lr_},
      {"min_lrs", &min_lrs_},
      {"patience", &patience_},
      {"cooldown", &cooldown_},
      {"eps", &eps_},
      {"last_epoch", &last_epoch_},
      {"_last_lr", &last_lr_},
      {"mode_worse", &mode_worse_},
      StateField("mode", &mode_).one_of("min", "max"),
      {"threshold", &threshold_},
      StateField("threshold_mode", &threshold_mode_).one_of("rel", "abs"),
      {"best", &best_},
      {"cooldown_counter", &cooldown_counter_},
      {"num_bad_epochs", &num_bad_epochs_}};
}

std::function<void()> ReduceLROnPlateau::check_state_dict(
    const c10::impl::GenericDict& state,
    const std::string& where) {
  auto apply = LRScheduler::check_state_dict(state, where);
  return [this, apply = std::move(apply)] {
    apply();
    // NOTE: recomputed from `mode`, as Python's _init_is_better does.
    mode_worse_ = mode_worse(mode_);
  };
}

} // namespace lamp::optim
