#include "embedding_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "embedding_kernel.h"

namespace lamp::nn::detail {

bool embedding_backward_cuda_applies(const at::Tensor& grad_out) {
  const auto dtype = grad_out.scalar_type();
  return grad_out.is_cuda() &&
      (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16);
}

void embedding_backward_cuda(
    const at::Tensor& grad_out,
    const at::Tensor& indices,
    const at::Tensor& grad_weight,
    int64_t padding_idx,
    bool add) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  TORCH_INTERNAL_ASSERT(
      grad_out.is_contiguous() && grad_weight.is_contiguous() &&
      grad_out.scalar_type() == grad_weight.scalar_type() &&
      indices.scalar_type() == at::kLong && indices.dim() == 1 &&
      grad_out.size(0) == indices.numel());
  // NOTE: stable, so each index's rows keep the order of the lookups: the
  // order ATen's radix sort of (index, position) pairs gives.
  const auto [sorted, order] =
      at::sort(indices, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  EmbeddingBackwardArgs a;
  switch (grad_out.scalar_type()) {
    case at::kHalf:
      a.dtype = EmbeddingDtype::kHalf;
      break;
    case at::kBFloat16:
      a.dtype = EmbeddingDtype::kBFloat16;
      break;
    default:
      a.dtype = EmbeddingDtype::kFloat;
  }
  a.n = indices.numel();
  a.sorted = sorted.const_data_ptr<int64_t>();
  a.order = order.const_data_ptr<int64_t>();
  a.dim = grad_out.size(1);
  a.grad_out = grad_out.const_data_ptr();
  a.grad_weight = grad_weight.mutable_data_ptr();
  a.padding_idx = padding_idx;
  a.add = add;
  C10_CUDA_CHECK(launch_embedding_backward(
      a, c10::cuda::getCurrentCUDAStream(grad_out.device().index())));
}

} // namespace lamp::nn::detail
