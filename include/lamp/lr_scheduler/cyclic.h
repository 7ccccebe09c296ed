#pragma once

// Cyclic schedules: CosineAnnealingWarmRestarts and OneCycleLR (which also
// cycles momentum / beta1).

#include <lamp/lr_scheduler/base.h>

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lamp::optim {

/// Cosine annealing with warm restarts (SGDR), as Python's
/// `CosineAnnealingWarmRestarts`: the first cycle lasts `T_0` steps, each
/// next one `T_mult` times longer. `step(epoch)` with an explicit (possibly
/// fractional) epoch is not provided.
///
/// Example:
/// \code
///   lamp::optim::CosineAnnealingWarmRestarts scheduler(optimizer, 10, 2);
/// \endcode
class LAMP_API CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  /// First cycle `T_0` (> 0) steps, each next `T_mult` (>= 1) times longer,
  /// annealing to `eta_min`. Defaults: T_mult 1, eta_min 0, last_epoch -1.
  CosineAnnealingWarmRestarts(
      torch::optim::Optimizer& optimizer,
      int64_t T_0,
      int64_t T_mult = 1,
      double eta_min = 0.0,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "CosineAnnealingWarmRestarts";
  }
  /// One step, as Python's `step()`.
  void step() override;
  /// Steps since the last restart.
  int64_t T_cur() const {
    return T_cur_;
  }
  /// Length of the current cycle.
  int64_t T_i() const {
    return T_i_;
  }

 protected:
  std::vector<double> get_lr() override;
  std::vector<StateField> state_fields() override;

 private:
  int64_t T_0_;
  int64_t T_i_;
  int64_t T_mult_;
  double eta_min_;
  int64_t T_cur_;
};

/// Options of `OneCycleLR`, named as Python's keywords.
struct LAMP_API OneCycleLROptions {
  /* implicit */ OneCycleLROptions(PerGroup max_lr)
      : max_lr_(std::move(max_lr)) {}
  /// Peak learning rate, one or one per group. No default.
  TORCH_ARG(PerGroup, max_lr);
  /// Number of steps of the cycle. Default: none (then `epochs` *
  /// `steps_per_epoch`).
  TORCH_ARG(std::optional<int64_t>, total_steps) = std::nullopt;
  /// Epochs of the cycle, with `steps_per_epoch`. Default: none.
  TORCH_ARG(std::optional<int64_t>, epochs) = std::nullopt;
  /// Steps per epoch, with `epochs`. Default: none.
  TORCH_ARG(std::optional<int64_t>, steps_per_epoch) = std::nullopt;
  /// Fraction of the cycle spent increasing the learning rate. Default: 0.3.
  TORCH_ARG(double, pct_start) = 0.3;
  /// "cos" or "linear". Default: "cos".
  TORCH_ARG(std::string, anneal_strategy) = "cos";
  /// Cycle momentum (SGD, RMSprop: `momentum`; Adam, AdamW: the first of
  /// `betas`) inversely to the learning rate. Default: true.
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Lowest momentum, one or one per group. Default: 0.85.
  TORCH_ARG(PerGroup, base_momentum) = 0.85;
  /// Highest momentum, one or one per group. Default: 0.95.
  TORCH_ARG(PerGroup, max_momentum) = 0.95;
  /// initial_lr = max_lr / div_factor. Default: 25.
  TORCH_ARG(double, div_factor) = 25.0;
  /// min_lr = initial_lr / final_div_factor. Default: 1e4.
  TORCH_ARG(double, final_div_factor) = 1e4;
  /// Three phases (up, down to initial_lr, down to min_lr) instead of two.
  /// Default: false.
  TORCH_ARG(bool, three_phase) = false;
  /// Index of the last step when resuming. Default: -1.
  TORCH_ARG(int64_t, last_epoch) = -1;
};

/// The 1cycle policy, as Python's `OneCycleLR`: the learning rate rises from
/// `max_lr / div_factor` to `max_lr` and anneals to `initial_lr /
/// final_div_factor`, while momentum (or Adam's beta1) moves the opposite
/// way. Stepping more than `total_steps` times throws as in Python.
///
/// Python keeps `initial_lr`, `max_lr`, `min_lr`, `max_momentum` and
/// `base_momentum` in the param groups; lamp keeps them in the scheduler,
/// computed from the options (also when `last_epoch != -1`, where Python
/// reads them from groups restored by the optimizer's `load_state_dict`).
///
/// Momentum cycling changes the optimizer's `momentum` / `betas` every step.
/// A `lamp::GraphedStep` bakes those into its captured graph; the learning
/// rate alone reaches the graph without a new capture.
///
/// Example:
/// \code
///   torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1)
///                                           .momentum(0.9));
///   lamp::optim::OneCycleLR scheduler(
///       optimizer, lamp::optim::OneCycleLROptions(0.1).total_steps(1000));
/// \endcode
class LAMP_API OneCycleLR : public LRScheduler {
 public:
  /// One cycle as `options` describe (`max_lr` and the length are required).
  OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options);
  /// Python's class name.
  std::string name() const override {
    return "OneCycleLR";
  }
  /// Length of the cycle in steps.
  int64_t total_steps() const {
    return total_steps_;
  }

 protected:
  std::vector<double> get_lr() override;
  std::vector<StateField> state_fields() override;

 private:
  // One phase of the cycle (Python's `_SchedulePhase`): its start_lr,
  // end_lr, start_momentum and end_momentum, as indices of group_values_.
  struct Phase {
    double end_step;
    bool end_step_is_int; // Python stores the last phase's as an int
    int values[4];
  };

  int64_t total_steps_;
  std::vector<Phase> schedule_phases_;
  std::string anneal_func_type_;
  bool cycle_momentum_;
  bool use_beta1_ = false;
  // Python's group["initial_lr"], ["max_lr"], ["min_lr"], ["max_momentum"],
  // ["base_momentum"].
  std::vector<double> group_values_[5];
};

} // namespace lamp::optim
