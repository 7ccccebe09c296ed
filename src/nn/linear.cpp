#include <lamp/nn/linear.h>

#include <lamp/config.h>
#include <lamp/fp8.h>

#include <ATen/ops/linear.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>

#include "fp8_linear.h"
#include "fp8_scope.h"
#include "fp8_update_scales.h"
#if LAMP_WITH_CUDA
#include "linear_cuda.h"
#endif

namespace lamp::nn {

torch::Tensor linear(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& bias) {
  if (detail::fp8_applies(input, weight)) {
    return detail::fp8_linear(input, weight, bias); // lamp/fp8.h
  }
#if LAMP_WITH_CUDA
  if (detail::linear_cuda_applies(input, weight, bias)) {
    // at::linear with a faster bias gradient (linear_cuda.cpp).
    return detail::linear_cuda(input, weight, bias);
  }
#endif
  // NOTE: ATen's op, not torch::nn::functional::linear's matmul + add (see
  // the header): the autograd and autocast kernels are Python's.
  return at::linear(input, weight, bias);
}

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_)
    : options(options_) {
  LinearImpl::reset();
}

void LinearImpl::reset() {
  weight = register_parameter(
      "weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  // NOTE: clone() copies the members, then calls reset(): a layer with FP8
  // state registers it again, and clone() copies its values.
  if (fp8_amax_history.defined()) {
    fp8_amax_history = register_buffer(
        "fp8_amax_history", torch::zeros_like(fp8_amax_history));
    fp8_scale = register_buffer("fp8_scale", torch::ones_like(fp8_scale));
  }
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  // Python's nn.Linear.reset_parameters (torch::nn::LinearImpl's too).
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const auto [fan_in, fan_out] =
        torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    (void)fan_out;
    const double bound = fan_in > 0 ? 1 / std::sqrt(fan_in) : 0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha
         << "lamp::nn::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features()
         << ", bias=" << options.bias() << ")";
}

void LinearImpl::init_fp8_state(const Fp8Recipe& recipe) {
  const int64_t len = recipe.amax_history_len();
  if (fp8_amax_history.defined()) {
    TORCH_CHECK_VALUE(
        fp8_amax_history.size(1) == len,
        "lamp::nn::Linear: its FP8 amax history holds ",
        fp8_amax_history.size(1),
        " steps but the recipe's amax_history_len is ",
        len,
        "; keep the length a model was trained (and checkpointed) with");
    return;
  }
  const auto f32 = weight.options().dtype(torch::kFloat);
  fp8_amax_history =
      register_buffer("fp8_amax_history", torch::zeros({3, len}, f32));
  fp8_scale = register_buffer("fp8_scale", torch::ones({3}, f32));
}

namespace {

torch::Tensor linear_with_state(
    LinearImpl& layer,
    const torch::Tensor& input,
    const torch::Tensor& bias) {
  if (Fp8AutocastGuard::is_enabled() &&
      detail::fp8_applies(input, layer.weight)) {
    if (const auto state = detail::fp8_layer_state(layer)) {
      return detail::fp8_linear(input, layer.weight, bias, &*state);
    }
  }
  return linear(input, layer.weight, bias);
}

} // namespace

torch::Tensor LinearImpl::forward(const torch::Tensor& input) {
  return linear_with_state(*this, input, bias);
}

torch::Tensor LinearImpl::forward_skip_bias(const torch::Tensor& input) {
  return linear_with_state(*this, input, torch::Tensor());
}

namespace detail {

std::optional<Fp8DelayedState> fp8_layer_state(LinearImpl& layer) {
  const auto recipe = Fp8AutocastGuard::recipe();
  if (recipe.scaling() != Fp8Scaling::kDelayed) {
    return std::nullopt;
  }
  layer.init_fp8_state(recipe);
  const Fp8DelayedState state{layer.fp8_amax_history, layer.fp8_scale};
  // NOTE: a checkpoint's recompute keeps the forward call's scales; scales
  // lamp::update_fp8_scales updated for this call are not updated again
  // (Note [FP8 scales updated ahead]).
  if (!fp8_recomputing() && !fp8_take_fresh_scales(state)) {
    torch::NoGradGuard no_grad;
    fp8_update_delayed(state, recipe);
  }
  return state;
}

} // namespace detail
} // namespace lamp::nn

namespace lamp {

void init_fp8_state(torch::nn::Module& model, const Fp8Recipe& recipe) {
  Fp8AutocastGuard::check(recipe);
  if (recipe.scaling() != Fp8Scaling::kDelayed) {
    return;
  }
  // NOTE: the model itself apart: modules(true) needs it in a shared_ptr.
  if (auto* fc = dynamic_cast<nn::LinearImpl*>(&model)) {
    fc->init_fp8_state(recipe);
  }
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* fc = dynamic_cast<nn::LinearImpl*>(module.get())) {
      fc->init_fp8_state(recipe);
    }
  }
}

} // namespace lamp
