#include <lamp/cast_weights.h>

#include <lamp/nn/linear.h>

#include "fp32_grad_weights.h"
#include "kept_casts.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <unordered_map>
#include <vector>

namespace lamp {
namespace {

// `from` cast to `dtype`, each tensor keeping its strides, in one
// multi-tensor kernel where the tensors share a device and a dtype (ATen's
// _foreach_copy_ falls back to one copy a tensor otherwise).
//
// NOTE: its fast path wants every tensor dense and each pair with the same
// strides; one gradient that is a view with gaps (a weight padded with
// zero channels by torch::cat gets a slice of the padded one's gradient)
// would send all of them down the slow path, one copy kernel each. Such a
// source is made dense first: one small copy for it alone.
std::vector<at::Tensor> cast_all(at::TensorList from, at::ScalarType dtype) {
  std::vector<at::Tensor> dense;
  std::vector<at::Tensor> to;
  dense.reserve(from.size());
  to.reserve(from.size());
  for (const auto& t : from) {
    dense.push_back(
        t.is_non_overlapping_and_dense()
            ? t
            : t.contiguous(t.suggest_memory_format()));
    to.push_back(at::empty_like(dense.back(), t.options().dtype(dtype)));
  }
  if (!to.empty()) {
    at::_foreach_copy_(to, dense);
  }
  return to;
}

// The casts an optimizer keeps (FusedOptimizer::keep_weight_casts), one a
// parameter, undefined where it keeps none. A struct, so that autograd's
// apply() sees no tensor in it.
struct Kept {
  std::vector<at::Tensor> copies;
  size_t count() const {
    size_t n = 0;
    for (const auto& c : copies) {
      n += c.defined() ? 1 : 0;
    }
    return n;
  }
};

// `params` cast to `dtype`: the kept copy where there is one, the rest cast
// in one kernel.
std::vector<at::Tensor> cast_or_take(
    at::TensorList params,
    at::ScalarType dtype,
    const Kept& kept) {
  if (kept.copies.empty()) {
    return cast_all(params, dtype);
  }
  std::vector<at::Tensor> out(params.size());
  std::vector<at::Tensor> rest;
  std::vector<size_t> where;
  for (size_t i = 0; i < params.size(); ++i) {
    if (kept.copies[i].defined()) {
      // NOTE: a new tensor on the copy's memory and version counter, so
      // that autograd's history goes on it, not on the optimizer's copy,
      // and a step that writes the copy while a graph still holds it shows
      // in the saved tensor's version.
      out[i] = kept.copies[i].detach();
    } else {
      rest.push_back(params[i]);
      where.push_back(i);
    }
  }
  auto cast = cast_all(rest, dtype);
  for (size_t k = 0; k < where.size(); ++k) {
    out[where[k]] = std::move(cast[k]);
  }
  return out;
}

// The parameters' casts as one autograd node: backward casts the gradients
// back to fp32 together, as ToCopyBackward would one at a time.
class CastAll : public torch::autograd::Function<CastAll> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      at::TensorList params,
      at::ScalarType dtype,
      const Kept& kept) {
    // NOTE: an unused output's gradient stays undefined (not zeros), so its
    // parameter gets none, as under autocast's own casts.
    ctx->set_materialize_grads(false);
    return cast_or_take(params, dtype, kept);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* /*ctx*/,
      torch::autograd::variable_list grads) {
    // One gradient a parameter, then none for the dtype and kept
    // arguments.
    torch::autograd::variable_list out(grads.size() + 2);
    if (at::GradMode::is_enabled()) {
      // NOTE: backward with create_graph=true: differentiable casts, so that
      // a double backward sees them.
      for (size_t i = 0; i < grads.size(); ++i) {
        if (grads[i].defined()) {
          out[i] = grads[i].to(at::kFloat);
        }
      }
      return out;
    }
    std::vector<size_t> where;
    std::vector<at::Tensor> defined;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) {
        where.push_back(i);
        defined.push_back(grads[i]);
      }
    }
    auto cast = cast_all(defined, at::kFloat);
    for (size_t k = 0; k < where.size(); ++k) {
      out[where[k]] = std::move(cast[k]);
    }
    return out;
  }
};

