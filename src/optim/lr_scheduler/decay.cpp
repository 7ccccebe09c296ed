// Schedulers that decay the learning rate: StepLR, MultiStepLR,
// ExponentialLR, PolynomialLR, CosineAnnealingLR.
//
// NOTE: formulas as in factor.cpp: Python's, operation for operation.

#include <lamp/lr_scheduler/decay.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "state.h"

namespace lamp::optim {

namespace {

using detail::kPi;

// The entry of `key` in a Counter kept as pairs (end() when absent).
template <typename Counter>
auto find_key(Counter& counter, int64_t key) {
  return std::find_if(counter.begin(), counter.end(), [key](const auto& e) {
    return e.first == key;
  });
}

// Python's a // b for b > 0.
int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

} // namespace

StepLR::StepLR(
    torch::optim::Optimizer& optimizer,
    int64_t step_size,
    double gamma,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), step_size_(step_size), gamma_(gamma) {
  detail::check_positive("step_size", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) {
    return group_lrs();
  }
  return detail::times(group_lrs(), gamma_);
}

std::optional<std::vector<double>> StepLR::get_closed_form_lr() const {
  return detail::times(
      base_lrs_,
      std::pow(
          gamma_, static_cast<double>(floor_div(last_epoch_, step_size_))));
}

std::vector<LRScheduler::StateField> StepLR::state_fields() {
  return with_base_fields(
      {StateField("step_size", &step_size_).at_least(1, "a positive int"),
       {"gamma", &gamma_}});
}

MultiStepLR::MultiStepLR(
    torch::optim::Optimizer& optimizer,
    const std::vector<int64_t>& milestones,
    double gamma,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), gamma_(gamma) {
  for (int64_t milestone : milestones) {
    auto it = find_key(milestones_, milestone);
    if (it == milestones_.end()) {
      milestones_.emplace_back(milestone, 1);
    } else {
      ++it->second;
    }
  }
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  auto it = find_key(milestones_, last_epoch_);
  if (it == milestones_.end()) {
    return group_lrs();
  }
  return detail::times(
      group_lrs(), std::pow(gamma_, static_cast<double>(it->second)));
}

std::optional<std::vector<double>> MultiStepLR::get_closed_form_lr() const {
  // bisect_right(sorted(milestones.elements()), last_epoch)
  int64_t passed = 0;
  for (const auto& [milestone, count] : milestones_) {
    if (milestone <= last_epoch_) {
      passed += count;
    }
  }
  return detail::times(
      base_lrs_, std::pow(gamma_, static_cast<double>(passed)));
}

std::vector<LRScheduler::StateField> MultiStepLR::state_fields() {
  return with_base_fields({{"milestones", &milestones_}, {"gamma", &gamma_}});
}

ExponentialLR::ExponentialLR(
    torch::optim::Optimizer& optimizer,
    double gamma,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  return is_initial_ ? group_lrs() : detail::times(group_lrs(), gamma_);
}

std::optional<std::vector<double>> ExponentialLR::get_closed_form_lr() const {
  return detail::times(
      base_lrs_, std::pow(gamma_, static_cast<double>(last_epoch_)));
}

std::vector<LRScheduler::StateField> ExponentialLR::state_fields() {
  return with_base_fields({{"gamma", &gamma_}});
}

PolynomialLR::PolynomialLR(
    torch::optim::Optimizer& optimizer,
    int64_t total_iters,
    double power,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch),
      total_iters_(total_iters),
      power_(power) {
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  if (is_initial_ || last_epoch_ > total_iters_) {
    return group_lrs();
  }
  const double total = static_cast<double>(total_iters_);
  const double decay_factor = std::pow(
      (1.0 - static_cast<double>(last_epoch_) / total) /
          (1.0 - static_cast<double>(last_epoch_ - 1) / total),
      power_);
  return detail::times(group_lrs(), decay_factor);
}

std::optional<std::vector<double>> PolynomialLR::get_closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return detail::times(
      base_lrs_,
      std::pow(1.0 - done / static_cast<double>(total_iters_), power_));
}

std::vector<LRScheduler::StateField> PolynomialLR::state_fields() {
  return with_base_fields({{"total_iters", &total_iters_}, {"power", &power_}});
}

CosineAnnealingLR::CosineAnnealingLR(
    torch::optim::Optimizer& optimizer,
    int64_t T_max,
    double eta_min,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), T_max_(T_max), eta_min_(eta_min) {
  detail::check_positive("T_max", T_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  auto lrs = group_lrs();
  if (is_initial_) {
    return lrs;
  }
  const double T_max = static_cast<double>(T_max_);
  const double epoch = static_cast<double>(last_epoch_);
  const bool restart = step_count_ == 1 && last_epoch_ > 0;
  const bool peak = (last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0;
  TORCH_CHECK(
      !(restart || peak) || base_lrs_.size() == lrs.size(),
      name(),
      ": ",
      base_lrs_.size(),
      " base_lrs for ",
      lrs.size(),
      " param groups");
  if (restart) {
    return detail::cosine_anneal(base_lrs_, eta_min_, epoch, T_max);
  }
  if (peak) {
    for (size_t i = 0; i < lrs.size(); ++i) {
      lrs[i] =
          lrs[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(kPi / T_max)) / 2;
    }
    return lrs;
  }
  const double ratio = (1 + std::cos(kPi * epoch / T_max)) /
      (1 + std::cos(kPi * (epoch - 1) / T_max));
  for (auto& lr : lrs) {
    lr = ratio * (lr - eta_min_) + eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::get_closed_form_lr()
    const {
  return detail::cosine_anneal(
      base_lrs_,
      eta_min_,
      static_cast<double>(last_epoch_),
      static_cast<double>(T_max_));
}

std::vector<LRScheduler::StateField> CosineAnnealingLR::state_fields() {
  return with_base_fields(
      {StateField("T_max", &T_max_).at_least(1, "a positive int"),
       {"eta_min", &eta_min_}});
}

} // namespace lamp::optim
