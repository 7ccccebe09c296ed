// Schedulers that scale the learning rate by a factor: LambdaLR,
// MultiplicativeLR, ConstantLR, LinearLR.
//
// NOTE: every formula is Python's, operation for operation and in Python's
// order (including the recursive forms that get_lr() uses instead of the
// closed forms), so that the learning rates are bit-identical to Python's.
// Python's int * float and int / int are double operations on the ints
// converted to double; `x ** y` on floats is C's pow().

#include <lamp/lr_scheduler/factor.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "state.h"

namespace lamp::optim {

namespace detail {

LambdaScheduler::LambdaScheduler(
    torch::optim::Optimizer& optimizer,
    std::vector<LRLambda> lr_lambdas,
    bool per_group,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), lr_lambdas_(std::move(lr_lambdas)) {
  const size_t groups = optimizer.param_groups().size();
  if (!per_group) {
    lr_lambdas_.resize(groups, lr_lambdas_.front());
  }
  TORCH_CHECK_VALUE(
      lr_lambdas_.size() == groups,
      "Expected ",
      groups,
      " lr_lambdas, but got ",
      lr_lambdas_.size());
  for (const auto& f : lr_lambdas_) {
    TORCH_CHECK_TYPE(
        static_cast<bool>(f), "lr_lambda should be a function, but got None");
  }
}

std::vector<LRScheduler::StateField> LambdaScheduler::state_fields() {
  // Python saves None for a plain function and a callable object's __dict__
  // (which a C++ function has none of to restore, unless it is empty).
  auto save = [this] {
    return to_ivalue(std::vector<c10::IValue>(lr_lambdas_.size()));
  };
  auto check = [this](const StateReader& reader) {
    const auto expected = "a list of " + std::to_string(lr_lambdas_.size()) +
        " None (one per lambda)";
    for (const auto& f :
         reader.get_list("lr_lambdas", expected, lr_lambdas_.size())) {
      if (!f.isNone() && !(f.isGenericDict() && f.toGenericDict().empty())) {
        reader.fail(
            "lr_lambdas",
            expected,
            "the state of a Python callable object, which a C++ function "
            "cannot take");
      }
    }
    return std::function<void()>([] {});
  };
  auto fields = LRScheduler::state_fields();
  fields.emplace_back("lr_lambdas", save, check);
  return fields;
}

std::vector<double> LambdaScheduler::times_lambdas(
    std::vector<double> lrs,
    const char* what) const {
  TORCH_CHECK(
      lr_lambdas_.size() == lrs.size(),
      name(),
      ": ",
      lr_lambdas_.size(),
      " lr_lambdas for ",
      lrs.size(),
      " ",
      what);
  for (size_t i = 0; i < lrs.size(); ++i) {
    lrs[i] = lrs[i] * lr_lambdas_[i](last_epoch_);
  }
  return lrs;
}

} // namespace detail

// NOTE: initial_step() in the most derived constructor: it calls get_lr().
LambdaLR::LambdaLR(
    torch::optim::Optimizer& optimizer,
    LRLambda lr_lambda,
    int64_t last_epoch)
    : LambdaScheduler(optimizer, {std::move(lr_lambda)}, false, last_epoch) {
  initial_step();
}

LambdaLR::LambdaLR(
    torch::optim::Optimizer& optimizer,
    std::vector<LRLambda> lr_lambdas,
    int64_t last_epoch)
    : LambdaScheduler(optimizer, std::move(lr_lambdas), true, last_epoch) {
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  return times_lambdas(base_lrs_, "base_lrs");
}

MultiplicativeLR::MultiplicativeLR(
    torch::optim::Optimizer& optimizer,
    LRLambda lr_lambda,
    int64_t last_epoch)
    : LambdaScheduler(optimizer, {std::move(lr_lambda)}, false, last_epoch) {
  initial_step();
}

MultiplicativeLR::MultiplicativeLR(
    torch::optim::Optimizer& optimizer,
    std::vector<LRLambda> lr_lambdas,
    int64_t last_epoch)
    : LambdaScheduler(optimizer, std::move(lr_lambdas), true, last_epoch) {
  initial_step();
}

std::vector<double> MultiplicativeLR::get_lr() {
  return is_initial_ ? group_lrs() : times_lambdas(group_lrs(), "param groups");
}

ConstantLR::ConstantLR(
    torch::optim::Optimizer& optimizer,
    double factor,
    int64_t total_iters,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch),
      factor_(factor),
      total_iters_(total_iters) {
  TORCH_CHECK_VALUE(
      !(factor > 1.0 || factor < 0),
      "Constant multiplicative factor expected to be between 0 and 1.");
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  if (last_epoch_ == 0) {
    return detail::times(group_lrs(), factor_);
  }
  if (last_epoch_ != total_iters_) {
    return group_lrs();
  }
  TORCH_CHECK_VALUE(
      factor_ != 0.0, name(), ": float division by zero (factor is 0)");
  return detail::times(group_lrs(), 1.0 / factor_);
}

std::optional<std::vector<double>> ConstantLR::get_closed_form_lr() const {
  const double reached = last_epoch_ >= total_iters_ ? 1.0 : 0.0;
  return detail::times(base_lrs_, factor_ + reached * (1 - factor_));
}

std::vector<LRScheduler::StateField> ConstantLR::state_fields() {
  return with_base_fields(
      {{"factor", &factor_}, {"total_iters", &total_iters_}});
}

LinearLR::LinearLR(
    torch::optim::Optimizer& optimizer,
    double start_factor,
    double end_factor,
    int64_t total_iters,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  TORCH_CHECK_VALUE(
      !(start_factor > 1.0 || start_factor <= 0),
      "Starting multiplicative factor expected to be greater than 0 and less "
      "or equal to 1.");
  TORCH_CHECK_VALUE(
      !(end_factor > 1.0 || end_factor < 0),
      "Ending multiplicative factor expected to be between 0 and 1.");
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0) {
    return detail::times(group_lrs(), start_factor_);
  }
  if (is_initial_ || last_epoch_ > total_iters_) {
    return group_lrs();
  }
  const double delta = end_factor_ - start_factor_;
  const double factor = 1.0 +
      delta /
          (static_cast<double>(total_iters_) * start_factor_ +
           static_cast<double>(last_epoch_ - 1) * delta);
  return detail::times(group_lrs(), factor);
}

std::optional<std::vector<double>> LinearLR::get_closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return detail::times(
      base_lrs_,
      start_factor_ +
          (end_factor_ - start_factor_) * done /
              static_cast<double>(total_iters_));
}

std::vector<LRScheduler::StateField> LinearLR::state_fields() {
  return with_base_fields(
      {{"start_factor", &start_factor_},
       {"end_factor", &end_factor_},
       {"total_iters", &total_iters_}});
}

} // namespace lamp::optim
