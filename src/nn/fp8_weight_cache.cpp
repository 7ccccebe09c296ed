#include "fp8_weight_cache.h"

#include <lamp/config.h>

#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>

namespace lamp::nn::detail {
namespace {

// Note [FP8 weight cache]
// A weight's FP8 copies (row-major for the forward GEMM, transposed for the
// input gradient's) depend only on its values and its scale, so within one
// FP8 scope a weight used again -- the next micro-batch of a step, the
// recompute of an activation checkpoint, a second layer tied to it -- reuses
// them (Transformer Engine caches its weights' FP8 copies across the
// micro-batches of a step too). A copy is kept per thread (scopes are
// thread-local) and dropped when FP8 is switched off on the thread, and it
// is used again only if nothing can have changed the weight since:
// - the same tensor (a weak reference, so that a freed weight's address
//   taken by a new one is not mistaken for it), the same storage (`set_data`
//   and `Module::to` swap it) and dtype, and the same version: every
//   in-place op bumps it, and so do lamp's fused optimizers and each
//   `GraphedStep` replay, which change the weights in kernels that do not;
// - the same CUDA graph capture, or none: a copy made outside a capture is
//   not in the graph, so a graph that used it would replay stale bytes; a
//   copy made inside one lives in the graph's memory and is not reused
//   outside it;
// - under delayed scaling, the same layer's scales (two layers tied to one
//   weight each cast it with their own scale).
// What it cannot see: values written behind the version counter (through
// `.data()`, or a kernel of the user's own on the weight's memory) while a
// scope is open.

using WeakImpl =
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct CopyKey {
  const c10::TensorImpl* weight;
  const c10::TensorImpl* scale;
  bool operator==(const CopyKey& o) const {
    return weight == o.weight && scale == o.scale;
  }
};

struct CopyKeyHash {
  size_t operator()(const CopyKey& k) const {
    const auto a = std::hash<const void*>()(k.weight);
    return a ^
        (std::hash<const void*>()(k.scale) + 0x9e3779b97f4a7c15ULL + (a << 6) +
         (a >> 2));
  }
};

// Where the current stream of `t`'s device is in a CUDA graph capture: 0
// outside one, else the capture's id plus one.
uint64_t capture_of_stream(const at::Tensor& t) {
#if LAMP_WITH_CUDA
  if (t.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    C10_CUDA_CHECK(cudaStreamGetCaptureInfo(
        c10::cuda::getCurrentCUDAStream(t.device().index()).stream(),
        &status,
        &id));
    return status == cudaStreamCaptureStatusNone ? 0 : id + 1;
  }
#endif
  (void)t;
  return 0;
}

struct CopyEntry {
  CopyEntry(WeakImpl weight_, std::optional<WeakImpl> scale_)
      : weight(std::move(weight_)), scale(std::move(scale_)) {}
  WeakImpl weight;
  std::optional<WeakImpl> scale; // delayed scaling's
  const void* data = nullptr;
  at::ScalarType dtype = at::kFloat;
  int64_t version = 0;
  uint64_t capture = 0;
  Fp8WeightCopy copy;
};

using CopyCache = std::unordered_map<CopyKey, CopyEntry, CopyKeyHash>;

CopyCache& copy_cache() {
  thread_local CopyCache c;
  return c;
}

CopyKey copy_key_of(const at::Tensor& weight, const at::Tensor& scale) {
  return {
      weight.unsafeGetTensorImpl(),
      scale.defined() ? scale.unsafeGetTensorImpl() : nullptr};
}

} // namespace

const Fp8WeightCopy* fp8_cached_weight(
    const at::Tensor& weight,
    const at::Tensor& scale) {
  auto& c = copy_cache();
  const auto it = c.find(copy_key_of(weight, scale));
  if (it == c.end()) {
    return nullptr;
  }
  const CopyEntry& e = it->second;
  // NOTE: the same address may be a new tensor once the old one is freed:
  // the weak references must still lead to these tensors.
  const bool same = e.weight.lock().get() == weight.unsafeGetTensorImpl() &&
      (!scale.defined() ||
       (e.scale && e.scale->lock().get() == scale.unsafeGetTensorImpl())) &&
      e.data == weight.data_ptr() && e.dtype == weight.scalar_type() &&
      e.version == weight._version() && e.capture == capture_of_stream(weight);
  return same ? &e.copy : nullptr;
}

void fp8_cache_weight(
    const at::Tensor& weight,
    const at::Tensor& scale,
    Fp8WeightCopy copy) {
  if (!weight.is_leaf()) {
    return;
  }
  auto& c = copy_cache();
  // NOTE: a scope left open over many steps meets weights that are gone
  // (a model rebuilt, a test's temporaries): their copies go now.
  for (auto it = c.begin(); it != c.end();) {
    it = it->second.weight.expired() ? c.erase(it) : std::next(it);
  }
  CopyEntry e(
      WeakImpl(weight.getIntrusivePtr()),
      scale.defined() ? std::optional<WeakImpl>(scale.getIntrusivePtr())
                      : std::nullopt);
  e.data = weight.data_ptr();
  e.dtype = weight.scalar_type();
  e.version = weight._version();
  e.capture = capture_of_stream(weight);
  e.copy = std::move(copy);
  c.insert_or_assign(copy_key_of(weight, scale), std::move(e));
}

void fp8_keep_weight_amaxes(const at::Tensor& history) {
  for (auto& [key, e] : copy_cache()) {
    auto& copy = e.copy;
    if (copy.history.defined() && !copy.amax.defined() &&
        copy.history.unsafeGetTensorImpl() == history.unsafeGetTensorImpl()) {
      copy.amax = history.select(0, 1).select(0, 0).clone();
    }
  }
}

bool fp8_cached_bias_holds(
    const Fp8WeightCopy& copy,
    const at::Tensor& bias,
    at::ScalarType dtype) {
  return copy.cast.bias16.defined() && copy.bias.defined() &&
      copy.cast.bias16.scalar_type() == dtype &&
      copy.bias.unsafeGetTensorImpl() == bias.unsafeGetTensorImpl() &&
      copy.bias.data_ptr() == bias.data_ptr() &&
      copy.bias_version == bias._version();
}

void fp8_clear_weight_cache() {
  copy_cache().clear();
}

} // namespace lamp::nn::detail
