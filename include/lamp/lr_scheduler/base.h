#pragma once

// The base class of lamp's learning-rate schedulers (Python's
// torch.optim.lr_scheduler.LRScheduler) and PerGroup, a per-param-group
// hyperparameter.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lamp/export.h>
#include <lamp/state_dict.h>

namespace lamp::optim {

namespace detail {
struct InitialLrs;
} // namespace detail

class SequentialLR;
class ChainedScheduler;

/// A hyperparameter given per param group, as Python's `float | list[float]`:
/// one value for every group (`0.1`) or one value per group (`{0.1, 0.01}`,
/// whose length must equal the number of param groups).
class LAMP_API PerGroup {
 public:
  /// The same value for every param group.
  PerGroup(double value) : values_{value}, is_list_(false) {}
  /// One value per param group.
  PerGroup(std::vector<double> values)
      : values_(std::move(values)), is_list_(true) {}
  /// One value per param group.
  PerGroup(std::initializer_list<double> values)
      : values_(values), is_list_(true) {}

  /// Whether one value per group was given (Python passed a list).
  bool is_list() const {
    return is_list_;
  }
  /// The values as given.
  const std::vector<double>& values() const {
    return values_;
  }

 private:
  std::vector<double> values_;
  bool is_list_;
};

/// Base class of lamp's learning-rate schedulers, as Python's
/// `torch.optim.lr_scheduler.LRScheduler`. Works with every
/// `torch::optim::Optimizer` (Adam, AdamW, SGD, RMSprop, Adagrad, LBFGS, ...)
/// and with lamp's fused optimizers: learning rates are written with
/// `group.options().set_lr()`. Schedulers touch host-side options only and
/// never synchronise with a device.
///
/// Construction performs Python's initial step (`last_epoch` becomes 0 for
/// a new schedule) and writes the first learning rates into the optimizer.
/// Call `step()` after `optimizer.step()`, once per epoch or iteration.
///
/// `initial_lr`: Python stores each group's starting learning rate as
/// `param_group["initial_lr"]` (set by the first scheduler made on the
/// optimizer, kept by later ones) and copies it to `base_lrs`. LibTorch's
/// param-group options have no such field, so lamp keeps `initial_lr` beside
/// the optimizer for as long as any scheduler made on it is alive: a second
/// scheduler on the same optimizer (as in `SequentialLR` and
/// `ChainedScheduler` recipes) sees the first one's `initial_lr`, as in
/// Python. It is not part of LibTorch's optimizer checkpoint, so a scheduler
/// made with `last_epoch != -1` while no other scheduler of that optimizer is
/// alive throws (Python's KeyError about `initial_lr`). To resume, make the
/// scheduler with `last_epoch = -1` before loading the optimizer and then
/// call `load_state_dict()` (or `torch::load`), which restores `base_lrs`.
///
/// State: `state_dict()` holds exactly the keys and value types of Python's
/// `scheduler.state_dict()` (ints as int64, floats as double, lists as
/// generic lists, None as `IValue()`), so states move between C++ and Python:
/// C++ `torch::pickle_save(scheduler.state_dict())` is read by Python's
/// `torch.load(f, weights_only=True)` inside
/// `torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag])`
/// (the tag LibTorch's pickler writes for dicts and lists); a Python
/// `torch.save(scheduler.state_dict(), f)` is read with `torch::pickle_load`
/// and passed to `load_state_dict(ivalue.toGenericDict())`. Like Python's,
/// `load_state_dict` does not touch the optimizer: restore the optimizer's
/// state (its learning rates) too.
///
/// CUDA graphs: call `step()` outside the function given to
/// `lamp::GraphedStep`. With lamp's fused optimizers the new learning rate
/// reaches the replayed graph without a new capture (GraphedStep copies
/// learning rates to the device before each replay). Everything else is
/// baked into the captured graph, in particular the momentum / beta1 that
/// `OneCycleLR` cycles.
///
/// Subclassing: override `get_lr()` (and `get_closed_form_lr()` if the
/// schedule has one), call the protected constructor, then `initial_step()`
/// at the end of your constructor (C++ cannot dispatch to your `get_lr()`
/// from the base constructor, which Python's initial step does).
///
/// Example:
/// \code
///   torch::optim::SGD optimizer(model->parameters(), 0.1);
///   lamp::optim::StepLR scheduler(optimizer, /*step_size=*/30);
///   for (int epoch = 0; epoch < 100; ++epoch) {
///     train(optimizer);
///     scheduler.step();
///   }
///   torch::save(scheduler, "scheduler.pt");
/// \endcode
class LAMP_API LRScheduler {
 public:
  /// Python's `state_dict()`: key -> value (`lamp::StateDict`).
  using StateDict = lamp::StateDict;

  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances the schedule by one step and writes the new learning rates
  /// into the optimizer's param groups.
  virtual void step();
  /// The learning rates of the last step (one per param group).
  std::vector<double> get_last_lr() const {
    return last_lr_;
  }
  /// The index of the last step: 0 right after construction of a new
  /// schedule, then incremented by every `step()`.
  int64_t last_epoch() const {
    return last_epoch_;
  }
  /// Each param group's `initial_lr` when the scheduler was made (or as
  /// loaded).
  const std::vector<double>& base_lrs() const {
    return base_lrs_;
  }
  /// The optimizer whose learning rates this scheduler sets.
  torch::optim::Optimizer& optimizer() const {
    return optimizer_;
  }
  /// Python's class name (`"StepLR"`), used in messages.
  virtual std::string name() const = 0;

