#include <lamp/lr_scheduler/base.h>

#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "state.h"

// Note [initial_lr beside the optimizer]
// Python's schedulers keep each group's starting learning rate in the param
// group dict (`group["initial_lr"]`): the first scheduler made on an
// optimizer sets it (`setdefault`), later ones reuse it as their `base_lrs`,
// and SequentialLR resets the groups to it. The common warm-up + cosine
// recipe depends on this: the cosine scheduler, made after LinearLR has
// already scaled the lr down, must still anneal from the original lr.
// LibTorch's param-group options cannot hold extra keys, so lamp keeps the
// values in a table keyed by the optimizer's address. Each scheduler holds a
// shared_ptr to its optimizer's entry and the table holds weak_ptrs: the
// entry lives exactly as long as some scheduler of that optimizer does, so
// an address reused by a later optimizer can never see stale values (a
// scheduler must not outlive its optimizer).

namespace lamp::optim {

namespace detail {

struct InitialLrs {
  std::vector<std::optional<double>> values;
};

} // namespace detail

namespace {

constexpr int64_t kLampStateVersion = 1;

// See the Note above: the entry of each optimizer that has a scheduler.
struct Registry {
  std::mutex mutex;
  std::map<const torch::optim::Optimizer*, std::weak_ptr<detail::InitialLrs>>
      entries;
};

Registry& registry() {
  static Registry registry;
  return registry;
}

// The optimizer's entry (created when none is alive). Caller holds the lock.
std::shared_ptr<detail::InitialLrs> acquire_initial_lrs(
    const torch::optim::Optimizer& optimizer) {
  auto& entry = registry().entries[&optimizer];
  auto found = entry.lock();
  if (!found) {
    found = std::make_shared<detail::InitialLrs>();
    entry = found;
  }
  return found;
}

} // namespace

LRScheduler::LRScheduler(
    torch::optim::Optimizer& optimizer,
    int64_t last_epoch,
    std::optional<std::vector<double>> initial_lrs)
    : LRScheduler(optimizer, NoInit{}) {
  last_epoch_ = last_epoch;
  auto& groups = optimizer.param_groups();
  TORCH_INTERNAL_ASSERT(!initial_lrs || initial_lrs->size() == groups.size());
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto& values = initial_lrs_->values;
  values.resize(std::max(values.size(), groups.size()));
  for (size_t i = 0; i < groups.size(); ++i) {
    if (initial_lrs) {
      values[i] = (*initial_lrs)[i];
    }
    if (last_epoch == -1 && !values[i]) {
      values[i] = groups[i].options().get_lr();
    }
    TORCH_CHECK(
        values[i].has_value(),
        "param 'initial_lr' is not specified in param_groups[",
        i,
        "] when resuming scheduler with last_epoch >= 0.\n"
        "This typically happens when:\n"
        "1. You're trying to resume training from a checkpoint but haven't "
        "properly loaded the optimizer state\n"
        "2. You're using last_epoch >= 0 for a fresh training run (not "
        "recommended)\n"
        "lamp keeps initial_lr beside the optimizer only while a scheduler "
        "of it is alive; to resume, construct the scheduler with "
        "last_epoch = -1 and call load_state_dict() (or torch::load).");
    base_lrs_.push_back(*values[i]);
  }
}

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, NoInit)
    : optimizer_(optimizer) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  initial_lrs_ = acquire_initial_lrs(optimizer);
}

LRScheduler::~LRScheduler() {
  // Under the lock: acquire_initial_lrs() reads the weak_ptrs. The last
  // scheduler of an optimizer removes its entry.
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (initial_lrs_.use_count() == 1) {
    registry().entries.erase(&optimizer_);
  }
  initial_lrs_.reset();
}

std::vector<double> LRScheduler::initial_lrs() const {
  const auto& groups = optimizer_.param_groups();
  std::lock_guard<std::mutex> lock(registry().mutex);
  const auto& values = initial_lrs_->values;
  std::vector<double> out;
  for (size_t i = 0; i < groups.size(); ++i) {
    TORCH_CHECK(
        i < values.size() && values[i].has_value(),
        name(),
        ": param group ",
        i,
        " has no 'initial_lr' (no scheduler was made while it existed)");
    out.push_back(*values[i]);
  }
  return out;
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> out;
  for (const auto& group : optimizer_.param_groups()) {
    out.push_back(group.options().get_lr());
  }
  return out;
}

void LRScheduler::initial_step() {
  // NOTE: as Python's _initial_mode, which sets False on exit (it does not
  // restore a previous value).
  step_count_ = 0;
  is_initial_ = true;
  auto reset = c10::make_scope_exit([this] { is_initial_ = false; });
  step();
}

void LRScheduler::step() {
  ++step_count_;
  update_lr(std::nullopt);
}

