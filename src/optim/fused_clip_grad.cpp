#include "fused_clip_grad.h"

#include <lamp/config.h>

#include <c10/core/ScalarType.h>

#include <utility>

#if LAMP_WITH_CUDA
#include "clip_grad_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/intrusive_ptr.h>
#endif

// Note [Sums kept from the unscale]
// A clipped AMP step reads every gradient three times before the optimizer:
// GradScaler's unscale (read, write), the clip's sums of squares (read),
// the clip's scaling (read, write). unscale_keeping_sums() computes the sums
// in the unscale's kernel, block by block exactly as the clip's first
// kernel would (same blocks, same order: bitwise the same partial sums),
// and keeps them with what they were computed from: the gradients'
// TensorImpls (weakly), data pointers, sizes and version counters after
// the unscale, and the stream. fused_clip_grad_norm_ uses them only if its
// gradients are exactly those, in the same order, unchanged since (each
// one's version the same: an in-place op on a gradient, or a new gradient
// tensor, makes it compute the sums itself), on the same stream; then the
// clip is its second kernel alone. Kept sums serve one clip and are
// dropped by it either way. They are thread-local: unscale_ and the clip
// of a step run on one thread (GraphedStep captures on the caller's).
// A write to a gradient through its raw data pointer is not seen; none of
// lamp's or LibTorch's ops does that between an unscale and a clip.

namespace lamp::detail {

#if LAMP_WITH_CUDA
namespace {

// Gradients as the kernels take them: lists of at most ClipList::kMax.
struct ClipLists {
  std::vector<ClipList> lists;

  void add(void* data, int64_t bytes, ClipFormat format) {
    if (lists.empty() || lists.back().count == ClipList::kMax) {
      lists.emplace_back();
    }
    auto& l = lists.back();
    l.data[l.count] = data;
    l.bytes[l.count] = bytes;
    l.format[l.count] = format;
    ++l.count;
  }
  bool empty() const {
    return lists.empty();
  }
  int count() const {
    return static_cast<int>(lists.size());
  }
  int64_t blocks() const {
    return clip_grad_norm_blocks(lists.data(), count());
  }
};

struct KeptSums {
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> impls;
  std::vector<int64_t> versions;
  ClipLists lists; // data, bytes and formats as the clip would list them
  at::Tensor partials;
  cudaStream_t stream = nullptr;
};

thread_local std::optional<KeptSums> kept;
thread_local int64_t clips_from_kept = 0;

ClipFormat format_of(at::ScalarType t) {
  return t == at::kFloat ? ClipFormat::kFloat
      : t == at::kHalf   ? ClipFormat::kHalf
                         : ClipFormat::kBFloat16;
}

// Whether `grads` (listed as `lists`) are exactly what `k` was kept from.
bool same_as_kept(
    const KeptSums& k,
    const std::vector<at::Tensor>& grads,
    const ClipLists& lists,
    cudaStream_t stream) {
  if (k.stream != stream || k.lists.count() != lists.count()) {
    return false;
  }
  for (int l = 0; l < lists.count(); ++l) {
    const auto& a = k.lists.lists[l];
    const auto& b = lists.lists[l];
    if (a.count != b.count) {
      return false;
    }
    for (int t = 0; t < a.count; ++t) {
      if (a.data[t] != b.data[t] || a.bytes[t] != b.bytes[t] ||
          a.format[t] != b.format[t]) {
        return false;
      }
    }
  }
  size_t t = 0;
  for (const auto& g : grads) {
    if (g.numel() == 0) {
      continue;
    }
    if (t == k.impls.size() ||
        k.impls[t].lock().get() != g.unsafeGetTensorImpl() ||
        k.versions[t] != g._version()) {
      return false;
    }
    ++t;
  }
  return t == k.impls.size();
}

} // namespace
#endif

bool unscale_keeping_sums(
    const std::vector<at::Tensor>& grads,
    const at::Tensor& found_inf,
    const at::Tensor& inv_scale) {
#if LAMP_WITH_CUDA
  kept.reset();
  if (grads.empty() || !grads.front().is_cuda()) {
    return false;
  }
  const auto device = grads.front().device();
  const auto dtype = grads.front().scalar_type();
  if ((dtype != at::kFloat && dtype != at::kHalf) ||
      found_inf.device() != device || inv_scale.device() != device ||
      found_inf.scalar_type() != at::kFloat ||
      inv_scale.scalar_type() != at::kFloat || found_inf.numel() != 1 ||
      inv_scale.numel() != 1 || !found_inf.is_contiguous() ||
      !inv_scale.is_contiguous()) {
    return false;
  }
  KeptSums k;
  for (const auto& g : grads) {
    if (g.device() != device || g.scalar_type() != dtype ||
        g.layout() != at::kStrided || !g.is_non_overlapping_and_dense() ||
        g.is_inference()) {
      return false;
    }
    if (g.numel() == 0) {
      continue;
    }
    k.lists.add(g.data_ptr(), g.numel() * g.element_size(), format_of(dtype));
  }
  if (k.lists.empty()) {
    return false; // nothing to unscale: ATen's kernel does nothing either
  }
  const c10::cuda::CUDAGuard on_device(device);
  k.stream = at::cuda::getCurrentCUDAStream();
  k.partials =
      at::empty({k.lists.blocks()}, found_inf.options().dtype(at::kFloat));
  C10_CUDA_CHECK(launch_unscale_sum_squares(
      k.lists.lists.data(),
      k.lists.count(),
      inv_scale.const_data_ptr<float>(),
      found_inf.mutable_data_ptr<float>(),
      k.partials.mutable_data_ptr<float>(),
      k.stream));
  // An in-place write, as ATen's op is: the gradients' versions move on.
  for (const auto& g : grads) {
    if (g.numel() == 0) {
      continue;
    }
    g.unsafeGetTensorImpl()->bump_version();
    k.impls.emplace_back(g.getIntrusivePtr());
    k.versions.push_back(g._version());
  }
  kept = std::move(k);
  return true;
#else
  (void)grads;
  (void)found_inf;
  (void)inv_scale;
  return false;
#endif
}

int64_t clips_from_kept_sums() {
#if LAMP_WITH_CUDA
  return clips_from_kept;
#else
  return 0;
#endif
}

#if LAMP_WITH_CUDA
namespace {

// The gradients as the kernels list them, and the norm's dtype (their
// promoted one: Python stacks the per-group norms); nullopt where the
// kernels do not apply (not all on one CUDA device, not dense, another
// dtype).
struct Listed {
  ClipLists lists;
  at::ScalarType dtype;
};

std::optional<Listed> list_grads(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || !grads.front().is_cuda()) {
    return std::nullopt;
  }
  const auto device = grads.front().device();
  Listed out{{}, grads.front().scalar_type()};
  for (const auto& g : grads) {
    const auto t = g.scalar_type();
    if (g.device() != device || g.layout() != at::kStrided ||
        !g.is_non_overlapping_and_dense() ||
        (t != at::kFloat && t != at::kHalf && t != at::kBFloat16)) {
      return std::nullopt;
    }
    out.dtype = c10::promoteTypes(out.dtype, t);
    if (g.numel() == 0) {
      continue;
    }
    out.lists.add(g.data_ptr(), g.numel() * g.element_size(), format_of(t));
  }
  return out;
}

// Both clips' start: the kept sums taken (they serve this clip or none,
// Note [Sums kept from the unscale]) and the gradients listed.
std::pair<std::optional<KeptSums>, std::optional<Listed>> take_kept_and_list(
    const std::vector<at::Tensor>& grads) {
  std::optional<KeptSums> sums = std::move(kept);
  kept.reset();
  return {std::move(sums), list_grads(grads)};
}

} // namespace
#endif

