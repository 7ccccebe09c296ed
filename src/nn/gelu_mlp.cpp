#include <lamp/nn/gelu_mlp.h>

#include <lamp/activation_checkpoint.h>
#include <lamp/config.h>
#include <lamp/fp8.h>

#include <ATen/ops/gelu.h>

#include "fp8_gelu_mlp.h"
#include "fp8_linear.h"
#if LAMP_WITH_CUDA
#include "gelu_mlp_cuda.h"
#endif

namespace lamp::nn {

torch::Tensor gelu_mlp(
    const torch::Tensor& input,
    const torch::Tensor& fc_weight,
    const torch::Tensor& fc_bias,
    const torch::Tensor& proj_weight,
    const torch::Tensor& proj_bias_in,
    const GeluMlpOptions& options) {
  const torch::Tensor proj_bias =
      options.skip_proj_bias() ? torch::Tensor() : proj_bias_in;
  if (Fp8AutocastGuard::is_enabled() &&
      detail::fp8_gelu_mlp_applies(input, fc_weight, proj_weight)) {
    // Current scaling (the functional form keeps no state).
    return detail::fp8_gelu_mlp(
        input, fc_weight, fc_bias, proj_weight, proj_bias, nullptr, nullptr);
  }
#if LAMP_WITH_CUDA
  if (!Fp8AutocastGuard::is_enabled() &&
      detail::gelu_mlp_cuda_applies(
          input, fc_weight, fc_bias, proj_weight, proj_bias)) {
    return detail::gelu_mlp_cuda(
        input,
        fc_weight,
        fc_bias,
        proj_weight,
        proj_bias,
        options.skip_output_in_recompute() && is_recomputing());
  }
#endif
  return linear(
      at::gelu(linear(input, fc_weight, fc_bias), "tanh"),
      proj_weight,
      proj_bias);
}

torch::Tensor gelu_mlp(
    const torch::Tensor& input,
    Linear& fc,
    Linear& proj,
    const GeluMlpOptions& options) {
  TORCH_CHECK_VALUE(
      fc->bias.defined() && (proj->bias.defined() || options.skip_proj_bias()),
      "lamp::nn::gelu_mlp: both layers need a bias (LinearOptions::bias); "
      "without, call the layers and torch::gelu yourself");
  if (Fp8AutocastGuard::is_enabled()) {
    if (detail::fp8_gelu_mlp_applies(input, fc->weight, proj->weight)) {
      // Each layer's delayed-scaling state, as its forward would use it.
      const auto fc_state = detail::fp8_layer_state(*fc);
      const auto proj_state = detail::fp8_layer_state(*proj);
      return detail::fp8_gelu_mlp(
          input,
          fc->weight,
          fc->bias,
          proj->weight,
          options.skip_proj_bias() ? torch::Tensor() : proj->bias,
          fc_state ? &*fc_state : nullptr,
          proj_state ? &*proj_state : nullptr);
    }
    const auto a = at::gelu(fc(input), "tanh");
    return options.skip_proj_bias() ? proj->forward_skip_bias(a) : proj(a);
  }
  return gelu_mlp(
      input, fc->weight, fc->bias, proj->weight, proj->bias, options);
}

} // namespace lamp::nn
