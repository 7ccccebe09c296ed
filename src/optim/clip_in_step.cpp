// FusedOptimizer::clip_grad_norm_and_step: the clip's scaling done by the
// step's kernel (include/lamp/optim.h says why).

#include <lamp/clip_grad.h>
#include <lamp/optim.h>

#include "fused_clip_grad.h"
#include "unique_params.h"

#include <ATen/ops/clamp_max.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/utils.h>

#include <vector>

namespace lamp::optim {

torch::Tensor FusedOptimizer::clip_grad_norm_and_step(
    double max_norm,
    const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& group : lamp::detail::unique_group_params(
           *this, "lamp::optim::FusedOptimizer::clip_grad_norm_and_step")) {
    for (const auto& param : group) {
      if (param.grad().defined()) {
        grads.push_back(param.grad());
      }
    }
  }
  if (grads.empty()) {
    step_scaled(std::nullopt, found_inf);
    return at::scalar_tensor(0.0); // Python's torch.tensor(0.0)
  }
  if (auto fused = lamp::detail::fused_clip_norm_divisor(grads, max_norm)) {
    step_scaled(fused->divisor, found_inf);
    return fused->norm;
  }
  // Python's coefficient, min(max_norm / (norm + 1e-6), 1) in the norm's
  // dtype, as the divisor the step takes (fp32).
  auto norm = lamp::get_total_norm(grads);
  const auto coef = at::clamp_max((norm + 1e-6).reciprocal() * max_norm, 1.0);
  step_scaled(coef.to(at::kFloat).reciprocal(), found_inf);
  return norm;
}

} // namespace lamp::optim