std::optional<at::Tensor> fused_clip_grad_norm_(
    const std::vector<at::Tensor>& grads,
    double max_norm) {
#if LAMP_WITH_CUDA
  auto [sums, listed] = take_kept_and_list(grads);
  if (!listed) {
    return std::nullopt;
  }
  auto& lists = listed->lists;
  const c10::cuda::CUDAGuard on_device(grads.front().device());
  auto norm = at::empty({}, grads.front().options().dtype(listed->dtype));
  if (lists.empty()) {
    return norm.zero_(); // every gradient is empty: norm 0, nothing to scale
  }
  const ClipFormat norm_format = format_of(listed->dtype);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (sums && same_as_kept(*sums, grads, lists, stream)) {
    C10_CUDA_CHECK(launch_clip_scale(
        lists.lists.data(),
        lists.count(),
        max_norm,
        norm.data_ptr(),
        norm_format,
        sums->partials.const_data_ptr<float>(),
        stream));
    ++clips_from_kept;
    return norm;
  }
  auto partials = at::empty({lists.blocks()}, norm.options().dtype(at::kFloat));
  C10_CUDA_CHECK(launch_clip_grad_norm(
      lists.lists.data(),
      lists.count(),
      max_norm,
      norm.data_ptr(),
      norm_format,
      partials.mutable_data_ptr<float>(),
      stream));
  return norm;
#else
  (void)grads;
  (void)max_norm;
  return std::nullopt;
#endif
}

std::optional<NormDivisor> fused_clip_norm_divisor(
    const std::vector<at::Tensor>& grads,
    double max_norm) {
#if LAMP_WITH_CUDA
  auto [sums, listed] = take_kept_and_list(grads);
  if (!listed || listed->lists.empty()) {
    return std::nullopt;
  }
  auto& lists = listed->lists;
  const c10::cuda::CUDAGuard on_device(grads.front().device());
  const auto options = grads.front().options();
  NormDivisor out{
      at::empty({}, options.dtype(listed->dtype)),
      at::empty({}, options.dtype(at::kFloat))};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor partials;
  const float* kept_partials = nullptr;
  if (sums && same_as_kept(*sums, grads, lists, stream)) {
    kept_partials = sums->partials.const_data_ptr<float>();
    ++clips_from_kept;
  } else {
    partials = at::empty({lists.blocks()}, options.dtype(at::kFloat));
  }
  C10_CUDA_CHECK(launch_clip_norm_divisor(
      lists.lists.data(),
      lists.count(),
      max_norm,
      out.norm.data_ptr(),
      format_of(listed->dtype),
      out.divisor.mutable_data_ptr<float>(),
      partials.defined() ? partials.mutable_data_ptr<float>() : nullptr,
      kept_partials,
      stream));
  return out;
#else
  (void)grads;
  (void)max_norm;
  return std::nullopt;
#endif
}

} // namespace lamp::detail
