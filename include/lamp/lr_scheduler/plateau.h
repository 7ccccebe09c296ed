#pragma once

// ReduceLROnPlateau: reduces the learning rate when a metric stalls.

#include <lamp/lr_scheduler/base.h>

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lamp::optim {

/// Options of `ReduceLROnPlateau`, named as Python's keywords.
struct LAMP_API ReduceLROnPlateauOptions {
  /// "min": reduce when the metric stops decreasing; "max": increasing.
  /// Default: "min".
  TORCH_ARG(std::string, mode) = "min";
  /// new_lr = lr * factor; must be < 1. Default: 0.1.
  TORCH_ARG(double, factor) = 0.1;
  /// Steps without improvement tolerated before reducing. Default: 10.
  TORCH_ARG(int64_t, patience) = 10;
  /// Minimum change that counts as an improvement. Default: 1e-4.
  TORCH_ARG(double, threshold) = 1e-4;
  /// "rel" (relative to the best) or "abs". Default: "rel".
  TORCH_ARG(std::string, threshold_mode) = "rel";
  /// Steps to wait after a reduction before counting again. Default: 0.
  TORCH_ARG(int64_t, cooldown) = 0;
  /// Lower bound of the learning rate, one or one per group. Default: 0.
  TORCH_ARG(PerGroup, min_lr) = 0.0;
  /// Reductions smaller than eps are skipped. Default: 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
};

/// Reduces the learning rates when a metric has stopped improving, as
/// Python's `ReduceLROnPlateau`. Call `step(metric)` with a host value (read
/// a loss tensor with `.item<double>()`, which synchronises, as Python's
/// `float(metrics)`); `step()` without a metric throws. `min_lr` and
/// `default_min_lr` are saved as floats (Python keeps an int default 0).
///
/// Example:
/// \code
///   lamp::optim::ReduceLROnPlateau scheduler(
///       optimizer, lamp::optim::ReduceLROnPlateauOptions().patience(5));
///   for (int epoch = 0; epoch < 100; ++epoch) {
///     train(optimizer);
///     scheduler.step(validation_loss());
///   }
/// \endcode
class LAMP_API ReduceLROnPlateau : public LRScheduler {
 public:
  /// Watches the metric passed to `step(metric)` as `options` describe.
  explicit ReduceLROnPlateau(
      torch::optim::Optimizer& optimizer,
      ReduceLROnPlateauOptions options = {});
  /// Python's class name.
  std::string name() const override {
    return "ReduceLROnPlateau";
  }
  /// Throws: ReduceLROnPlateau needs the metric.
  void step() override;
  /// One step with the metric of this epoch.
  void step(double metrics);
  /// The best metric so far (inf / -inf before the first step).
  double best() const {
    return best_;
  }
  /// Steps since the last improvement.
  int64_t num_bad_epochs() const {
    return num_bad_epochs_;
  }
  /// Whether a reduction happened less than `cooldown` steps ago.
  bool in_cooldown() const {
    return cooldown_counter_ > 0;
  }

 protected:
  std::vector<StateField> state_fields() override;
  std::function<void()> check_state_dict(
      const c10::impl::GenericDict& state,
      const std::string& where) override;

 private:
  bool is_better(double a, double best) const;
  void reduce_lr();

  double factor_;
  std::optional<double> default_min_lr_;
  std::vector<double> min_lrs_;
  int64_t patience_;
  int64_t cooldown_;
  double eps_;
  double mode_worse_;
  std::string mode_;
  double threshold_;
  std::string threshold_mode_;
  double best_;
  int64_t cooldown_counter_ = 0;
  int64_t num_bad_epochs_ = 0;
};

} // namespace lamp::optim
