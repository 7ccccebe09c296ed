#pragma once

// Schedulers made of schedulers: SequentialLR and ChainedScheduler.

#include <lamp/lr_scheduler/base.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace lamp::optim {

/// Runs `schedulers` one after the other, switching at `milestones`, as
/// Python's `SequentialLR`. All must belong to `optimizer`; none may be a
/// `ReduceLROnPlateau`. At a milestone the next scheduler restarts from
/// epoch 0 (its closed form where it has one, as in Python). State keys:
/// `_milestones`, `last_epoch`, `_last_lr` and `_schedulers` (the
/// schedulers' state dicts), as Python.
///
/// Example (linear warm-up, then cosine decay):
/// \code
///   auto warmup = std::make_shared<lamp::optim::LinearLR>(
///       optimizer, 0.01, 1.0, /*total_iters=*/100);
///   auto cosine = std::make_shared<lamp::optim::CosineAnnealingLR>(
///       optimizer, /*T_max=*/900);
///   lamp::optim::SequentialLR scheduler(optimizer, {warmup, cosine}, {100});
/// \endcode
class LAMP_API SequentialLR : public LRScheduler {
 public:
  /// Runs `schedulers` (all made on `optimizer`) in turn, switching after
  /// each of `milestones` (one fewer than schedulers). Default last_epoch:
  /// -1.
  SequentialLR(
      torch::optim::Optimizer& optimizer,
      std::vector<std::shared_ptr<LRScheduler>> schedulers,
      std::vector<int64_t> milestones,
      int64_t last_epoch = -1);
  /// Python's class name.
  std::string name() const override {
    return "SequentialLR";
  }
  /// One step, as Python's `step()`.
  void step() override;
  /// The schedulers, in order.
  const std::vector<std::shared_ptr<LRScheduler>>& schedulers() const {
    return schedulers_;
  }

 protected:
  std::vector<StateField> state_fields() override;

 private:
  void recursive_undo(LRScheduler& scheduler);

  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps all `schedulers` at every step, so that their factors multiply, as
/// Python's `ChainedScheduler`. All must belong to one optimizer (by default
/// the first scheduler's); none may be a `ReduceLROnPlateau`. `last_epoch()`
/// is the last scheduler's (Python's ChainedScheduler has none). State
/// keys: `_last_lr` and `_schedulers`, as Python.
///
/// Example:
/// \code
///   using namespace lamp::optim;
///   auto constant = std::make_shared<ConstantLR>(optimizer);
///   auto decay = std::make_shared<ExponentialLR>(optimizer, 0.9);
///   ChainedScheduler scheduler({constant, decay});
/// \endcode
class LAMP_API ChainedScheduler : public LRScheduler {
 public:
  /// Steps all `schedulers` together. `optimizer` defaults to the first
  /// scheduler's; all must use it.
  explicit ChainedScheduler(
      std::vector<std::shared_ptr<LRScheduler>> schedulers,
      torch::optim::Optimizer* optimizer = nullptr);
  /// Python's class name.
  std::string name() const override {
    return "ChainedScheduler";
  }
  /// One step, as Python's `step()`.
  void step() override;
  /// The schedulers, in order.
  const std::vector<std::shared_ptr<LRScheduler>>& schedulers() const {
    return schedulers_;
  }

 protected:
  std::vector<StateField> state_fields() override;
  std::function<void()> check_state_dict(
      const c10::impl::GenericDict& state,
      const std::string& where) override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

} // namespace lamp::optim
