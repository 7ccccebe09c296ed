#include <lamp/checkpoint.h>

#include <lamp/config.h>

#include "python_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>
#include <mutex>
#include <sstream>
#include <utility>

namespace lamp {

// NOTE: in lamp::detail, not the anonymous namespace: TrainingState::Impl
// holds them, and a type with linkage should not hold one without (GCC's
// -Wsubobject-linkage, in the unity build).
namespace detail {

// One registered object: how to save it, check a saved value against it,
// and restore it.
struct TrainingStateEntry {
  std::string key;
  std::function<c10::IValue()> save;
  std::function<void(const c10::IValue&)> check; // throws on a misfit
  std::function<void(const c10::IValue&)> load; // after check
  // NOTE: load may still throw after check (objects that validate inside
  // their own load_state_dict): loaded first, rolled back on failure.
  bool may_throw = false;
};

} // namespace detail

namespace {

using Dict = c10::impl::GenericDict;

Dict new_dict() {
  return Dict(c10::StringType::get(), c10::AnyType::get());
}

// Prefixes the message of any c10::Error that `f` throws with `context`.
template <typename F>
void with_context(const std::string& context, const F& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, context, e.what_without_backtrace());
  }
}

// ---- RNG states --------------------------------------------------------

c10::IValue generator_state(c10::Device device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const at::Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

int64_t cuda_devices() {
  return torch::cuda::is_available()
      ? static_cast<int64_t>(torch::cuda::device_count())
      : 0;
}

} // namespace

// {"cpu": ByteTensor, "cuda": [ByteTensor per device]}: this process's.
c10::impl::GenericDict detail::rng_state() {
  auto out = new_dict();
  out.insert("cpu", generator_state(c10::kCPU));
  c10::impl::GenericList cuda(c10::AnyType::get());
  for (int64_t i = 0; i < cuda_devices(); ++i) {
    cuda.push_back(generator_state(c10::Device(c10::kCUDA, i)));
  }
  out.insert("cuda", cuda);
  return out;
}

namespace {

// The entry of `rank` in the "rng" list (rank 0's when the saving job had
// fewer ranks).
Dict rng_entry(const c10::IValue& rng, int64_t rank) {
  TORCH_CHECK(
      rng.isList() && rng.toListRef().size() > 0,
      "'rng' should be a list of per-rank dicts");
  const auto& list = rng.toListRef();
  const auto& entry = list[static_cast<size_t>(rank) < list.size() ? rank : 0];
  TORCH_CHECK(entry.isGenericDict(), "'rng' entries should be dicts");
  return entry.toGenericDict();
}

void check_state_tensor(
    const c10::IValue& saved,
    const c10::IValue& live,
    const char* what) {
  TORCH_CHECK(
      saved.isTensor() && saved.toTensor().scalar_type() == at::kByte &&
          saved.toTensor().numel() == live.toTensor().numel(),
      "'rng' ",
      what,
      " should be a uint8 tensor of ",
      live.toTensor().numel(),
      " bytes");
}

void check_rng(const c10::IValue& rng, int64_t rank) {
  const auto entry = rng_entry(rng, rank);
  TORCH_CHECK(entry.contains("cpu"), "'rng' has no 'cpu' state");
  check_state_tensor(entry.at("cpu"), generator_state(c10::kCPU), "cpu");
  if (entry.contains("cuda") && cuda_devices() > 0) {
    TORCH_CHECK(entry.at("cuda").isList(), "'rng' 'cuda' should be a list");
    const auto live = generator_state(c10::Device(c10::kCUDA, 0));
    for (const auto& state : entry.at("cuda").toListRef()) {
      check_state_tensor(state, live, "cuda");
    }
  }
}

void load_rng(const c10::IValue& rng, int64_t rank) {
  const auto entry = rng_entry(rng, rank);
  set_generator_state(c10::kCPU, entry.at("cpu").toTensor());
  if (entry.contains("cuda")) {
    const auto& cuda = entry.at("cuda").toListRef();
    const int64_t n =
        std::min<int64_t>(static_cast<int64_t>(cuda.size()), cuda_devices());
    for (int64_t i = 0; i < n; ++i) {
      set_generator_state(c10::Device(c10::kCUDA, i), cuda[i].toTensor());
    }
  }
}

// A value entry: `check` tests the IValue's type, `load` assigns.
template <typename T>
detail::TrainingStateEntry value_entry(
    std::string key,
    T& value,
    bool (c10::IValue::*is)() const,
    const char* type) {
  detail::TrainingStateEntry e;
  e.key = std::move(key);
  e.save = [&value] { return c10::IValue(value); };
  e.check = [is, type](const c10::IValue& v) {
    TORCH_CHECK((v.*is)(), "should be ", type, ", found ", v.tagKind());
  };
  e.load = [&value](const c10::IValue& v) { value = v.to<T>(); };
  return e;
}

} // namespace

