// Schedulers made of schedulers: SequentialLR and ChainedScheduler.

#include <lamp/lr_scheduler/composite.h>
#include <lamp/lr_scheduler/plateau.h>

#include <c10/util/Exception.h>

#include <utility>

#include "state.h"

namespace lamp::optim {

namespace {

// Python's bisect.bisect_right (also on an unsorted list, as Python's).
size_t bisect_right(const std::vector<int64_t>& values, int64_t x) {
  size_t lo = 0;
  size_t hi = values.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (x < values[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The checks Python's SequentialLR and ChainedScheduler make of each
// scheduler.
void check_schedulers(
    const char* name,
    const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
    const torch::optim::Optimizer& optimizer) {
  for (size_t i = 0; i < schedulers.size(); ++i) {
    TORCH_CHECK_VALUE(
        schedulers[i] != nullptr,
        name,
        ": the scheduler at index ",
        i,
        " is null");
    TORCH_CHECK_VALUE(
        dynamic_cast<const ReduceLROnPlateau*>(schedulers[i].get()) == nullptr,
        name,
        " does not support `ReduceLROnPlateau` scheduler as it requires "
        "additional kwargs to be specified when calling `step`, but got one "
        "at index ",
        i,
        " in the given schedulers sequence.");
    TORCH_CHECK_VALUE(
        &schedulers[i]->optimizer() == &optimizer,
        name,
        " expects all schedulers to belong to the same optimizer, but got "
        "scheduler ",
        schedulers[i]->name(),
        " at index ",
        i,
        " has another optimizer, which is different from the given one.");
  }
}

torch::optim::Optimizer& chained_optimizer(
    const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
    torch::optim::Optimizer* optimizer) {
  TORCH_CHECK_VALUE(
      !schedulers.empty(),
      "ChainedScheduler expects at least one scheduler to be chained, but got "
      "no scheduler.");
  if (optimizer != nullptr) {
    return *optimizer;
  }
  TORCH_CHECK_VALUE(
      schedulers[0] != nullptr,
      "ChainedScheduler: the scheduler at index 0 is null");
  return schedulers[0]->optimizer();
}

} // namespace

SequentialLR::SequentialLR(
    torch::optim::Optimizer& optimizer,
    std::vector<std::shared_ptr<LRScheduler>> schedulers,
    std::vector<int64_t> milestones,
    int64_t last_epoch)
    : LRScheduler(optimizer, NoInit{}) {
  TORCH_CHECK_VALUE(
      !schedulers.empty(),
      "SequentialLR expects at least one scheduler, but got no scheduler.");
  check_schedulers("SequentialLR", schedulers, optimizer);
  TORCH_CHECK_VALUE(
      milestones.size() == schedulers.size() - 1,
      "Sequential Schedulers expects number of schedulers provided to be one "
      "more than the number of milestone points, but got number of "
      "schedulers ",
      schedulers.size(),
      " and the number of milestones to be equal to ",
      milestones.size());
  schedulers_ = std::move(schedulers);
  milestones_ = std::move(milestones);
  last_epoch_ = last_epoch + 1;
  // Reset the learning rates to initial_lr, wind the schedulers back by one
  // step and replay the first one's initial step, as Python.
  const auto initial = initial_lrs();
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].options().set_lr(initial[i]);
  }
  recursive_undo(*this);
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::recursive_undo(LRScheduler& scheduler) {
  auto* sequential = dynamic_cast<SequentialLR*>(&scheduler);
  auto* chained = dynamic_cast<ChainedScheduler*>(&scheduler);
  if (sequential == nullptr && chained == nullptr) {
    scheduler.last_epoch_ -= 1;
    return;
  }
  for (const auto& child :
       sequential ? sequential->schedulers_ : chained->schedulers()) {
    recursive_undo(*child);
  }
}

void SequentialLR::step() {
  last_epoch_ += 1;
  const size_t idx = bisect_right(milestones_, last_epoch_);
  auto& scheduler = *schedulers_.at(idx);
  if (idx > 0 && milestones_[idx - 1] == last_epoch_) {
    scheduler.update_lr(0);
  } else {
    scheduler.step();
  }
  last_lr_ = scheduler.get_last_lr();
}

std::vector<LRScheduler::StateField> SequentialLR::state_fields() {
  return {
      StateField("_milestones", &milestones_)
          .of_size(
              schedulers_.size() - 1,
              "a list of " + std::to_string(schedulers_.size() - 1) +
                  " ints (one fewer than schedulers)"),
      {"last_epoch", &last_epoch_},
      {"_last_lr", &last_lr_},
      schedulers_field(schedulers_)};
}

ChainedScheduler::ChainedScheduler(
    std::vector<std::shared_ptr<LRScheduler>> schedulers,
    torch::optim::Optimizer* optimizer)
    : LRScheduler(chained_optimizer(schedulers, optimizer), NoInit{}) {
  check_schedulers("ChainedScheduler", schedulers, this->optimizer());
  schedulers_ = std::move(schedulers);
  last_lr_ = group_lrs();
  last_epoch_ = schedulers_.back()->last_epoch();
}

void ChainedScheduler::step() {
  for (auto& scheduler : schedulers_) {
    scheduler->step();
  }
  last_lr_ = group_lrs();
  last_epoch_ = schedulers_.back()->last_epoch();
}

std::vector<LRScheduler::StateField> ChainedScheduler::state_fields() {
  return {{"_last_lr", &last_lr_}, schedulers_field(schedulers_)};
}

std::function<void()> ChainedScheduler::check_state_dict(
    const c10::impl::GenericDict& state,
    const std::string& where) {
  auto apply = LRScheduler::check_state_dict(state, where);
  return [this, apply = std::move(apply)] {
    apply();
    last_epoch_ = schedulers_.back()->last_epoch();
  };
}

LRScheduler::StateField LRScheduler::schedulers_field(
    const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  auto save = [&schedulers] {
    c10::impl::GenericList states(c10::AnyType::get());
    for (const auto& scheduler : schedulers) {
      states.push_back(scheduler->state_dict());
    }
    return c10::IValue(states);
  };
  auto check = [&schedulers](const detail::StateReader& reader) {
    const auto states = reader.get_dict_list("_schedulers", schedulers.size());
    std::vector<std::function<void()>> apply;
    for (size_t i = 0; i < schedulers.size(); ++i) {
      apply.push_back(schedulers[i]->check_state_dict(
          states[i],
          reader.where() + ": _schedulers[" + std::to_string(i) + "] (" +
              schedulers[i]->name() + ")"));
    }
    return [apply = std::move(apply)] {
      for (const auto& f : apply) {
        f();
      }
    };
  };
  return {"_schedulers", save, check};
}

} // namespace lamp::optim