std::vector<double> LRScheduler::get_lr() {
  TORCH_CHECK(false, name(), " does not implement get_lr()");
}

std::optional<std::vector<double>> LRScheduler::get_closed_form_lr() const {
  return std::nullopt;
}

void LRScheduler::update_lr(std::optional<int64_t> epoch) {
  std::vector<double> values;
  {
    get_lr_called_within_step_ = true;
    auto reset =
        c10::make_scope_exit([this] { get_lr_called_within_step_ = false; });
    if (!epoch) {
      ++last_epoch_;
      values = get_lr();
    } else {
      last_epoch_ = *epoch;
      auto closed_form = get_closed_form_lr();
      values = closed_form ? std::move(*closed_form) : get_lr();
    }
  }
  auto& groups = optimizer_.param_groups();
  TORCH_CHECK(
      values.size() == groups.size(),
      name(),
      ": computed ",
      values.size(),
      " learning rates for ",
      groups.size(),
      " param groups (were param groups added after the scheduler was "
      "made?)");
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].options().set_lr(values[i]);
  }
  last_lr_ = group_lrs();
}

std::vector<LRScheduler::StateField> LRScheduler::state_fields() {
  return {
      {"base_lrs", &base_lrs_},
      {"last_epoch", &last_epoch_},
      {"_step_count", &step_count_},
      {"_is_initial", &is_initial_, StateField::kOrFalse},
      {"_get_lr_called_within_step",
       &get_lr_called_within_step_,
       StateField::kOrFalse},
      {"_last_lr", &last_lr_}};
}

std::vector<LRScheduler::StateField> LRScheduler::with_base_fields(
    std::vector<StateField> own) {
  auto base = LRScheduler::state_fields();
  own.insert(own.end(), base.begin(), base.end());
  return own;
}

LRScheduler::StateDict LRScheduler::state_dict() const {
  auto state = lamp::new_state_dict();
  // NOTE: state_fields() hands out pointers to members for loading too;
  // here they are only read.
  for (const auto& field : const_cast<LRScheduler*>(this)->state_fields()) {
    if (auto value = field.save()) {
      state.insert(field.key, std::move(*value));
    }
  }
  return state;
}

std::function<void()> LRScheduler::check_state_dict(
    const c10::impl::GenericDict& state,
    const std::string& where) {
  detail::StateReader reader(state, where, optimizer_.param_groups().size());
  const auto fields = state_fields();
  std::vector<std::function<void()>> apply;
  // NOTE: the extra checks of consecutive fields run once all of them are
  // read (CosineAnnealingWarmRestarts reads T_0, T_i and T_mult, then checks
  // their values): this order decides which error a state with several
  // faults reports.
  size_t checked = 0;
  auto check_up_to = [&](size_t end) {
    for (; checked < end; ++checked) {
      const auto& field = fields[checked];
      if (auto found =
              field.valid ? field.valid(reader.at(field.key)) : std::nullopt) {
        reader.fail(field.key, field.expected, *found);
      }
    }
  };
  for (const auto& field : fields) {
    if (!field.valid) {
      check_up_to(apply.size());
    }
    apply.push_back(field.check(reader));
  }
  check_up_to(fields.size());
  return [apply = std::move(apply)] {
    for (const auto& f : apply) {
      f();
    }
  };
}

void LRScheduler::load_state_dict(const StateDict& state_dict) {
  load_state_dict(c10::impl::toGenericDict(state_dict));
}

void LRScheduler::load_state_dict(const c10::impl::GenericDict& state_dict) {
  // Check everything, then apply: the returned function cannot throw, so a
  // bad state leaves the scheduler as it was.
  auto apply = check_state_dict(state_dict, name() + ".load_state_dict");
  apply();
}

void LRScheduler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("lamp_version", c10::IValue(kLampStateVersion));
  archive.write("state_dict", c10::IValue(state_dict()));
}

void LRScheduler::load(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  if (archive.try_read("lamp_version", value)) {
    TORCH_CHECK(
        value.isInt() && value.toInt() <= kLampStateVersion,
        name(),
        ".load: the state was written by a newer lamp (state version ",
        value,
        ", this lamp reads up to ",
        kLampStateVersion,
        "); upgrade lamp.");
  }
  TORCH_CHECK(
      archive.try_read("state_dict", value) && value.isGenericDict(),
      name(),
      ".load: the archive holds no scheduler state (no 'state_dict' "
      "entry); it was not written by LRScheduler::save.");
  load_state_dict(value.toGenericDict());
}

torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive,
    const LRScheduler& scheduler) {
  scheduler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive,
    LRScheduler& scheduler) {
  scheduler.load(archive);
  return archive;
}

} // namespace lamp::optim
