#include "non_finite_check.h"

#include <lamp/config.h>

#if LAMP_WITH_CUDA
#include "non_finite_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>

namespace lamp::detail {

std::vector<at::Tensor> check_non_finite(
    const std::vector<at::Tensor>& grads,
    const at::Tensor& found_inf) {
#if LAMP_WITH_CUDA
  if (grads.empty() || !found_inf.is_cuda() ||
      found_inf.scalar_type() != at::kFloat || found_inf.numel() != 1) {
    return grads;
  }
  std::vector<at::Tensor> rest;
  // One list a format; a launch whenever one fills up.
  NonFiniteList lists[2];
  const c10::cuda::CUDAGuard on_device(found_inf.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](FloatFormat format) {
    auto& list = lists[static_cast<int>(format)];
    C10_CUDA_CHECK(launch_non_finite_check(
        format, list, found_inf.mutable_data_ptr<float>(), stream));
    list.count = 0;
  };
  for (const auto& g : grads) {
    const auto dtype = g.scalar_type();
    if (g.is_sparse() || g.device() != found_inf.device() ||
        (dtype != at::kFloat && dtype != at::kHalf) ||
        !g.is_non_overlapping_and_dense()) {
      rest.push_back(g);
      continue;
    }
    if (g.numel() == 0) {
      continue;
    }
    const auto format =
        dtype == at::kHalf ? FloatFormat::kHalf : FloatFormat::kFloat;
    auto& list = lists[static_cast<int>(format)];
    // Dense: the elements fill [data, data + numel * itemsize) in some
    // order (strides are never negative).
    list.data[list.count] = g.const_data_ptr();
    list.bytes[list.count] = g.numel() * g.element_size();
    if (++list.count == NonFiniteList::kMax) {
      launch(format);
    }
  }
  for (auto format : {FloatFormat::kFloat, FloatFormat::kHalf}) {
    if (lists[static_cast<int>(format)].count > 0) {
      launch(format);
    }
  }
  return rest;
#else
  (void)found_inf;
  return grads;
#endif
}

} // namespace lamp::detail
