// The cyclic schedules: CosineAnnealingWarmRestarts and OneCycleLR (which
// also cycles the optimizer's momentum or Adam's beta1). Formulas are
// Python's, operation for operation (see the NOTE in factor.cpp).

#include <lamp/lr_scheduler/cyclic.h>

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <tuple>
#include <utility>

#include "../python_repr.h"
#include "state.h"

namespace lamp::optim {

namespace {

using detail::kPi;

template <typename... Options>
bool is_one_of(const torch::optim::OptimizerOptions& options) {
  return (... || (dynamic_cast<const Options*>(&options) != nullptr));
}

// Whether OneCycleLR cycles beta1: Python's `"betas" in defaults` (Adam,
// AdamW) or `"momentum" in defaults` (SGD, RMSprop); nullopt for neither.
std::optional<bool> uses_beta1(const torch::optim::OptimizerOptions& options) {
  using namespace torch::optim;
  if (is_one_of<AdamOptions, AdamWOptions>(options)) {
    return true;
  }
  if (is_one_of<SGDOptions, RMSpropOptions>(options)) {
    return false;
  }
  return std::nullopt;
}

void set_momentum(
    torch::optim::OptimizerOptions& options,
    bool use_beta1,
    double value) {
  using namespace torch::optim;
  auto beta1 = [value](auto* typed) {
    if (typed != nullptr) {
      typed->betas(std::make_tuple(value, std::get<1>(typed->betas())));
    }
    return typed != nullptr;
  };
  auto momentum = [value](auto* typed) {
    if (typed != nullptr) {
      typed->momentum(value);
    }
    return typed != nullptr;
  };
  TORCH_CHECK(
      use_beta1 ? beta1(dynamic_cast<AdamOptions*>(&options)) ||
              beta1(dynamic_cast<AdamWOptions*>(&options))
                : momentum(dynamic_cast<SGDOptions*>(&options)) ||
              momentum(dynamic_cast<RMSpropOptions*>(&options)),
      "OneCycleLR: a param group's options have no ",
      use_beta1 ? "betas" : "momentum",
      " to cycle");
}

// Python's _format_param: one value per param group.
std::vector<double> format_param(
    const char* name,
    const torch::optim::Optimizer& optimizer,
    const PerGroup& param) {
  const size_t groups = optimizer.param_groups().size();
  if (!param.is_list()) {
    return std::vector<double>(groups, param.values().front());
  }
  TORCH_CHECK_VALUE(
      param.values().size() == groups,
      name,
      " must have the same length as optimizer.param_groups. ",
      name,
      " has ",
      param.values().size(),
      " values, param_groups has ",
      groups,
      ".");
  return param.values();
}

// Python's checks of OneCycleLR.__init__, in its order, before the base
// initialisation; returns each group's initial_lr.
std::vector<double> one_cycle_initial_lrs(
    const torch::optim::Optimizer& optimizer,
    const OneCycleLROptions& options) {
  if (options.total_steps()) {
    detail::check_positive("total_steps", *options.total_steps());
  } else if (options.epochs() && options.steps_per_epoch()) {
    detail::check_positive("epochs", *options.epochs());
    detail::check_positive("steps_per_epoch", *options.steps_per_epoch());
  } else {
    TORCH_CHECK_VALUE(
        false,
        "You must define either total_steps OR (epochs AND steps_per_epoch)");
  }
  TORCH_CHECK_VALUE(
      !(options.pct_start() < 0 || options.pct_start() > 1),
      "Expected float between 0 and 1 pct_start, but got ",
      lamp::detail::python_repr(options.pct_start()));
  TORCH_CHECK_VALUE(
      options.anneal_strategy() == "cos" ||
          options.anneal_strategy() == "linear",
      "anneal_strategy must be one of 'cos' or 'linear', instead got ",
      options.anneal_strategy());
  auto lrs = format_param("max_lr", optimizer, options.max_lr());
  if (options.cycle_momentum()) {
    TORCH_CHECK_VALUE(
        uses_beta1(optimizer.defaults()).has_value(),
        "optimizer must support momentum or beta1 with `cycle_momentum` "
        "option enabled");
    format_param("max_momentum", optimizer, options.max_momentum());
    format_param("base_momentum", optimizer, options.base_momentum());
  }
  for (auto& lr : lrs) {
    lr = lr / options.div_factor();
  }
  return lrs;
}

// The per-group values a phase names (indices of group_values_), and the
// keys of a phase that name them.
enum PhaseValue { kInitialLr, kMaxLr, kMinLr, kMaxMomentum, kBaseMomentum };
constexpr const char* kPhaseValueNames[] =
    {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"};
constexpr const char* kPhaseKeys[] = {
    "start_lr",
    "end_lr",
    "start_momentum",
    "end_momentum"};

} // namespace

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(
    torch::optim::Optimizer& optimizer,
    int64_t T_0,
    int64_t T_mult,
    double eta_min,
    int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch),
      T_0_(T_0),
      T_i_(T_0),
      T_mult_(T_mult),
      eta_min_(eta_min),
      T_cur_(last_epoch) {
  detail::check_positive("T_0", T_0);
  TORCH_CHECK_VALUE(
      T_mult >= 1, "Expected integer T_mult >= 1, but got ", T_mult);
  initial_step();
}

void CosineAnnealingWarmRestarts::step() {
  // Python's step(epoch=None); the first call (last_epoch < 0) takes the
  // explicit-epoch branch with epoch 0. Python does not count _step_count.
  int64_t epoch = 0;
  if (last_epoch_ >= 0) {
    epoch = last_epoch_ + 1;
    T_cur_ = T_cur_ + 1;
    if (T_cur_ >= T_i_) {
      T_cur_ = T_cur_ % T_i_;
      T_i_ = T_i_ * T_mult_;
    }
  } else {
    T_i_ = T_0_;
    T_cur_ = epoch;
  }
  update_lr(epoch); // no closed form: sets last_epoch, then get_lr()
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  return detail::cosine_anneal(
      base_lrs_,
      eta_min_,
      static_cast<double>(T_cur_),
      static_cast<double>(T_i_));
}

std::vector<LRScheduler::StateField> CosineAnnealingWarmRestarts::
    state_fields() {
  return with_base_fields(
      {StateField("T_0", &T_0_).at_least(1, "a positive int"),
       StateField("T_i", &T_i_, StateField::kIntegral)
           .at_least(1, "a positive int"),
       StateField("T_mult", &T_mult_).at_least(1, "an int >= 1"),
       {"eta_min", &eta_min_},
       {"T_cur", &T_cur_, StateField::kIntegral}});
}

OneCycleLR::OneCycleLR(
    torch::optim::Optimizer& optimizer,
    OneCycleLROptions options)
    : LRScheduler(
          optimizer,
          options.last_epoch(),
          one_cycle_initial_lrs(optimizer, options)),
      anneal_func_type_(options.anneal_strategy()),
      cycle_momentum_(options.cycle_momentum()) {
  total_steps_ = options.total_steps()
      ? *options.total_steps()
      : *options.epochs() * *options.steps_per_epoch();
  const double pct_start = options.pct_start();
  const double total = static_cast<double>(total_steps_);
  const double last = static_cast<double>(total_steps_ - 1);
  schedule_phases_ = {
      {pct_start * total - 1,
       false,
       {kInitialLr, kMaxLr, kMaxMomentum, kBaseMomentum}}};
  if (options.three_phase()) {
    schedule_phases_.push_back(
        {2 * pct_start * total - 2,
         false,
         {kMaxLr, kInitialLr, kBaseMomentum, kMaxMomentum}});
    schedule_phases_.push_back(
        {last, true, {kInitialLr, kMinLr, kMaxMomentum, kMaxMomentum}});
  } else {
    schedule_phases_.push_back(
        {last, true, {kMaxLr, kMinLr, kBaseMomentum, kMaxMomentum}});
  }
  auto& values = group_values_;
  values[kMaxLr] = format_param("max_lr", optimizer, options.max_lr());
  values[kInitialLr] = initial_lrs();
  for (double lr : values[kInitialLr]) {
    values[kMinLr].push_back(lr / options.final_div_factor());
  }
  // NOTE: Python checks the momenta's lengths only when cycling them;
  // without cycling a wrong length leaves them unset (a state loaded later
  // that turns cycling on then fails at its first step, as Python's would).
  const size_t groups = optimizer.param_groups().size();
  auto momenta = [&](const char* name, const PerGroup& value) {
    return cycle_momentum_ || !value.is_list() ||
            value.values().size() == groups
        ? format_param(name, optimizer, value)
        : std::vector<double>{};
  };
  values[kMaxMomentum] = momenta("max_momentum", options.max_momentum());
  values[kBaseMomentum] = momenta("base_momentum", options.base_momentum());
  if (cycle_momentum_) {
    use_beta1_ = *uses_beta1(optimizer.defaults());
    auto& param_groups = optimizer.param_groups();
    for (size_t i = 0; i < groups; ++i) {
      if (options.last_epoch() == -1) {
        set_momentum(
            param_groups[i].options(), use_beta1_, values[kMaxMomentum][i]);
      }
    }
  }
  initial_step();
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch_;
  TORCH_CHECK_VALUE(
      step_num <= total_steps_,
      "Tried to step ",
      step_num,
      " times. The specified number of total steps is ",
      total_steps_);
  // The phase of step_num: the first that ends at or after it, else the last.
  const double step = static_cast<double>(step_num);
  size_t i = 0;
  while (i + 1 < schedule_phases_.size() &&
         step > schedule_phases_[i].end_step) {
    ++i;
  }
  const double start_step = i == 0 ? 0.0 : schedule_phases_[i - 1].end_step;
  const auto& phase = schedule_phases_[i];
  const double pct = (step - start_step) / (phase.end_step - start_step);
  auto anneal = [this, pct](size_t group, int start, int end) {
    for (int v : {start, end}) {
      TORCH_CHECK(
          group < group_values_[v].size(),
          "OneCycleLR: param group ",
          group,
          " has no '",
          kPhaseValueNames[v],
          "' (was the group added after the scheduler was made?)");
    }
    const double from = group_values_[start][group];
    const double to = group_values_[end][group];
    if (anneal_func_type_ == "cos") {
      const double cos_out = std::cos(kPi * pct) + 1;
      return to + (from - to) / 2.0 * cos_out;
    }
    return (to - from) * pct + from;
  };
  auto& groups = optimizer().param_groups();
  std::vector<double> lrs;
  for (size_t g = 0; g < groups.size(); ++g) {
    lrs.push_back(anneal(g, phase.values[0], phase.values[1]));
    if (cycle_momentum_) {
      set_momentum(
          groups[g].options(),
          use_beta1_,
          anneal(g, phase.values[2], phase.values[3]));
    }
  }
  return lrs;
}

std::vector<LRScheduler::StateField> OneCycleLR::state_fields() {
  auto save_phases = [this] {
    c10::impl::GenericList phases(c10::AnyType::get());
    for (const auto& phase : schedule_phases_) {
      auto entry = lamp::new_state_dict();
      entry.insert(
          "end_step",
          phase.end_step_is_int
              ? c10::IValue(static_cast<int64_t>(phase.end_step))
              : c10::IValue(phase.end_step));
      for (size_t k = 0; k < 4; ++k) {
        entry.insert(kPhaseKeys[k], kPhaseValueNames[phase.values[k]]);
      }
      phases.push_back(entry);
    }
    return c10::IValue(phases);
  };
  auto check_phases = [this](const detail::StateReader& reader) {
    const auto dicts = reader.get_dict_list("_schedule_phases", std::nullopt);
    if (dicts.empty()) {
      reader.fail("_schedule_phases", "a non-empty list of dicts", "[]");
    }
    std::vector<Phase> phases;
    for (size_t i = 0; i < dicts.size(); ++i) {
      detail::StateReader phase_reader(
          dicts[i],
          reader.where() + ": _schedule_phases[" + std::to_string(i) + "]");
      Phase phase{
          phase_reader.get<double>("end_step"),
          phase_reader.at("end_step").isInt(),
          {}};
      for (size_t k = 0; k < 4; ++k) {
        const auto name = phase_reader.get<std::string>(kPhaseKeys[k]);
        const auto* it = std::find(
            std::begin(kPhaseValueNames), std::end(kPhaseValueNames), name);
        if (it == std::end(kPhaseValueNames)) {
          phase_reader.fail(
              kPhaseKeys[k],
              "one of 'initial_lr', 'max_lr', 'min_lr', 'max_momentum', "
              "'base_momentum'",
              "'" + name + "'");
        }
        phase.values[k] = static_cast<int>(it - std::begin(kPhaseValueNames));
      }
      phases.push_back(phase);
    }
    return [this, phases] { schedule_phases_ = phases; };
  };
  // Python writes `use_beta1` only when cycling momentum.
  auto save_beta1 = [this]() -> std::optional<c10::IValue> {
    return cycle_momentum_ ? std::optional(c10::IValue(use_beta1_))
                           : std::nullopt;
  };
  auto check_beta1 =
      [this](const detail::StateReader& reader) -> std::function<void()> {
    if (!reader.get<bool>("cycle_momentum")) {
      return [] {};
    }
    const bool use_beta1 = reader.get<bool>("use_beta1");
    if (uses_beta1(optimizer().defaults()) != use_beta1) {
      reader.fail(
          "use_beta1",
          use_beta1 == false
              ? "false only for an optimizer with momentum (SGD, RMSprop)"
              : "true only for an optimizer with betas (Adam, AdamW)",
          std::string(use_beta1 ? "true" : "false") + " for this optimizer");
    }
    return [this, use_beta1] { use_beta1_ = use_beta1; };
  };
  return with_base_fields(
      {{"total_steps", &total_steps_},
       {"_schedule_phases", save_phases, check_phases},
       StateField("_anneal_func_type", &anneal_func_type_)
           .one_of("cos", "linear"),
       {"cycle_momentum", &cycle_momentum_},
       {"use_beta1", save_beta1, check_beta1}});
}

} // namespace lamp::optim
