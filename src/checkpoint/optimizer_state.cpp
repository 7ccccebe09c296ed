// Optimizer state dicts in Python's layout (Adam, AdamW, SGD and the fused
// ones; any other optimizer as LibTorch's archive).
//
// NOTE: over 500 lines for one concern: each optimizer's save, check and
// load side by side, so that the three stay in step per optimizer.

#include "../optim/unique_params.h"
#include "python_state.h"

#include <lamp/optim.h>

#include <ATen/core/Dict.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace lamp::detail {
namespace {

using Dict = c10::impl::GenericDict;
using torch::optim::Optimizer;

enum class Family { kAdam, kAdamW, kSGD, kOther };
struct Kind {
  Family family = Family::kOther;
  bool fused = false; // lamp::optim::Fused*
};

Kind kind_of(const Optimizer& optimizer) {
  if (dynamic_cast<const optim::FusedAdam*>(&optimizer)) {
    return {Family::kAdam, true};
  }
  if (dynamic_cast<const optim::FusedAdamW*>(&optimizer)) {
    return {Family::kAdamW, true};
  }
  if (dynamic_cast<const optim::FusedSGD*>(&optimizer)) {
    return {Family::kSGD, true};
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) {
    return {Family::kAdamW, false};
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) {
    return {Family::kAdam, false};
  }
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) {
    return {Family::kSGD, false};
  }
  return {};
}

Dict new_dict() {
  return Dict(c10::StringType::get(), c10::AnyType::get());
}

const c10::IValue& get(const Dict& dict, const std::string& key) {
  const auto it = dict.find(key);
  TORCH_CHECK(it != dict.end(), "missing key '", key, "'");
  return it->value();
}

