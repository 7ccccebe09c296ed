#include "unique_params.h"

#include <c10/util/Exception.h>

#include <unordered_map>
#include <unordered_set>

namespace lamp::detail {
namespace {

// Calls keep(g, t) for the first listing of each tensor in `groups` (g: the
// group, t: the tensor), warning for a repeat in one group and throwing for
// a tensor in two.
template <typename Keep>
void each_first(
    const std::vector<torch::optim::OptimizerParamGroup>& groups,
    const char* who,
    const Keep& keep) {
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& t : groups[g].params()) {
      if (!t.defined()) {
        keep(g, t);
        continue;
      }
      const auto [it, first] = group_of.emplace(t.unsafeGetTensorImpl(), g);
      if (first) {
        keep(g, t);
        continue;
      }
      TORCH_CHECK_VALUE(
          it->second == g,
          who,
          ": a tensor of shape ",
          t.sizes(),
          " is in param groups ",
          it->second,
          " and ",
          g,
          "; a parameter belongs to one group (a weight shared by two "
          "modules is one parameter: put it in one group).");
      TORCH_WARN_ONCE(
          who,
          ": param group ",
          g,
          " lists a tensor of shape ",
          t.sizes(),
          " more than once (a weight shared by two modules: LibTorch's "
          "parameters() lists it once per name); lamp treats it as one "
          "parameter, as Python's parameters() does.");
    }
  }
}

} // namespace

std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& t : tensors) {
    if (!t.defined() || seen.insert(t.unsafeGetTensorImpl()).second) {
      out.push_back(t);
    }
  }
  return out;
}

std::vector<std::vector<at::Tensor>> unique_group_params(
    const torch::optim::Optimizer& optimizer,
    const char* who) {
  const auto& groups = optimizer.param_groups();
  std::vector<std::vector<at::Tensor>> out(groups.size());
  each_first(
      groups, who, [&](size_t g, const at::Tensor& t) { out[g].push_back(t); });
  return out;
}

std::vector<torch::optim::OptimizerParamGroup> unique_param_groups(
    const std::vector<torch::optim::OptimizerParamGroup>& groups,
    const char* who) {
  std::vector<std::vector<at::Tensor>> params(groups.size());
  each_first(groups, who, [&](size_t g, const at::Tensor& t) {
    params[g].push_back(t);
  });
  std::vector<torch::optim::OptimizerParamGroup> out;
  out.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].has_options()) {
      out.emplace_back(std::move(params[g]), groups[g].options().clone());
    } else {
      out.emplace_back(std::move(params[g]));
    }
  }
  return out;
}

} // namespace lamp::detail