  /// The state as Python's `scheduler.state_dict()`: same keys, same order,
  /// same value types.
  virtual StateDict state_dict() const;
  /// Restores a state from `state_dict()` (C++ or Python). Every key and
  /// type is checked first, including the number of param groups; on error
  /// it throws a `c10::Error` naming the scheduler and the key and changes
  /// nothing. Ints are accepted where floats are expected, lists as
  /// generic or typed lists. Keys lamp does not know (such as `verbose` of
  /// older PyTorch) are ignored; `_is_initial` and
  /// `_get_lr_called_within_step` may be missing (Python's class defaults).
  void load_state_dict(const StateDict& state_dict);
  /// As above, for the `Dict(Any, Any)` that `torch::pickle_load` returns
  /// for a dict saved by Python.
  void load_state_dict(const c10::impl::GenericDict& state_dict);

  /// Writes `state_dict()` as one entry `state_dict` plus `lamp_version`,
  /// so that `torch::save(scheduler, path)` works.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what `save` wrote, through `load_state_dict` (same checks).
  void load(torch::serialize::InputArchive& archive);

 protected:
  /// Records `initial_lr` for each param group (Python's
  /// `group.setdefault("initial_lr", group["lr"])` when `last_epoch == -1`,
  /// else requires it), sets `base_lrs` and `last_epoch`. `initial_lrs`, when
  /// given, overwrite the groups' `initial_lr` first (OneCycleLR).
  LRScheduler(
      torch::optim::Optimizer& optimizer,
      int64_t last_epoch,
      std::optional<std::vector<double>> initial_lrs = std::nullopt);
  /// For schedulers that, as in Python, skip the base initialisation
  /// (ReduceLROnPlateau, SequentialLR, ChainedScheduler).
  struct NoInit {};
  LRScheduler(torch::optim::Optimizer& optimizer, NoInit);

  /// Python's `_initial_step()`: zero `_step_count` and step once with
  /// `_is_initial` set. Call it at the end of a subclass constructor.
  void initial_step();
  /// The next learning rates (Python's `get_lr()`); called by `step()` with
  /// `last_epoch` already advanced. The default throws.
  virtual std::vector<double> get_lr();
  /// Python's `_get_closed_form_lr()`, used when a step sets the epoch
  /// (`SequentialLR` at a milestone); nullopt when there is none.
  virtual std::optional<std::vector<double>> get_closed_form_lr() const;
  /// Python's `_update_lr(epoch)`.
  void update_lr(std::optional<int64_t> epoch);

  /// One key of a scheduler's state dict and the member that holds it
  /// (internal to lamp).
  struct StateField;
  /// The keys of this scheduler's state in Python's order, which the default
  /// `state_dict()` writes and the default `check_state_dict()` reads. The
  /// default: the keys every scheduler has (`base_lrs`, `last_epoch`,
  /// `_step_count`, `_is_initial`, `_get_lr_called_within_step`, `_last_lr`).
  virtual std::vector<StateField> state_fields();
  /// `own` followed by the keys every scheduler has.
  std::vector<StateField> with_base_fields(std::vector<StateField> own);
  /// Checks `state` (throwing a `c10::Error` that starts with `where`) and
  /// returns a function that applies it and cannot throw. The default checks
  /// every key of `state_fields()` in order; subclasses with other keys check
  /// them and call this one.
  virtual std::function<void()> check_state_dict(
      const c10::impl::GenericDict& state,
      const std::string& where);

  /// Each param group's current learning rate.
  std::vector<double> group_lrs() const;
  /// Each param group's `initial_lr`, as shared with the other schedulers
  /// of this optimizer; throws for a group that has none.
  std::vector<double> initial_lrs() const;

  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  bool is_initial_ = false;
  bool get_lr_called_within_step_ = false;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;

 private:
  friend class SequentialLR;
  friend class ChainedScheduler;

  // The `_schedulers` key of SequentialLR and ChainedScheduler: each
  // scheduler's state dict, checked by that scheduler.
  static StateField schedulers_field(
      const std::vector<std::shared_ptr<LRScheduler>>& schedulers);

  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<detail::InitialLrs> initial_lrs_;
};

/// Serializes `scheduler` so that `torch::save(scheduler, path)` works.
LAMP_API torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive,
    const LRScheduler& scheduler);
/// Deserializes into `scheduler` so that `torch::load(scheduler, path)`
/// works.
LAMP_API torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive,
    LRScheduler& scheduler);

} // namespace lamp::optim