double number(const Dict& dict, const std::string& key) {
  const auto& v = get(dict, key);
  TORCH_CHECK(
      v.isDouble() || v.isInt(),
      "key '",
      key,
      "' should be a number, found ",
      v.tagKind());
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool boolean(const Dict& dict, const std::string& key) {
  const auto& v = get(dict, key);
  TORCH_CHECK(
      v.isBool(), "key '", key, "' should be a bool, found ", v.tagKind());
  return v.toBool();
}

std::pair<double, double> betas(const Dict& dict) {
  const auto& v = get(dict, "betas");
  std::vector<c10::IValue> items;
  if (v.isTuple()) {
    items = v.toTupleRef().elements().vec();
  } else if (v.isList()) {
    items = v.toListRef().vec();
  }
  TORCH_CHECK(
      items.size() == 2 && (items[0].isDouble() || items[0].isInt()) &&
          (items[1].isDouble() || items[1].isInt()),
      "key 'betas' should be a pair of numbers");
  auto as_double = [](const c10::IValue& x) {
    return x.isDouble() ? x.toDouble() : static_cast<double>(x.toInt());
  };
  return {as_double(items[0]), as_double(items[1])};
}

// A flag Python writes that lamp cannot honour must be off (or absent).
void check_off(const Dict& group, const std::string& key) {
  const auto it = group.find(key);
  TORCH_CHECK(
      it == group.end() || it->value().isNone() ||
          (it->value().isBool() && !it->value().toBool()),
      "param group key '",
      key,
      "' is on in the checkpoint; this optimizer does not support it");
}

// Saved parameter ids → the live parameters they stand for, matched by
// position over all groups (as Python's load_state_dict).
struct Layout {
  std::map<int64_t, torch::Tensor> params;
  std::vector<Dict> groups;
  Dict state{c10::AnyType::get(), c10::AnyType::get()};
};

Layout layout(const Optimizer& optimizer, const c10::IValue& value) {
  TORCH_CHECK(
      value.isGenericDict(),
      "expected an optimizer state_dict (a dict), found ",
      value.tagKind());
  const auto dict = value.toGenericDict();
  const auto& groups = get(dict, "param_groups");
  TORCH_CHECK(groups.isList(), "'param_groups' should be a list");
  const auto& saved = groups.toListRef();
  // Each tensor once, as Python's optimizer lists it (a tied weight that a
  // LibTorch optimizer lists twice has one state and one id).
  const auto live =
      unique_group_params(optimizer, "lamp::load_checkpoint (optimizer)");
  TORCH_CHECK(
      saved.size() == live.size(),
      "the checkpoint has ",
      saved.size(),
      " param groups, the optimizer ",
      live.size());
  Layout out;
  for (size_t g = 0; g < saved.size(); ++g) {
    TORCH_CHECK(
        saved[g].isGenericDict(), "param group ", g, " should be a dict");
    out.groups.push_back(saved[g].toGenericDict());
    const auto& ids = get(out.groups.back(), "params");
    TORCH_CHECK(ids.isList(), "param group ", g, ": 'params' is no list");
    const auto& list = ids.toListRef();
    TORCH_CHECK(
        list.size() == live[g].size(),
        "param group ",
        g,
        " has ",
        list.size(),
        " parameters in the checkpoint and ",
        live[g].size(),
        " in the optimizer");
    for (size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(list[i].isInt(), "param group ", g, ": an id is no int");
      out.params[list[i].toInt()] = live[g][i];
    }
  }
  const auto& state = get(dict, "state");
  TORCH_CHECK(state.isGenericDict(), "'state' should be a dict");
  out.state = state.toGenericDict();
  for (const auto& entry : out.state) {
    TORCH_CHECK(
        entry.key().isInt() && out.params.count(entry.key().toInt()),
        "state of parameter ",
        entry.key(),
        ", which no param group lists");
    TORCH_CHECK(
        entry.value().isGenericDict(),
        "state of parameter ",
        entry.key(),
        " should be a dict");
  }
  return out;
}

// The tensor `key` of one parameter's state, shaped like the parameter.
torch::Tensor state_tensor(
    const Dict& state,
    const std::string& key,
    const torch::Tensor& param,
    int64_t id) {
  const auto& v = get(state, key);
  TORCH_CHECK(
      v.isTensor(), "state of parameter ", id, ": '", key, "' is no tensor");
  const auto& t = v.toTensor();
  TORCH_CHECK(
      t.sizes() == param.sizes(),
      "state of parameter ",
      id,
      ": '",
      key,
      "' has shape ",
      shape_string(t.sizes()),
      " in the checkpoint and the parameter ",
      shape_string(param.sizes()));
  return t;
}

double step_value(const Dict& state, int64_t id) {
  const auto& v = get(state, "step");
  if (v.isTensor()) {
    TORCH_CHECK(
        v.toTensor().numel() == 1,
        "state of parameter ",
        id,
        ": 'step' should hold one number");
    return v.toTensor().item<double>();
  }
  TORCH_CHECK(
      v.isDouble() || v.isInt(),
      "state of parameter ",
      id,
      ": 'step' should be a number");
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

// `saved` in `live`'s place: copied in place when `live` fits, else a new
// tensor laid out like the parameter (as the optimizers make their state).
torch::Tensor assign(
    const torch::Tensor& live,
    const torch::Tensor& saved,
    const torch::Tensor& like) {
  if (live.defined() && live.sizes() == saved.sizes()) {
    live.copy_(saved);
    return live;
  }
  return at::empty_like(like, at::MemoryFormat::Preserve).copy_(saved);
}

c10::IValue cpu(const torch::Tensor& t) {
  return t.defined() ? c10::IValue(host_copy(t)) : c10::IValue();
}

// Python's param_groups and state: each group's hyperparameters from
// `group_dict(options)` plus "params" (indices counting over all groups),
// each parameter's state from `state_dict(param_state)` (nullopt: none).
template <typename GroupDict, typename StateDict>
void save_groups(
    const Optimizer& o,
    const GroupDict& group_dict,
    const StateDict& state_dict,
    Dict& state,
    c10::impl::GenericList& groups) {
  int64_t id = 0;
  const auto params =
      unique_group_params(o, "lamp::save_checkpoint (optimizer)");
  for (size_t index = 0; index < params.size(); ++index) {
    Dict g = group_dict(o.param_groups()[index].options());
    c10::impl::GenericList ids(c10::AnyType::get());
    for (const auto& p : params[index]) {
      ids.push_back(id);
      const auto it = o.state().find(p.unsafeGetTensorImpl());
      if (it != o.state().end()) {
        if (auto s = state_dict(*it->second)) {
          state.insert(id, *s);
        }
      }
      ++id;
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
}

// The live state of type `State` of `param`, made if missing.
template <typename State>
State& state_of(Optimizer& o, const torch::Tensor& param) {
  auto& slot = o.state()[param.unsafeGetTensorImpl()];
  if (!slot) {
    slot = std::make_unique<State>();
  }
  return static_cast<State&>(*slot);
}

// ---- Adam / AdamW ----------------------------------------------------------

// NOTE: the same moments in lamp's FusedAdamParamState (step: a device
// tensor) and LibTorch's AdamParamState (step: an int).
template <typename State>
Dict adam_state(const State& ps, c10::IValue step) {
  auto s = new_dict();
  s.insert("step", std::move(step));
  s.insert("exp_avg", cpu(ps.exp_avg()));
  s.insert("exp_avg_sq", cpu(ps.exp_avg_sq()));
  if (ps.max_exp_avg_sq().defined()) {
    s.insert("max_exp_avg_sq", cpu(ps.max_exp_avg_sq()));
  }
  return s;
}

template <typename State>
void load_adam_moments(State& ps, const Dict& s, const torch::Tensor& param) {
  ps.exp_avg(assign(ps.exp_avg(), s.at("exp_avg").toTensor(), param));
  ps.exp_avg_sq(assign(ps.exp_avg_sq(), s.at("exp_avg_sq").toTensor(), param));
  if (s.contains("max_exp_avg_sq") && !s.at("max_exp_avg_sq").isNone()) {
    ps.max_exp_avg_sq(
        assign(ps.max_exp_avg_sq(), s.at("max_exp_avg_sq").toTensor(), param));
  }
}

template <typename Options>
void save_adam(
    const Optimizer& o,
    Kind kind,
    Dict& state,
    c10::impl::GenericList& groups) {
  auto group_dict = [&](const torch::optim::OptimizerOptions& options) {
    const auto& opt = static_cast<const Options&>(options);
    auto g = new_dict();
    g.insert("lr", opt.lr());
    g.insert(
        "betas",
        c10::ivalue::Tuple::create(
            {std::get<0>(opt.betas()), std::get<1>(opt.betas())}));
    g.insert("eps", opt.eps());
    g.insert("weight_decay", opt.weight_decay());
    g.insert("amsgrad", opt.amsgrad());
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", kind.fused ? c10::IValue(true) : c10::IValue());
    g.insert("decoupled_weight_decay", kind.family == Family::kAdamW);
    return g;
  };
  auto state_dict = [&](const torch::optim::OptimizerParamState& param_state)
      -> std::optional<Dict> {
    if (kind.fused) {
      const auto& ps =
          static_cast<const optim::FusedAdamParamState&>(param_state);
      return adam_state(ps, cpu(ps.step()));
    }
    const auto& ps =
        static_cast<const torch::optim::AdamParamState&>(param_state);
    // Python's non-fused Adam keeps `step` in a float32 CPU tensor.
    return adam_state(
        ps, at::scalar_tensor(static_cast<double>(ps.step()), at::kFloat));
  };
  save_groups(o, group_dict, state_dict, state, groups);
}

void check_adam(const Layout& l) {
  for (const auto& group : l.groups) {
    number(group, "lr");
    betas(group);
    number(group, "eps");
    number(group, "weight_decay");
    check_off(group, "maximize");
    // amsgrad on needs max_exp_avg_sq for every parameter with state.
    if (boolean(group, "amsgrad")) {
      for (const auto& id : group.at("params").toListRef()) {
        const auto it = l.state.find(id);
        TORCH_CHECK(
            it == l.state.end() ||
                it->value().toGenericDict().contains("max_exp_avg_sq"),
            "state of parameter ",
            id.toInt(),
            ": amsgrad is on but 'max_exp_avg_sq' is missing");
      }
    }
  }
  for (const auto& entry : l.state) {
    const auto id = entry.key().toInt();
    const auto& param = l.params.at(id);
    const auto s = entry.value().toGenericDict();
    step_value(s, id);
    state_tensor(s, "exp_avg", param, id);
    state_tensor(s, "exp_avg_sq", param, id);
    if (s.contains("max_exp_avg_sq") && !s.at("max_exp_avg_sq").isNone()) {
      state_tensor(s, "max_exp_avg_sq", param, id);
    }
  }
}

template <typename Options>
void load_adam(Optimizer& o, Kind kind, const Layout& l) {
  auto& live = o.param_groups();
  for (size_t g = 0; g < l.groups.size(); ++g) {
    auto& opt = static_cast<Options&>(live[g].options());
    const auto& group = l.groups[g];
    opt.lr(number(group, "lr"));
    const auto [b1, b2] = betas(group);
    opt.betas(std::make_tuple(b1, b2));
    opt.eps(number(group, "eps"));
    opt.weight_decay(number(group, "weight_decay"));
    opt.amsgrad(boolean(group, "amsgrad"));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [id, param] : l.params) {
    const auto it = l.state.find(id);
    if (it == l.state.end()) {
      o.state().erase(param.unsafeGetTensorImpl());
      continue;
    }
    const auto s = it->value().toGenericDict();
    const double step = step_value(s, id);
    if (kind.fused) {
      auto& ps = state_of<optim::FusedAdamParamState>(o, param);
      if (ps.step().defined()) {
        ps.step().fill_(step); // in place: graphs keep their memory
      } else {
        ps.step(at::scalar_tensor(step, at::kFloat).to(param.device()));
      }
      load_adam_moments(ps, s, param);
    } else {
      auto& ps = state_of<torch::optim::AdamParamState>(o, param);
      ps.step(static_cast<int64_t>(std::llround(step)));
      load_adam_moments(ps, s, param);
    }
  }
}

// ---- SGD -------------------------------------------------------------------

void save_sgd(
    const Optimizer& o,
    Kind kind,
    Dict& state,
    c10::impl::GenericList& groups) {
  auto group_dict = [&](const torch::optim::OptimizerOptions& options) {
    const auto& opt = static_cast<const torch::optim::SGDOptions&>(options);
    auto g = new_dict();
    g.insert("lr", opt.lr());
    g.insert("momentum", opt.momentum());
    g.insert("dampening", opt.dampening());
    g.insert("weight_decay", opt.weight_decay());
    g.insert("nesterov", opt.nesterov());
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("differentiable", false);
    g.insert("fused", kind.fused ? c10::IValue(true) : c10::IValue());
    return g;
  };
  auto state_dict = [](const torch::optim::OptimizerParamState& param_state)
      -> std::optional<Dict> {
    const auto& ps =
        static_cast<const torch::optim::SGDParamState&>(param_state);
    // NOTE: as Python, only parameters with a momentum buffer have state.
    if (!ps.momentum_buffer().defined()) {
      return std::nullopt;
    }
    auto s = new_dict();
    s.insert("momentum_buffer", cpu(ps.momentum_buffer()));
    return s;
  };
  save_groups(o, group_dict, state_dict, state, groups);
}

void check_sgd(const Layout& l) {
  for (const auto& group : l.groups) {
    number(group, "lr");
    number(group, "momentum");
    number(group, "dampening");
    number(group, "weight_decay");
    boolean(group, "nesterov");
    check_off(group, "maximize");
  }
  for (const auto& entry : l.state) {
    const auto id = entry.key().toInt();
    const auto s = entry.value().toGenericDict();
    if (s.contains("momentum_buffer") && !s.at("momentum_buffer").isNone()) {
      state_tensor(s, "momentum_buffer", l.params.at(id), id);
    }
  }
}

void load_sgd(Optimizer& o, const Layout& l) {
  auto& live = o.param_groups();
  for (size_t g = 0; g < l.groups.size(); ++g) {
    auto& opt = static_cast<torch::optim::SGDOptions&>(live[g].options());
    const auto& group = l.groups[g];
    opt.lr(number(group, "lr"));
    opt.momentum(number(group, "momentum"));
    opt.dampening(number(group, "dampening"));
    opt.weight_decay(number(group, "weight_decay"));
    opt.nesterov(boolean(group, "nesterov"));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [id, param] : l.params) {
    const auto it = l.state.find(id);
    const auto s =
        it == l.state.end() ? new_dict() : it->value().toGenericDict();
    if (!s.contains("momentum_buffer") || s.at("momentum_buffer").isNone()) {
      o.state().erase(param.unsafeGetTensorImpl());
      continue;
    }
    auto& ps = state_of<torch::optim::SGDParamState>(o, param);
    ps.momentum_buffer(assign(
        ps.momentum_buffer(), s.at("momentum_buffer").toTensor(), param));
  }
}

// ---- any other optimizer: LibTorch's archive, as bytes ---------------------

constexpr const char* kArchiveKey = "lamp_libtorch_archive";

} // namespace

bool has_python_layout(const Optimizer& optimizer) {
  return kind_of(optimizer).family != Family::kOther;
}

Dict optimizer_state_dict(const Optimizer& optimizer) {
  const auto kind = kind_of(optimizer);
  auto out = new_dict();
  if (kind.family == Family::kOther) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    const auto s = bytes.str();
    out.insert(
        kArchiveKey,
        torch::tensor(
            at::ArrayRef<uint8_t>(
                reinterpret_cast<const uint8_t*>(s.data()), s.size()),
            at::kByte));
    return out;
  }
  Dict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  switch (kind.family) {
    case Family::kAdam:
      save_adam<torch::optim::AdamOptions>(optimizer, kind, state, groups);
      break;
    case Family::kAdamW:
      save_adam<torch::optim::AdamWOptions>(optimizer, kind, state, groups);
      break;
    default:
      save_sgd(optimizer, kind, state, groups);
  }
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void check_optimizer_state_dict(
    const Optimizer& optimizer,
    const c10::IValue& state) {
  const auto kind = kind_of(optimizer);
  if (kind.family == Family::kOther) {
    TORCH_CHECK(
        state.isGenericDict() && state.toGenericDict().contains(kArchiveKey) &&
            state.toGenericDict().at(kArchiveKey).isTensor(),
        "this optimizer has no Python state_dict layout in lamp; expected "
        "the '",
        kArchiveKey,
        "' lamp writes for it");
    return;
  }
  const auto l = layout(optimizer, state);
  if (kind.family == Family::kSGD) {
    check_sgd(l);
  } else {
    check_adam(l);
  }
}

void load_optimizer_state_dict(Optimizer& optimizer, const c10::IValue& state) {
  const auto kind = kind_of(optimizer);
  if (kind.family == Family::kOther) {
    const auto bytes =
        state.toGenericDict().at(kArchiveKey).toTensor().contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(
        reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
        static_cast<size_t>(bytes.numel()));
    optimizer.load(archive);
    return;
  }
  const auto l = layout(optimizer, state);
  switch (kind.family) {
    case Family::kAdam:
      load_adam<torch::optim::AdamOptions>(optimizer, kind, l);
      break;
    case Family::kAdamW:
      load_adam<torch::optim::AdamWOptions>(optimizer, kind, l);
      break;
    default:
      load_sgd(optimizer, l);
  }
}

} // namespace lamp::detail
