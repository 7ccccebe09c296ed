#include "kept_casts.h"

#include <ATen/ATen.h>
#include <ATen/ops/_foreach_copy.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

namespace lamp::detail {
namespace {

// Note [Kept weight casts]
// Under autocast every step casts each fp32 weight to 16 bits (one kernel
// for all of them under CastWeightsGuard): a read of 4 bytes and a write of
// 2 a parameter, after the optimizer has just read and written the same
// fp32 values. A fused optimizer that keeps weight casts writes the 16-bit
// copy in its own kernel as it writes the parameter, and the guard takes
// the copy instead of casting (Transformer Engine's and apex's fused Adam
// write their 16-bit model weights from fp32 masters the same way).
//
// A copy is used only while it holds its parameter's values: it records the
// parameter's storage and version counter when written, and every in-place
// op bumps the counter (lamp's fused optimizers and GraphedStep's replays
// bump it for their kernels, src/optim/bump_versions.h). A stale copy is
// written again where a guard takes it, or before a GraphedStep replay
// whose graph reads it. What the counter cannot see: values written behind
// it (through `.data()`, or a kernel of the user's own).
//
// Threads: guards run on the caller's thread and, for an activation
// checkpoint's recompute, on autograd's device threads while the caller
// waits in backward(); the registry's map is behind a mutex. An entry's
// fields are written by the guard that takes it (under the mutex) and by
// the optimizer's step and GraphedStep's replay, which never run at the
// same time as a guard of the same step.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<KeptCast>> map;
};

Registry& registry() {
  static Registry r;
  return r;
}

} // namespace

void write_kept_casts(const std::vector<KeptCast*>& stale) {
  if (stale.empty()) {
    return;
  }
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> copies, params;
  copies.reserve(stale.size());
  params.reserve(stale.size());
  for (auto* e : stale) {
    copies.push_back(e->copy);
    params.push_back(e->param);
  }
  at::_foreach_copy_(copies, params);
  for (auto* e : stale) {
    e->mark_written();
  }
}

bool KeptCast::current() const {
  return copy.defined() && param.data_ptr() == data &&
      param._version() == version;
}

void KeptCast::mark_written() {
  data = param.data_ptr();
  version = param._version();
  copy.unsafeGetTensorImpl()->bump_version();
}

void register_kept_casts(const KeptCasts& casts) {
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.map.begin(); it != r.map.end();) {
    it = it->second.expired() ? r.map.erase(it) : std::next(it);
  }
  // NOTE: all checked before any is added: a refused call registers none.
  for (const auto& e : casts) {
    const auto it = r.map.find(e->param.unsafeGetTensorImpl());
    const auto other =
        it == r.map.end() ? std::shared_ptr<KeptCast>() : it->second.lock();
    TORCH_CHECK(
        !other || other == e,
        "lamp::optim::FusedOptimizer::keep_weight_casts: a parameter of "
        "shape ",
        e->param.sizes(),
        " already has its weight cast kept by another optimizer. Keep each "
        "parameter's cast in one optimizer.");
  }
  for (const auto& e : casts) {
    r.map[e->param.unsafeGetTensorImpl()] = e;
  }
}

std::vector<at::Tensor> take_kept_casts(
    at::TensorList params,
    at::ScalarType dtype) {
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  if (r.map.empty()) {
    return {};
  }
  std::vector<at::Tensor> out(params.size());
  std::vector<KeptCast*> stale;
  std::vector<std::shared_ptr<KeptCast>> held; // alive until written
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = r.map.find(params[i].unsafeGetTensorImpl());
    if (it == r.map.end()) {
      continue;
    }
    auto e = it->second.lock();
    if (!e) {
      r.map.erase(it);
      continue;
    }
    if (e->dtype != dtype) {
      continue;
    }
    if (!e->copy.defined()) {
      // NOTE: laid out as the parameter, so that the optimizer's kernel
      // walks both as flat arrays in the same order.
      e->copy = at::empty_like(
          e->param,
          e->param.options().dtype(dtype),
          at::MemoryFormat::Preserve);
    }
    if (!e->current()) {
      stale.push_back(e.get());
    }
    out[i] = e->copy;
    held.push_back(std::move(e));
  }
  write_kept_casts(stale);
  if (held.empty()) {
    return {};
  }
  return out;
}

void refresh_kept_casts(const KeptCasts& casts) {
  std::vector<KeptCast*> stale;
  for (const auto& e : casts) {
    if (e->copy.defined() && !e->current()) {
      stale.push_back(e.get());
    }
  }
  write_kept_casts(stale);
}

} // namespace lamp::detail
