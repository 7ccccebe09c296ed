// FusedOptimizer::keep_weight_casts: the 16-bit copies a step writes for
// CastWeightsGuard (Note [Kept weight casts], src/amp/kept_casts.cpp).

#include <lamp/optim.h>

#include "../amp/kept_casts.h"

#include <c10/util/Exception.h>

namespace lamp::optim {

void FusedOptimizer::keep_weight_casts(c10::ScalarType dtype) {
  TORCH_CHECK_VALUE(
      dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
      "lamp::optim::FusedOptimizer::keep_weight_casts: dtype must be "
      "torch::kBFloat16 or torch::kHalf (the autocast dtype whose casts to "
      "keep), or torch::kFloat to keep none; got ",
      dtype,
      ".");
  // NOTE: new entries (copies made again at the next guard) also when the
  // dtype is unchanged: the way to tell the optimizer that weights were
  // changed behind their version counters.
  kept_.clear();
  kept_dtype_ = dtype;
  try {
    update_kept_casts();
  } catch (...) {
    // Refused (a parameter kept by another optimizer): keep none.
    kept_.clear();
    kept_dtype_ = at::kFloat;
    throw;
  }
}

void FusedOptimizer::update_kept_casts() {
  if (kept_dtype_ == at::kFloat) {
    return;
  }
  lamp::detail::KeptCasts added;
  for (const auto& group : param_groups()) {
    for (const auto& param : group.params()) {
      if (param.scalar_type() != at::kFloat ||
          kept_.count(param.unsafeGetTensorImpl()) != 0) {
        continue;
      }
      added.push_back(
          std::make_shared<lamp::detail::KeptCast>(param, kept_dtype_));
    }
  }
  lamp::detail::register_kept_casts(added);
  for (auto& e : added) {
    kept_.emplace(e->param.unsafeGetTensorImpl(), std::move(e));
  }
}

std::vector<std::shared_ptr<lamp::detail::KeptCast>> FusedOptimizer::
    kept_casts_in_use() const {
  std::vector<std::shared_ptr<lamp::detail::KeptCast>> out;
  for (const auto& [impl, e] : kept_) {
    if (e->copy.defined()) {
      out.push_back(e);
    }
  }
  return out;
}

std::vector<torch::Tensor> FusedOptimizer::kept_copies(
    const std::vector<torch::Tensor>& params) const {
  std::vector<torch::Tensor> out;
  if (kept_.empty()) {
    return out;
  }
  out.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = kept_.find(params[i].unsafeGetTensorImpl());
    if (it != kept_.end()) {
      out[i] = it->second->copy; // undefined until a guard made it
    }
  }
  return out;
}

void FusedOptimizer::finish_kept_copies(
    const std::vector<torch::Tensor>& params,
    const std::vector<torch::Tensor>& copies,
    bool written) {
  if (copies.empty()) {
    return;
  }
  std::vector<lamp::detail::KeptCast*> stepped;
  for (size_t i = 0; i < params.size(); ++i) {
    if (copies[i].defined()) {
      stepped.push_back(kept_.at(params[i].unsafeGetTensorImpl()).get());
    }
  }
  if (written) {
    for (auto* e : stepped) {
      e->mark_written();
    }
  } else {
    lamp::detail::write_kept_casts(stepped);
  }
}

} // namespace lamp::optim
