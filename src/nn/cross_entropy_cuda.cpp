#include "cross_entropy_cuda.h"

#include "cross_entropy_kernel.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

namespace lamp::nn::detail {

bool cuda_softmax_xent_grad_(
    at::Tensor& logits,
    const at::Tensor& target,
    int64_t ignore_index,
    at::Tensor& loss) {
  std::optional<LogitsDtype> dtype;
  switch (logits.scalar_type()) {
    case at::kFloat:
      dtype = LogitsDtype::kFloat;
      break;
    case at::kHalf:
      dtype = LogitsDtype::kHalf;
      break;
    case at::kBFloat16:
      dtype = LogitsDtype::kBFloat16;
      break;
    default:
      break;
  }
  if (!dtype || !logits.is_cuda() || logits.dim() != 2 ||
      logits.stride(1) != 1 || target.device() != logits.device() ||
      target.scalar_type() != at::kLong || !target.is_contiguous() ||
      loss.device() != logits.device() || loss.scalar_type() != at::kFloat ||
      !loss.is_contiguous() || target.numel() != logits.size(0) ||
      loss.numel() != logits.size(0)) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  SoftmaxXentArgs a;
  a.dtype = *dtype;
  a.logits = logits.data_ptr();
  a.rows = logits.size(0);
  a.classes = logits.size(1);
  a.stride = logits.stride(0);
  a.target = target.const_data_ptr<int64_t>();
  a.ignore_index = ignore_index;
  a.loss = loss.mutable_data_ptr<float>();
  C10_CUDA_CHECK(launch_softmax_xent_grad(
      a, c10::cuda::getCurrentCUDAStream(logits.device().index())));
  return true;
}

} // namespace lamp::nn::detail
