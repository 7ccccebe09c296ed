#include <lamp/nn/gelu_mlp.h>

#include <lamp/config.h>
#include <lamp/fp8.h>

#include <ATen/ops/gelu.h>

#if LAMP_WITH_CUDA
#include "gelu_mlp_cuda.h"
#endif

namespace lamp::nn {

torch::Tensor gelu_mlp(
    const torch::Tensor& input,
    const torch::Tensor& fc_weight,
    const torch::Tensor& fc_bias,
    const torch::Tensor& proj_weight,
    const torch::Tensor& proj_bias) {
#if LAMP_WITH_CUDA
  if (!Fp8AutocastGuard::is_enabled() &&
      detail::gelu_mlp_cuda_applies(
          input, fc_weight, fc_bias, proj_weight, proj_bias)) {
    return detail::gelu_mlp_cuda(
        input, fc_weight, fc_bias, proj_weight, proj_bias);
  }
#endif
  return linear(
      at::gelu(linear(input, fc_weight, fc_bias), "tanh"),
      proj_weight,
      proj_bias);
}

torch::Tensor gelu_mlp(const torch::Tensor& input, Linear& fc, Linear& proj) {
  TORCH_CHECK_VALUE(
      fc->bias.defined() && proj->bias.defined(),
      "lamp::nn::gelu_mlp: both layers need a bias (LinearOptions::bias); "
      "without, call the layers and torch::gelu yourself");
  if (Fp8AutocastGuard::is_enabled()) {
    // NOTE: through the modules' forward, which keep delayed scaling's state.
    return proj(at::gelu(fc(input), "tanh"));
  }
  return gelu_mlp(input, fc->weight, fc->bias, proj->weight, proj->bias);
}

} // namespace lamp::nn
