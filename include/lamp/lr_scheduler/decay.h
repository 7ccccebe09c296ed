#pragma once

// Schedulers that decay the learning rate: StepLR, MultiStepLR,
// ExponentialLR, PolynomialLR, CosineAnnealingLR.

#include <lamp/lr_scheduler/base.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace lamp::optim {

/// Multiplies the learning rates by `gamma` every `step_size` steps, as
/// Python's `StepLR`. `step_size` must be positive (Python fails with
/// ZeroDivisionError at the first step otherwise).
///
/// Example:
/// \code
///   lamp::optim::StepLR scheduler(optimizer, /*step_size=*/30, 0.1);
/// \endcode
class LAMP_API StepLR : public LRScheduler {
 public:
  /// Decays by `gamma` every `step_size` steps. Defaults: gamma 0.1,
  /// last_epoch -1.
  StepLR(
      torch::optim::Optimizer& optimizer,
      int64_t step_size,
      double gamma = 0.1,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "StepLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies the learning rates by `gamma` at each milestone (by
/// `gamma^n` at one listed n times), as Python's `MultiStepLR`.
/// `state_dict()["milestones"]` is a dict milestone -> count (Python's
/// Counter). LibTorch's unpickler cannot read a `collections.Counter`: in
/// Python, save `dict(state["milestones"])` for C++.
///
/// Example:
/// \code
///   lamp::optim::MultiStepLR scheduler(optimizer, {30, 80}, 0.1);
/// \endcode
class LAMP_API MultiStepLR : public LRScheduler {
 public:
  /// Decays by `gamma` at each of `milestones` (increasing step indices).
  /// Defaults: gamma 0.1, last_epoch -1.
  MultiStepLR(
      torch::optim::Optimizer& optimizer,
      const std::vector<int64_t>& milestones,
      double gamma = 0.1,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "MultiStepLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  // Counter(milestones): milestone -> count, in order of first appearance.
  std::vector<std::pair<int64_t, int64_t>> milestones_;
  double gamma_;
};

/// Multiplies the learning rates by `gamma` every step, as Python's
/// `ExponentialLR`.
///
/// Example:
/// \code
///   lamp::optim::ExponentialLR scheduler(optimizer, 0.95);
/// \endcode
class LAMP_API ExponentialLR : public LRScheduler {
 public:
  /// Decays by `gamma` every step. Default last_epoch: -1.
  ExponentialLR(
      torch::optim::Optimizer& optimizer,
      double gamma,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "ExponentialLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  double gamma_;
};

/// Decays the learning rates polynomially to 0 over `total_iters` steps,
/// as Python's `PolynomialLR`.
///
/// Example:
/// \code
///   lamp::optim::PolynomialLR scheduler(optimizer, /*total_iters=*/100, 2.0);
/// \endcode
class LAMP_API PolynomialLR : public LRScheduler {
 public:
  /// Decays with `power` to 0 over `total_iters` steps. Defaults:
  /// total_iters 5, power 1.0, last_epoch -1.
  PolynomialLR(
      torch::optim::Optimizer& optimizer,
      int64_t total_iters = 5,
      double power = 1.0,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "PolynomialLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  int64_t total_iters_;
  double power_;
};

/// Cosine annealing from `initial_lr` to `eta_min` over `T_max` steps (and
/// back, periodically), with Python's recursive formula, as Python's
/// `CosineAnnealingLR`. `T_max` must be positive (Python fails with
/// ZeroDivisionError at the first step otherwise).
///
/// Example:
/// \code
///   lamp::optim::CosineAnnealingLR scheduler(optimizer, /*T_max=*/1000);
/// \endcode
class LAMP_API CosineAnnealingLR : public LRScheduler {
 public:
  /// Anneals to `eta_min` over `T_max` steps. Defaults: eta_min 0,
  /// last_epoch -1.
  CosineAnnealingLR(
      torch::optim::Optimizer& optimizer,
      int64_t T_max,
      double eta_min = 0.0,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "CosineAnnealingLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  int64_t T_max_;
  double eta_min_;
};

} // namespace lamp::optim
