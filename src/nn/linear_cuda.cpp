#include "linear_cuda.h"

#include "channel_sums_cuda.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

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
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      const at::Tensor& bias) {
    ctx->save_for_backward({input, weight});
    return at::linear(input, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto grad2d = grad.reshape({-1, weight.size(0)});
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = grad2d.mm(weight).view(input.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      dw = grad2d.t().mm(input.reshape({-1, weight.size(1)}));
    }
    if (ctx->needs_input_grad(2)) {
      db = bias_grad(grad2d);
    }
    return {dx, dw, db};
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
  return input.is_cuda() && bias.defined() && bias.requires_grad() &&
      at::GradMode::is_enabled() && input.dim() >= 2 && weight.dim() == 2 &&
      bias.dim() == 1 && input.is_contiguous();
}

at::Tensor linear_cuda(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  at::Tensor x = input, w = weight, b = bias;
  // Autocast's policy for linear (lower_precision_fp): every operand in the
  // autocast dtype, the weight's cast cached for the region.
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    x = at::autocast::cached_cast(dtype, input, at::kCUDA);
    w = at::autocast::cached_cast(dtype, weight, at::kCUDA);
    b = at::autocast::cached_cast(dtype, bias, at::kCUDA);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  return LinearFunction::apply(x, w, b);
}

} // namespace lamp::nn::detail
