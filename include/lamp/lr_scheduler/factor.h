#pragma once

// Schedulers that scale the learning rate by a factor: LambdaLR,
// MultiplicativeLR, ConstantLR, LinearLR.

#include <lamp/lr_scheduler/base.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace lamp::optim {

/// A function of the step index (Python's `lr_lambda`).
using LRLambda = std::function<double(int64_t)>;

namespace detail {

/// LambdaLR's and MultiplicativeLR's common part: one function per param
/// group (one given for all, or a list of one per group, checked against
/// the groups), not saved: `state_dict()["lr_lambdas"]` is a list of None,
/// as Python's for plain functions.
class LAMP_API LambdaScheduler : public LRScheduler {
 protected:
  /// `per_group`: `lr_lambdas` is the list of one per group; else its one
  /// function serves every group.
  LambdaScheduler(
      torch::optim::Optimizer& optimizer,
      std::vector<LRLambda> lr_lambdas,
      bool per_group,
      int64_t last_epoch);
  std::vector<StateField> state_fields() override;
  /// Each of `lrs` times its group's function of `last_epoch`; throws
  /// unless there is one function per entry of `lrs` (`what`: of what).
  std::vector<double> times_lambdas(std::vector<double> lrs, const char* what)
      const;

  std::vector<LRLambda> lr_lambdas_;
};

} // namespace detail

/// lr = initial_lr * lr_lambda(epoch), as Python's `LambdaLR`. One function
/// for all groups or one per group. The functions themselves are not saved:
/// `state_dict()["lr_lambdas"]` is a list of None, as Python's for plain
/// functions.
///
/// Example:
/// \code
///   lamp::optim::LambdaLR scheduler(
///       optimizer, [](int64_t epoch) { return std::pow(0.95, epoch); });
/// \endcode
class LAMP_API LambdaLR : public detail::LambdaScheduler {
 public:
  /// `lr_lambda` for every param group.
  LambdaLR(
      torch::optim::Optimizer& optimizer,
      LRLambda lr_lambda,
      int64_t last_epoch = -1);
  /// One function per param group (Python's list of lambdas); throws when
  /// the count differs from the number of groups.
  LambdaLR(
      torch::optim::Optimizer& optimizer,
      std::vector<LRLambda> lr_lambdas,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "LambdaLR";
  }

 protected:
  std::vector<double> get_lr() override;
};

/// lr = lr * lr_lambda(epoch) at every step after the first, as Python's
/// `MultiplicativeLR`.
///
/// Example:
/// \code
///   lamp::optim::MultiplicativeLR scheduler(
///       optimizer, [](int64_t) { return 0.95; });
/// \endcode
class LAMP_API MultiplicativeLR : public detail::LambdaScheduler {
 public:
  /// `lr_lambda` for every param group.
  MultiplicativeLR(
      torch::optim::Optimizer& optimizer,
      LRLambda lr_lambda,
      int64_t last_epoch = -1);
  /// One function per param group; throws when the count differs from the
  /// number of groups.
  MultiplicativeLR(
      torch::optim::Optimizer& optimizer,
      std::vector<LRLambda> lr_lambdas,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "MultiplicativeLR";
  }

 protected:
  std::vector<double> get_lr() override;
};

/// Multiplies the learning rates by `factor` for the first `total_iters`
/// steps, as Python's `ConstantLR`.
///
/// Example:
/// \code
///   lamp::optim::ConstantLR scheduler(optimizer, 0.5, /*total_iters=*/4);
/// \endcode
class LAMP_API ConstantLR : public LRScheduler {
 public:
  /// Scales by `factor` (in [0, 1]) until step `total_iters`. Defaults:
  /// factor 1/3, total_iters 5, last_epoch -1.
  ConstantLR(
      torch::optim::Optimizer& optimizer,
      double factor = 1.0 / 3,
      int64_t total_iters = 5,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "ConstantLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// Scales the learning rates by a factor going linearly from `start_factor`
/// to `end_factor` over `total_iters` steps, as Python's `LinearLR` (the
/// usual warm-up).
///
/// Example:
/// \code
///   lamp::optim::LinearLR warmup(optimizer, 0.01, 1.0, /*total_iters=*/500);
/// \endcode
class LAMP_API LinearLR : public LRScheduler {
 public:
  /// Scales by a factor going from `start_factor` (in (0, 1]) to `end_factor`
  /// (in [0, 1]) over `total_iters` steps. Defaults: 1/3, 1.0, 5, -1.
  LinearLR(
      torch::optim::Optimizer& optimizer,
      double start_factor = 1.0 / 3,
      double end_factor = 1.0,
      int64_t total_iters = 5,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "LinearLR";
  }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;
  std::vector<StateField> state_fields() override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

} // namespace lamp::optim