struct TrainingState::Impl {
  std::vector<detail::TrainingStateEntry> entries;
  bool rng = true;

  TrainingState& add(TrainingState& self, detail::TrainingStateEntry entry) {
    TORCH_CHECK_VALUE(
        !entry.key.empty() && entry.key != "rng" && entry.key != "lamp",
        "lamp::TrainingState::add: the key '",
        entry.key,
        "' is reserved or empty; pick another name");
    for (const auto& e : entries) {
      TORCH_CHECK_VALUE(
          e.key != entry.key,
          "lamp::TrainingState::add: the key '",
          entry.key,
          "' was added twice");
    }
    entries.push_back(std::move(entry));
    return self;
  }
};

TrainingState::TrainingState() : impl_(std::make_unique<Impl>()) {}
TrainingState::~TrainingState() = default;
TrainingState::TrainingState(TrainingState&&) noexcept = default;
TrainingState& TrainingState::operator=(TrainingState&&) noexcept = default;

TrainingState& TrainingState::add(std::string key, torch::nn::Module& module) {
  detail::TrainingStateEntry e;
  e.key = std::move(key);
  e.save = [&module] { return detail::module_state_dict(module); };
  e.check = [&module](const c10::IValue& v) {
    detail::check_module_state_dict(module, v);
  };
  e.load = [&module](const c10::IValue& v) {
    detail::load_module_state_dict(module, v);
  };
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::add(
    std::string key,
    torch::optim::Optimizer& optimizer) {
  detail::TrainingStateEntry e;
  e.key = std::move(key);
  e.save = [&optimizer] { return detail::optimizer_state_dict(optimizer); };
  e.check = [&optimizer](const c10::IValue& v) {
    detail::check_optimizer_state_dict(optimizer, v);
  };
  e.load = [&optimizer](const c10::IValue& v) {
    detail::load_optimizer_state_dict(optimizer, v);
  };
  e.may_throw = !detail::has_python_layout(optimizer);
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::add(std::string key, int64_t& value) {
  return impl_->add(
      *this, value_entry(std::move(key), value, &c10::IValue::isInt, "an int"));
}

TrainingState& TrainingState::add(std::string key, double& value) {
  auto e = value_entry(std::move(key), value, &c10::IValue::isDouble, "");
  e.check = [](const c10::IValue& v) {
    TORCH_CHECK(
        v.isDouble() || v.isInt(), "should be a number, found ", v.tagKind());
  };
  e.load = [&value](const c10::IValue& v) {
    value = v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
  };
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::add(std::string key, bool& value) {
  return impl_->add(
      *this,
      value_entry(std::move(key), value, &c10::IValue::isBool, "a bool"));
}

TrainingState& TrainingState::add(std::string key, std::string& value) {
  auto e =
      value_entry(std::move(key), value, &c10::IValue::isString, "a string");
  e.load = [&value](const c10::IValue& v) { value = v.toStringRef(); };
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::add(std::string key, torch::Tensor& value) {
  detail::TrainingStateEntry e;
  e.key = std::move(key);
  e.save = [&value] {
    return value.defined() ? c10::IValue(detail::host_copy(value))
                           : c10::IValue();
  };
  e.check = [&value](const c10::IValue& v) {
    if (v.isNone()) {
      return;
    }
    TORCH_CHECK(v.isTensor(), "should be a tensor, found ", v.tagKind());
    if (value.defined()) {
      const auto& t = v.toTensor();
      TORCH_CHECK(
          t.sizes() == value.sizes() && t.scalar_type() == value.scalar_type(),
          "has shape ",
          detail::shape_string(t.sizes()),
          " and dtype ",
          t.scalar_type(),
          " in the checkpoint, ",
          detail::shape_string(value.sizes()),
          " and ",
          value.scalar_type(),
          " in the run");
    }
  };
  e.load = [&value](const c10::IValue& v) {
    if (v.isNone()) {
      value = torch::Tensor();
    } else if (value.defined()) {
      torch::NoGradGuard no_grad;
      value.copy_(v.toTensor());
    } else {
      value = v.toTensor();
    }
  };
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::add_stateful(
    std::string key,
    std::function<c10::IValue()> save,
    std::function<void(const c10::impl::GenericDict&)> load) {
  detail::TrainingStateEntry e;
  e.key = std::move(key);
  e.save = std::move(save);
  e.check = [](const c10::IValue& v) {
    TORCH_CHECK(
        v.isGenericDict(), "should be a state dict, found ", v.tagKind());
    to_state_dict(v.toGenericDict());
  };
  e.load = [load = std::move(load)](const c10::IValue& v) {
    load(v.toGenericDict());
  };
  e.may_throw = true;
  return impl_->add(*this, std::move(e));
}

TrainingState& TrainingState::rng(bool enabled) {
  impl_->rng = enabled;
  return *this;
}

bool TrainingState::rng() const {
  return impl_->rng;
}

namespace {

// The devices whose current streams hold this thread's pending host copies
// (only those are waited for: touching another GPU would make a context
// there).
thread_local uint64_t copying_devices = 0;

} // namespace

at::Tensor detail::host_copy(const at::Tensor& t) {
  if (!t.is_cuda()) {
    return t.detach();
  }
  // NOTE: non_blocking D2H copies land in pinned memory from LibTorch's
  // caching host allocator (kept for the next save).
  copying_devices |= uint64_t{1} << (t.device().index() % 64);
  return t.detach().to(at::kCPU, /*non_blocking=*/true);
}

void detail::wait_for_host_copies() {
  const uint64_t devices = copying_devices;
  copying_devices = 0;
#if LAMP_WITH_CUDA
  for (int d = 0; d < 64; ++d) {
    if (devices & (uint64_t{1} << d)) {
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(d))
          .synchronize();
    }
  }
#else
  (void)devices;
#endif
}

c10::impl::GenericDict TrainingState::state_dict() const {
  auto out = new_dict();
  for (const auto& e : impl_->entries) {
    out.insert(e.key, e.save());
  }
  if (impl_->rng) {
    c10::impl::GenericList ranks(c10::AnyType::get());
    ranks.push_back(detail::rng_state());
    out.insert("rng", ranks);
  }
  detail::wait_for_host_copies();
  return out;
}

void TrainingState::load_state_dict(
    const c10::impl::GenericDict& dict,
    int64_t rank) {
  // Phase 1: check everything; nothing has changed yet.
  for (const auto& e : impl_->entries) {
    const auto it = dict.find(e.key);
    if (it == dict.end()) {
      std::ostringstream keys;
      for (const auto& entry : dict) {
        keys << " '" << entry.key().toStringRef() << "'";
      }
      TORCH_CHECK(
          false,
          "missing key '",
          e.key,
          "' (the checkpoint has",
          keys.str(),
          ")");
    }
    with_context("key '" + e.key + "': ", [&] { e.check(it->value()); });
  }
  const bool rng = impl_->rng && dict.contains("rng");
  if (rng) {
    with_context("key 'rng': ", [&] { check_rng(dict.at("rng"), rank); });
  }
  // Phase 2: objects that validate inside their own load first, each backed
  // up so that a failure puts back those already loaded.
  std::vector<std::pair<const detail::TrainingStateEntry*, c10::IValue>> loaded;
  for (const auto& e : impl_->entries) {
    if (!e.may_throw) {
      continue;
    }
    auto backup = e.save();
    try {
      e.load(dict.at(e.key));
    } catch (const c10::Error& error) {
      for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) {
        it->first->load(it->second);
      }
      TORCH_CHECK(false, "key '", e.key, "': ", error.what_without_backtrace());
    }
    loaded.emplace_back(&e, std::move(backup));
  }
  // Phase 3: the rest, checked above, cannot fail.
  for (const auto& e : impl_->entries) {
    if (!e.may_throw) {
      e.load(dict.at(e.key));
    }
  }
  if (rng) {
    load_rng(dict.at("rng"), rank);
  }
}

std::vector<std::string> TrainingState::keys() const {
  std::vector<std::string> out;
  for (const auto& e : impl_->entries) {
    out.push_back(e.key);
  }
  return out;
}

} // namespace lamp
