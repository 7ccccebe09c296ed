#include "fp8_gelu_mlp.h"

#include <torch/autograd.h>

#include <optional>
#include <utility>

namespace lamp::nn::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

std::optional<Fp8DelayedState> state_of(
    const std::optional<at::Tensor>& history,
    const std::optional<at::Tensor>& scale) {
  if (!history) {
    return std::nullopt;
  }
  return Fp8DelayedState{*history, *scale};
}

const Fp8DelayedState* pointer(const std::optional<Fp8DelayedState>& s) {
  return s ? &*s : nullptr;
}

// NOTE: the casts, GEMMs and saved tensors of Fp8LinearFunction
// (fp8_linear.cpp) for each layer, in the same order (so delayed scaling
// records the same amaxes), with GELU's pre-activation saved as at::gelu
// saves it.
struct Fp8GeluMlpFunction : torch::autograd::Function<Fp8GeluMlpFunction> {
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& fc_weight,
      std::optional<at::Tensor> fc_bias,
      const at::Tensor& proj_weight,
      std::optional<at::Tensor> proj_bias,
      std::optional<at::Tensor> fc_history,
      std::optional<at::Tensor> fc_scale,
      std::optional<at::Tensor> proj_history,
      std::optional<at::Tensor> proj_scale) {
    const auto out_dtype = fp8_out_dtype(input);
    const auto rows = input.reshape({-1, fc_weight.size(1)}).to(out_dtype);
    const auto fc = state_of(fc_history, fc_scale);
    const auto proj = state_of(proj_history, proj_scale);
    fp8_save_state(ctx, pointer(fc), "fc_");
    fp8_save_state(ctx, pointer(proj), "proj_");
    Fp8CastSpec spec;
    spec.fp8 = at::kFloat8_e4m3fn;
    spec.delayed = pointer(fc);
    const auto x8 = fp8_cast(rows, spec);
    auto tensor = [](const std::optional<at::Tensor>& t) {
      return t ? *t : at::Tensor();
    };
    const auto w1 =
        fp8_weight_operand(fc_weight, pointer(fc), tensor(fc_bias), out_dtype);
    const bool fast_accum = fp8_forward_fast_accum();
    // x @ w^T + bias, both operands in FP8, in autocast's dtype; the bias as
    // the weight's cast made it in that dtype, where it did.
    auto gemm = [&](const Fp8Cast& x, const Fp8Cast& w, const auto& bias) {
      return fp8_scaled_mm(
          x.data,
          x.inverse_scale,
          w.data.t(),
          w.inverse_scale,
          out_dtype,
          w.bias16.defined() ? w.bias16 : tensor(bias),
          fast_accum);
    };
    const auto pre = gemm(x8, w1, fc_bias);
    spec.delayed = pointer(proj);
    spec.op = Fp8CastOp::kGelu;
    const auto a8 = fp8_cast(pre, spec);
    const auto w2 = fp8_weight_operand(
        proj_weight, pointer(proj), tensor(proj_bias), out_dtype);
    const auto y = gemm(a8, w2, proj_bias);
    ctx->save_for_backward(
        {x8.data_t,
         x8.inverse_scale,
         w1.data_t,
         w1.inverse_scale,
         pre,
         a8.data_t,
         a8.inverse_scale,
         w2.data_t,
         w2.inverse_scale});
    ctx->saved_data["fc_bias"] = fc_bias.has_value();
    ctx->saved_data["proj_bias"] = proj_bias.has_value();
    ctx->saved_data["in_dtype"] = input.scalar_type();
    ctx->saved_data["fc_dtype"] = fc_weight.scalar_type();
    ctx->saved_data["proj_dtype"] = proj_weight.scalar_type();
    auto sizes = input.sizes().vec();
    sizes.back() = proj_weight.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x8_t = saved[0]; // [in, rows]
    const auto& x_inv = saved[1];
    const auto& w1_t = saved[2]; // [in, hidden]
    const auto& w1_inv = saved[3];
    const auto& pre = saved[4]; // [rows, hidden]
    const auto& a8_t = saved[5]; // [hidden, rows]
    const auto& a_inv = saved[6];
    const auto& w2_t = saved[7]; // [hidden, out]
    const auto& w2_inv = saved[8];
    const auto fc = fp8_saved_state(ctx, "fc_");
    const auto proj = fp8_saved_state(ctx, "proj_");
    const auto fc_dtype = ctx->saved_data["fc_dtype"].toScalarType();
    const auto proj_dtype = ctx->saved_data["proj_dtype"].toScalarType();
    const bool fc_bias = ctx->saved_data["fc_bias"].toBool();
    const bool proj_bias = ctx->saved_data["proj_bias"].toBool();
    const auto& grad = grads[0];
    const auto g = grad.reshape({-1, w2_t.size(1)});
    // proj: its output gradient in e5m2 (and its bias's gradient).
    Fp8CastSpec spec;
    spec.fp8 = at::kFloat8_e5m2;
    spec.delayed = pointer(proj);
    spec.row = 2;
    spec.column_sums = proj_bias;
    const auto g8 = fp8_cast(g, spec);
    const auto da = fp8_scaled_mm(
        g8.data, g8.inverse_scale, w2_t.t(), w2_inv, pre.scalar_type());
    auto dw2 =
        fp8_scaled_mm(g8.data_t, g8.inverse_scale, a8_t.t(), a_inv, proj_dtype);
    // fc: the pre-activation's gradient, gelu_backward(da, pre), in e5m2.
    spec.delayed = pointer(fc);
    spec.column_sums = fc_bias;
    spec.op = Fp8CastOp::kGeluBackward;
    spec.aux = pre;
    const auto d8 = fp8_cast(da, spec);
    auto dx = fp8_scaled_mm(
        d8.data,
        d8.inverse_scale,
        w1_t.t(),
        w1_inv,
        ctx->saved_data["in_dtype"].toScalarType());
    auto dw1 =
        fp8_scaled_mm(d8.data_t, d8.inverse_scale, x8_t.t(), x_inv, fc_dtype);
    auto in_sizes = grad.sizes().vec();
    in_sizes.back() = w1_t.size(0);
    return {
        dx.view(in_sizes),
        dw1,
        fc_bias ? d8.column_sums.to(fc_dtype) : at::Tensor(),
        dw2,
        proj_bias ? g8.column_sums.to(proj_dtype) : at::Tensor(),
        at::Tensor(),
        at::Tensor(),
        at::Tensor(),
        at::Tensor()};
  }
};

} // namespace

bool fp8_gelu_mlp_applies(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& proj_weight) {
  if (!fp8_applies(input, fc_weight) || proj_weight.dim() != 2 ||
      !proj_weight.is_floating_point() ||
      proj_weight.size(1) != fc_weight.size(0)) {
    return false;
  }
  // NOTE: fp8_applies checked the rows and fc's widths (multiples of 16 on
  // a GPU); proj adds its output width.
  return !input.is_cuda() || proj_weight.size(0) % 16 == 0;
}

at::Tensor fp8_gelu_mlp(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias,
    const Fp8DelayedState* fc,
    const Fp8DelayedState* proj) {
  return Fp8GeluMlpFunction::apply(
      input,
      fc_weight,
      optional(fc_bias),
      proj_weight,
      optional(proj_bias),
      fc ? optional(fc->history) : std::nullopt,
      fc ? optional(fc->scale) : std::nullopt,
      proj ? optional(proj->history) : std::nullopt,
      proj ? optional(proj->scale) : std::nullopt);
}

} // namespace lamp::nn::detail
