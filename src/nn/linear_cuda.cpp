#include "linear_cuda.h"

#include "../amp/fp32_grad_weights.h"
#include "channel_sums_cuda.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>

// Note [The bias gradient of a linear layer]
// ATen's linear backward sums the output's gradient over the rows for the
// bias with its generic column reduction: on GPT-2's [16384, 768..3072]
// bf16 gradients 32-53 us a call on an H100, 2-4x the time it takes to read
// them (48 calls, 2 ms of a 38 ms step). lamp's column-sum kernel
// (channel_sums_kernel.cu: 16-byte loads, per-block partials folded in a
// fixed order) reads them at the memory's speed. Everything else is ATen's:
// the forward is at::linear (one GEMM, the bias in its epilogue), the
// input's and weight's gradients the GEMMs of ATen's addmm backward
// (grad.mm(W), grad^T.mm(x)). The bias's sum accumulates in fp32 and is
// rounded once to the bias's type, as ATen's, in another order: it may
// differ from ATen's in the last bit, and is the same every run. fp32
// gradients, shapes the kernel does not take (columns not a multiple of 8,
// unaligned) and double backward use ATen's sum. Tried: cuBLASLt summing
// the bias's gradient in the epilogue of the weight's gradient GEMM
// (BGRADB, as Transformer Engine does) made the step slower on an H100
// (gpt2 32.96 / 33.01 -> 33.23 / 33.29 ms, gpt2-medium 85.24 -> 85.94, same
// call, 2026-12-06): the GEMMs with that epilogue lose more than the sums
// cost.

namespace lamp::nn::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // `param`: the fp32 parameter that `weight` is the cast of, which gets the
  // weight's gradient in fp32 (Note [fp32 weight gradients]); `weight` is
  // then detached. NOTE: optionals, not undefined tensors: apply() asks
  // every tensor argument for its device.
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      const std::optional<at::Tensor>& param) {
    ctx->save_for_backward({input, weight, param.value_or(at::Tensor())});
    ctx->saved_data["has_bias"] = bias.has_value();
    return at::linear(input, weight, bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& param = saved[2];
    const at::Tensor& grad = grads[0];
    variable_list out(4);
    if (!grad.defined()) {
      return out;
    }
    const bool fp32 = param.defined();
    at::Tensor weight = saved[1];
    if (fp32 && at::GradMode::is_enabled()) {
      // A backward with create_graph: the weight as its parameter's cast,
      // so that a second derivative through the input's gradient reaches
      // the parameter.
      weight = param.to(weight.scalar_type());
    }
    const auto grad2d = grad.reshape({-1, weight.size(0)});
    if (ctx->needs_input_grad(0)) {
      out[0] = grad2d.mm(weight).view(input.sizes());
    }
    // NOTE: needs_input_grad counts the tensor arguments given (an empty
    // optional is none), the gradients returned count every argument.
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const size_t w = fp32 ? (has_bias ? 3 : 2) : 1;
    if (ctx->needs_input_grad(w)) {
      out[fp32 ? 3 : 1] = lamp::detail::weight_grad(
          grad2d, input.reshape({-1, weight.size(1)}), fp32);
    }
    if (has_bias && ctx->needs_input_grad(2)) {
      out[2] = bias_grad(grad2d);
    }
    return out;
  }
};

} // namespace

at::Tensor bias_grad(const at::Tensor& grad2d) {
  const int64_t columns = grad2d.size(1);
  if (at::GradMode::is_enabled() || !grad2d.is_contiguous() ||
      !channel_sums_cuda_applies(grad2d, columns)) {
    return grad2d.sum(0);
  }
  // NOTE: rounded to the gradient's dtype by the kernel that adds the sums:
  // a cast kernel after it was 48 launches of ~3 us a gpt2 step.
  return channel_sums_rounded_cuda(grad2d, columns);
}

bool linear_cuda_applies(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  if (!input.is_cuda() || !at::GradMode::is_enabled() || input.dim() < 2 ||
      weight.dim() != 2 || !input.is_contiguous()) {
    return false;
  }
  if (bias.defined()) {
    return bias.dim() == 1 &&
        (bias.requires_grad() ||
         lamp::detail::fp32_grad_param(weight).defined());
  }
  return lamp::detail::fp32_grad_param(weight).defined();
}

at::Tensor linear_cuda(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  const at::Tensor param = lamp::detail::fp32_grad_param(weight);
  at::Tensor x = input, w = weight, b = bias;
  // Autocast's policy for linear (lower_precision_fp): every operand in the
  // autocast dtype, the weight's cast cached for the region.
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    x = at::autocast::cached_cast(dtype, input, at::kCUDA);
    w = at::autocast::cached_cast(dtype, weight, at::kCUDA);
    if (b.defined()) {
      b = at::autocast::cached_cast(dtype, bias, at::kCUDA);
    }
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  std::optional<at::Tensor> maybe_b, maybe_param;
  if (b.defined()) {
    maybe_b = b;
  }
  if (param.defined()) {
    // The cast's own node gets no gradient from this layer: the parameter
    // gets it, in fp32.
    w = w.detach();
    maybe_param = param;
  }
  return LinearFunction::apply(x, w, maybe_b, maybe_param);
}

} // namespace lamp::nn::detail
