#include <lamp/nn/add_layer_norm.h>

#include <lamp/config.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <optional>

#if LAMP_WITH_CUDA
#include "add_layer_norm_cuda.h"
#endif

// Note [Residual add and LayerNorm in one pass]
// Forward, a warp a row: the row of x plus the residual in registers, its
// mean and (two-pass) variance, then the sum and y written in one go; the
// mean and 1/std kept for backward. Backward, a warp a row again: y's
// gradient and the saved sum give LayerNorm's input gradient, to which the
// sum's own gradient (the residual stream's, from further on) is added: that
// is both x's and the residual's gradient. The weight's and bias's
// gradients are column sums over all rows, taken in the same read: each
// warp takes 8 rows (or more, at most 1,024 blocks), its lanes keep their
// columns' sums (in registers up to 1,024 columns, in shared memory past
// that), each block writes its warps' sums as one row of partials, and one
// small kernel adds those rows in a fixed order (no atomics: the same bits
// every run). The element types are template arguments of the kernels, so
// a row's loads are all in flight at once.

namespace lamp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#if LAMP_WITH_CUDA
class AddLayerNormFunction
    : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  // Returns {y} without a residual, {sum, y} with one.
  // NOTE: optional tensors, not undefined ones: apply() asks every tensor
  // argument for its device.
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& x,
      const std::optional<at::Tensor>& maybe_residual,
      const std::optional<at::Tensor>& maybe_residual_bias,
      const at::Tensor& weight,
      const std::optional<at::Tensor>& maybe_bias,
      double eps,
      at::ScalarType y_dtype) {
    ctx->set_materialize_grads(false);
    const at::Tensor residual = maybe_residual.value_or(at::Tensor());
    const at::Tensor residual_bias = maybe_residual_bias.value_or(at::Tensor());
    const at::Tensor bias = maybe_bias.value_or(at::Tensor());
    auto out = detail::cuda_add_norm_forward(
        x, residual, residual_bias, weight, bias, eps, y_dtype);
    const bool has_residual = residual.defined();
    ctx->save_for_backward(
        {has_residual ? out.sum : x, weight, out.mean, out.rstd});
    ctx->saved_data["has_residual"] = has_residual;
    ctx->saved_data["has_bias"] = bias.defined();
    if (residual_bias.defined()) {
      ctx->saved_data["residual_bias_dtype"] = residual_bias.scalar_type();
    }
    if (has_residual) {
      ctx->saved_data["residual_dtype"] = residual.scalar_type();
      return {out.sum, out.y};
    }
    return {out.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::add_layer_norm: no double backward (backward with "
        "create_graph=true); use x + residual and torch::layer_norm for that");
    const bool has_residual = ctx->saved_data["has_residual"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dsum = has_residual ? grads[0] : at::Tensor();
    const at::Tensor dy = has_residual ? grads[1] : grads[0];
    if (!dy.defined() && !dsum.defined()) {
      return variable_list(7);
    }
    std::optional<at::ScalarType> residual_dtype, residual_bias_dtype;
    if (has_residual) {
      residual_dtype = ctx->saved_data["residual_dtype"].toScalarType();
    }
    if (ctx->saved_data.count("residual_bias_dtype") != 0 &&
        ctx->needs_input_grad(2)) {
      residual_bias_dtype =
          ctx->saved_data["residual_bias_dtype"].toScalarType();
    }
    auto g = detail::cuda_add_norm_backward(
        saved[0],
        saved[1],
        saved[2],
        saved[3],
        dy,
        dsum,
        residual_dtype,
        ctx->saved_data["has_bias"].toBool(),
        residual_bias_dtype);
    return {g[0], g[1], g[4], g[2], g[3], at::Tensor(), at::Tensor()};
  }
};
#endif

std::pair<torch::Tensor, torch::Tensor> add_layer_norm_impl(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& residual_bias,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    double eps) {
  TORCH_CHECK(
      x.defined() && weight.defined(),
      "lamp::nn::add_layer_norm: x and weight must be defined");
  TORCH_CHECK_VALUE(
      x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
          (!bias.defined() || bias.sizes() == weight.sizes()) &&
          (!residual.defined() || residual.sizes() == x.sizes()),
      "lamp::nn::add_layer_norm: expected x (..., C), residual like x, and "
      "weight and bias (C); got x ",
      x.sizes(),
      ", residual ",
      residual.defined() ? residual.sizes() : c10::IntArrayRef{},
      ", weight ",
      weight.sizes());
  const auto device = x.device().type();
  const bool autocast = at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(x, device);
  const auto y_dtype =
      autocast ? at::autocast::get_autocast_dtype(device) : x.scalar_type();
#if LAMP_WITH_CUDA
  if (detail::add_norm_supported(
          x, residual, residual_bias, weight, bias, y_dtype)) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::autocast_dispatch_keyset);
    auto optional = [](const at::Tensor& t) {
      return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
    };
    auto out = AddLayerNormFunction::apply(
        x,
        optional(residual),
        optional(residual_bias),
        weight,
        optional(bias),
        eps,
        y_dtype);
    if (residual.defined()) {
      return {out[0], out[1]};
    }
    return {x, out[0]};
  }
#endif
  // ATen's ops: what Python runs (under autocast the LayerNorm in fp32, then
  // the cast that the next GEMM would make); a residual bias added to the
  // residual in fp32, then to x, as the kernel adds them.
  const auto sum = residual_bias.defined()
      ? (x + (residual.to(at::kFloat) + residual_bias.to(at::kFloat)))
            .to(at::result_type(x, residual))
      : residual.defined() ? x + residual
                           : x;
  const auto y =
      at::layer_norm(sum, {x.size(-1)}, weight, bias, eps).to(y_dtype);
  return {sum, y};
}

} // namespace

std::pair<torch::Tensor, torch::Tensor> add_layer_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    double eps) {
  return add_layer_norm_impl(x, residual, torch::Tensor(), weight, bias, eps);
}

std::pair<torch::Tensor, torch::Tensor> bias_add_layer_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& residual_bias,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    double eps) {
  TORCH_CHECK_VALUE(
      x.defined() && x.dim() >= 1 && residual.defined() &&
          residual_bias.defined() && residual_bias.dim() == 1 &&
          residual_bias.size(0) == x.size(-1),
      "lamp::nn::bias_add_layer_norm: expected a residual like x (..., C) "
      "and its bias (C); got residual ",
      residual.defined() ? residual.sizes() : c10::IntArrayRef{},
      ", residual_bias ",
      residual_bias.defined() ? residual_bias.sizes() : c10::IntArrayRef{},
      " (without a residual bias, call add_layer_norm)");
  return add_layer_norm_impl(x, residual, residual_bias, weight, bias, eps);
}

} // namespace lamp::nn
