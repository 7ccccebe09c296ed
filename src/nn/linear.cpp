#include <lamp/nn/linear.h>

#include <lamp/config.h>

#include <ATen/ops/linear.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>

#include "fp8_linear.h"
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

torch::Tensor LinearImpl::forward(const torch::Tensor& input) {
  return linear(input, weight, bias);
}

} // namespace lamp::nn
