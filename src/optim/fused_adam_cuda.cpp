#include "fused_adam_cuda.h"

#include "adam_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace lamp::detail {
namespace {

bool fp32_on(const at::Tensor& t, const at::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == at::kFloat;
}

bool scalar_on(const std::optional<at::Tensor>& t, const at::Device& device) {
  return !t || (fp32_on(*t, device) && t->numel() == 1);
}

} // namespace

bool adam_cuda_applies(
    const std::vector<at::Tensor>& params,
    const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs,
    const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& steps,
    bool amsgrad,
    const std::optional<at::Tensor>& lr,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  if (amsgrad || params.empty() || !params[0].is_cuda()) {
    return false;
  }
  const auto device = params[0].device();
  if (!scalar_on(lr, device) || !scalar_on(grad_scale, device) ||
      !scalar_on(found_inf, device)) {
    return false;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!fp32_on(p, device) || !p.is_non_overlapping_and_dense() ||
        !fp32_on(steps[i], device) || steps[i].numel() != 1) {
      return false;
    }
    for (const auto* t : {&grads[i], &exp_avgs[i], &exp_avg_sqs[i]}) {
      if (!fp32_on(*t, device) || t->sizes() != p.sizes() ||
          t->strides() != p.strides()) {
        return false;
      }
    }
  }
  return true;
}

void adam_cuda(
    const std::vector<at::Tensor>& params,
    const std::vector<at::Tensor>& copies,
    const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs,
    const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& steps,
    const std::optional<at::Tensor>& lr,
    double lr_value,
    double beta1,
    double beta2,
    double weight_decay,
    double eps,
    bool decoupled,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf,
    bool store_grads) {
  if (params.empty()) {
    return;
  }
  const c10::cuda::CUDAGuard guard(params[0].device());
  AdamHyper hyper;
  hyper.lr = lr_value;
  hyper.lr_ptr = lr ? lr->data_ptr<float>() : nullptr;
  hyper.beta1 = beta1;
  hyper.beta2 = beta2;
  hyper.weight_decay = weight_decay;
  hyper.eps = eps;
  hyper.decoupled = decoupled;
  hyper.grad_scale = grad_scale ? grad_scale->data_ptr<float>() : nullptr;
  hyper.found_inf = found_inf ? found_inf->data_ptr<float>() : nullptr;
  hyper.store_grad = store_grads;
  for (const auto& c : copies) {
    if (c.defined()) {
      TORCH_INTERNAL_ASSERT(
          c.scalar_type() == at::kHalf || c.scalar_type() == at::kBFloat16);
      hyper.copy_half = c.scalar_type() == at::kHalf;
      break;
    }
  }
  // NOTE: a dense tensor's elements are one block of memory from its
  // lowest address, in the same order in each list (same strides), so the
  // kernel walks them as flat arrays.
  std::vector<AdamList> lists;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) {
      continue;
    }
    if (lists.empty() || lists.back().count == AdamList::kMax) {
      lists.emplace_back();
    }
    auto& list = lists.back();
    const int k = list.count++;
    list.param[k] = params[i].data_ptr<float>();
    list.copy[k] = nullptr;
    if (!copies.empty() && copies[i].defined()) {
      const auto& c = copies[i];
      TORCH_INTERNAL_ASSERT(
          c.device() == params[i].device() && c.sizes() == params[i].sizes() &&
          c.strides() == params[i].strides() &&
          c.scalar_type() == (hyper.copy_half ? at::kHalf : at::kBFloat16));
      list.copy[k] = c.data_ptr();
    }
    list.grad[k] = grads[i].data_ptr<float>();
    list.exp_avg[k] = exp_avgs[i].data_ptr<float>();
    list.exp_avg_sq[k] = exp_avg_sqs[i].data_ptr<float>();
    list.step[k] = steps[i].data_ptr<float>();
    list.numel[k] = params[i].numel();
  }
  const auto* props = at::cuda::getCurrentDeviceProperties();
  C10_CUDA_CHECK(launch_adam(
      lists.data(),
      static_cast<int>(lists.size()),
      hyper,
      props->multiProcessorCount,
      at::cuda::getCurrentCUDAStream()));
}

} // namespace lamp::detail
