#include "fused_clip_grad.h"

#include <lamp/config.h>

#include <c10/core/ScalarType.h>

#if LAMP_WITH_CUDA
#include "clip_grad_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace lamp::detail {

std::optional<at::Tensor> fused_clip_grad_norm_(
    const std::vector<at::Tensor>& grads,
    double max_norm) {
#if LAMP_WITH_CUDA
  if (grads.empty() || grads.size() > ClipList::kMax ||
      !grads.front().is_cuda()) {
    return std::nullopt;
  }
  const auto device = grads.front().device();
  ClipList list;
  auto dtype = grads.front().scalar_type();
  for (const auto& g : grads) {
    const auto t = g.scalar_type();
    if (g.device() != device || g.layout() != at::kStrided ||
        !g.is_non_overlapping_and_dense() ||
        (t != at::kFloat && t != at::kHalf && t != at::kBFloat16)) {
      return std::nullopt;
    }
    // Python stacks the per-group norms: their dtypes promote.
    dtype = c10::promoteTypes(dtype, t);
    if (g.numel() == 0) {
      continue;
    }
    list.data[list.count] = g.data_ptr();
    list.bytes[list.count] = g.numel() * g.element_size();
    list.format[list.count] = t == at::kFloat ? ClipFormat::kFloat
        : t == at::kHalf                      ? ClipFormat::kHalf
                                              : ClipFormat::kBFloat16;
    ++list.count;
  }
  const c10::cuda::CUDAGuard on_device(device);
  auto norm = at::empty({}, grads.front().options().dtype(dtype));
  if (list.count == 0) {
    return norm.zero_(); // every gradient is empty: norm 0, nothing to scale
  }
  auto partials = at::empty(
      {clip_grad_norm_blocks(list)}, norm.options().dtype(at::kFloat));
  const ClipFormat norm_format = dtype == at::kFloat ? ClipFormat::kFloat
      : dtype == at::kHalf                           ? ClipFormat::kHalf
                                                     : ClipFormat::kBFloat16;
  C10_CUDA_CHECK(launch_clip_grad_norm(
      list,
      max_norm,
      norm.data_ptr(),
      norm_format,
      partials.mutable_data_ptr<float>(),
      at::cuda::getCurrentCUDAStream()));
  return norm;
#else
  (void)grads;
  (void)max_norm;
  return std::nullopt;
#endif
}

} // namespace lamp::detail
