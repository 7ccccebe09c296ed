#include "python_state.h"

#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lamp::detail {
namespace {

// (name, tensor) in Python's state_dict order.
std::vector<std::pair<std::string, torch::Tensor>> entries(
    const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      out.emplace_back(prefix + p.key(), p.value());
    }
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false)) {
      out.emplace_back(prefix + b.key(), b.value());
    }
  }
  return out;
}

} // namespace

std::string shape_string(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

c10::impl::GenericDict module_state_dict(const torch::nn::Module& module) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  // NOTE: a tensor under two names (a tied weight) is copied once and the
  // copy listed under both, so that the file holds one storage for it and
  // Python's torch.load gives two names for one tensor, as it does for a
  // state_dict saved by Python.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copies;
  for (const auto& [name, tensor] : entries(module)) {
    if (tensor.defined()) {
      auto& copy = copies[tensor.unsafeGetTensorImpl()];
      if (!copy.defined()) {
        copy = host_copy(tensor);
      }
      dict.insert(name, copy);
    }
  }
  return dict;
}

void check_module_state_dict(
    const torch::nn::Module& module,
    const c10::IValue& state) {
  TORCH_CHECK(
      state.isGenericDict(),
      "expected a dict of tensors by name (a module's state_dict), found ",
      state.tagKind());
  const auto dict = state.toGenericDict();
  std::set<std::string> expected;
  for (const auto& [name, tensor] : entries(module)) {
    if (!tensor.defined()) {
      continue;
    }
    expected.insert(name);
    const auto it = dict.find(name);
    TORCH_CHECK(
        it != dict.end(),
        "missing key '",
        name,
        "' (the model has it, the checkpoint does not: another model's "
        "checkpoint?)");
    const auto& value = it->value();
    TORCH_CHECK(
        value.isTensor(),
        "key '",
        name,
        "' holds a ",
        value.tagKind(),
        ", not a tensor");
    const auto& saved = value.toTensor();
    TORCH_CHECK(
        saved.sizes() == tensor.sizes(),
        "key '",
        name,
        "' has shape ",
        shape_string(saved.sizes()),
        " in the checkpoint and ",
        shape_string(tensor.sizes()),
        " in the model");
    TORCH_CHECK(
        saved.scalar_type() == tensor.scalar_type(),
        "key '",
        name,
        "' has dtype ",
        saved.scalar_type(),
        " in the checkpoint and ",
        tensor.scalar_type(),
        " in the model");
  }
  for (const auto& entry : dict) {
    TORCH_CHECK(
        entry.key().isString(),
        "a key of the model's state is not a string: ",
        entry.key());
    const auto& key = entry.key().toStringRef();
    auto ends_with = [&key](const std::string& suffix) {
      return key.size() >= suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool fp8 = ends_with("fp8_amax_history") || ends_with("fp8_scale");
    TORCH_CHECK(
        expected.count(key) == 1,
        "unexpected key '",
        key,
        "' (the checkpoint has it, the model does not: ",
        fp8 ? "the state of delayed FP8 scaling; call lamp::init_fp8_state("
              "model, recipe) before loading"
            : "another model's checkpoint?",
        ")");
  }
}

void load_module_state_dict(
    torch::nn::Module& module,
    const c10::IValue& state) {
  const auto dict = state.toGenericDict();
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : entries(module)) {
    if (tensor.defined()) {
      tensor.copy_(dict.at(name).toTensor());
    }
  }
}

} // namespace lamp::detail