// The weight and bias members of the module kinds whose ops autocast runs
// in the lower precision (none for other modules).
std::vector<at::Tensor*> cast_members(torch::nn::Module& m) {
  // NOTE: the conv modules keep weight and bias in ConvNdImpl<D, Derived>,
  // a different base for each concrete type.
  if (auto* c = dynamic_cast<torch::nn::Conv2dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<lamp::nn::LinearImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::Conv1dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::Conv3dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::ConvTranspose1dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::ConvTranspose2dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  if (auto* c = dynamic_cast<torch::nn::ConvTranspose3dImpl*>(&m)) {
    return {&c->weight, &c->bias};
  }
  return {};
}

} // namespace

struct CastWeightsGuard::Impl {
  struct Swap {
    at::Tensor* member;
    at::Tensor original;
  };
  std::vector<Swap> swaps;
  // The casts registered for fp32 weight gradients (fp32_grad_weights.h).
  std::vector<at::Tensor> fp32_grad_casts;
  size_t cast = 0;
  size_t kept = 0; // of `cast`, taken from an optimizer's kept copies
};

CastWeightsGuard::CastWeightsGuard(
    torch::nn::Module& model,
    c10::DeviceType device_type,
    CastWeightsOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!at::autocast::is_autocast_enabled(device_type)) {
    return;
  }
  const auto dtype = at::autocast::get_autocast_dtype(device_type);
  // Distinct parameters (a tensor shared by two modules is cast once), in
  // two lists: those autograd records, and the rest.
  std::vector<at::Tensor> tracked;
  std::vector<at::Tensor> untracked;
  // Per member: which list, and where in it.
  std::vector<std::pair<bool, size_t>> place;
  // Per tracked parameter: whether some module reads it as its weight.
  std::vector<bool> tracked_weight;
  std::unordered_map<const c10::TensorImpl*, std::pair<bool, size_t>> seen;
  const bool grad_mode = at::GradMode::is_enabled();
  for (const auto& module : model.modules(/*include_self=*/true)) {
    const auto members = cast_members(*module);
    for (size_t j = 0; j < members.size(); ++j) {
      at::Tensor* member = members[j];
      const at::Tensor& t = *member;
      if (!t.defined() || t.scalar_type() != at::kFloat ||
          t.device().type() != device_type) {
        continue;
      }
      auto [it, fresh] = seen.try_emplace(t.unsafeGetTensorImpl());
      if (fresh) {
        const bool track = grad_mode && t.requires_grad();
        auto& list = track ? tracked : untracked;
        it->second = {track, list.size()};
        list.push_back(t);
        if (track) {
          tracked_weight.push_back(false);
        }
      }
      if (it->second.first && j == 0) { // cast_members: weight first
        tracked_weight[it->second.second] = true;
      }
      impl_->swaps.push_back({member, t});
      place.push_back(it->second);
    }
  }
  std::vector<at::Tensor> tracked_casts;
  if (!tracked.empty()) {
    // NOTE: a TensorList, so that autograd sees each parameter as an input
    // (a std::vector argument would be opaque to it).
    Kept kept{detail::take_kept_casts(tracked, dtype)};
    impl_->kept += kept.count();
    tracked_casts = CastAll::apply(at::TensorList(tracked), dtype, kept);
  }
  std::vector<at::Tensor> untracked_casts;
  {
    const at::NoGradGuard no_grad;
    Kept kept{detail::take_kept_casts(untracked, dtype)};
    impl_->kept += kept.count();
    untracked_casts = cast_or_take(untracked, dtype, kept);
  }
  for (size_t i = 0; i < impl_->swaps.size(); ++i) {
    const auto [track, k] = place[i];
    *impl_->swaps[i].member = track ? tracked_casts[k] : untracked_casts[k];
  }
  impl_->cast = tracked.size() + untracked.size();
  if (options.fp32_weight_grads()) {
    // NOTE: last, so that a throw above leaves nothing registered (no
    // destructor runs then).
    std::vector<at::Tensor> params;
    for (size_t k = 0; k < tracked.size(); ++k) {
      if (tracked_weight[k]) {
        impl_->fp32_grad_casts.push_back(tracked_casts[k]);
        params.push_back(tracked[k]);
      }
    }
    detail::register_fp32_grad_weights(impl_->fp32_grad_casts, params);
  }
}

CastWeightsGuard::~CastWeightsGuard() {
  detail::unregister_fp32_grad_weights(impl_->fp32_grad_casts);
  for (auto& swap : impl_->swaps) {
    *swap.member = std::move(swap.original);
  }
}

size_t CastWeightsGuard::size() const {
  return impl_->cast;
}

size_t CastWeightsGuard::kept() const {
  return impl_->kept;
}

} // namespace lamp
