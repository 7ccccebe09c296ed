#include "fp8_linear.h"

#include <lamp/config.h>
#include <lamp/dist/process_group.h>
#include <lamp/fp8.h>
#include <lamp/nn/diagnostics.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/maximum.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "fp8_cast_cuda.h"
#endif
#include "fp8_amax_reduction.h"
#include "fp8_weight_cache.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <utility>

namespace lamp::nn::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The one-kernel casts (fp8_cast_cuda.h; Fp8CastGpu.* checks their bytes
// against the reference ops'). NOTE: a switch, so that a suspected kernel
// fault can be told from the rest by flipping it.
constexpr bool kFusedCasts = true;
// The bias gradient summed by the output gradient's cast, in the read it
// makes anyway (Fp8Cast::column_sums; Fp8CastGpu.ColumnSumsAreTheBiasGradient
// checks it), else ATen's column sum.
constexpr bool kFusedBiasGrad = true;

// FP8 weight copies made (fp8_linear_weight_cast_count).
std::atomic<int64_t> weight_casts{0};

} // namespace

at::Tensor fp8_reference_op(
    const at::Tensor& x,
    Fp8CastOp op,
    const at::Tensor& aux) {
  switch (op) {
    case Fp8CastOp::kGelu:
      return at::gelu(x, "tanh");
    case Fp8CastOp::kGeluBackward:
      return at::gelu_backward(x, aux, "tanh");
    case Fp8CastOp::kNone:
      break;
  }
  return x;
}

Fp8Cast fp8_cast(const at::Tensor& x, const Fp8CastSpec& spec) {
  const at::Tensor history =
      spec.delayed ? spec.delayed->history.select(0, spec.row) : at::Tensor();
  const at::Tensor scale =
      spec.delayed ? spec.delayed->scale.select(0, spec.row) : at::Tensor();
#if LAMP_WITH_CUDA
  if (kFusedCasts && fp8_cast_cuda_applies(x)) {
    const bool sums = spec.column_sums && kFusedBiasGrad;
    Fp8Cast out;
    if (spec.delayed) {
      out = fp8_cast_delayed_cuda(
          x,
          spec.fp8,
          scale,
          history.select(0, 0),
          spec.data,
          spec.transposed,
          sums,
          spec.op,
          spec.aux,
          spec.ride,
          spec.ride_dtype);
    } else {
      out = fp8_cast_tensorwise_cuda(
          x,
          spec.fp8,
          spec.data,
          spec.transposed,
          sums,
          spec.op,
          spec.aux,
          spec.ride,
          spec.ride_dtype);
    }
    if (spec.column_sums && !out.column_sums.defined()) {
      // Where the kernel could not sum (or kFusedBiasGrad is off).
      out.column_sums = fp8_reference_op(x, spec.op, spec.aux)
                            .sum(0, /*keepdim=*/false, at::kFloat);
    }
    return out;
  }
#endif
  const auto source = fp8_reference_op(x, spec.op, spec.aux);
  auto [q, inverse] = spec.delayed
      ? quantize_delayed(source, spec.fp8, scale, history.select(0, 0))
      : quantize_tensorwise(source, spec.fp8);
  Fp8Cast out;
  out.inverse_scale = std::move(inverse);
  if (spec.transposed) {
    out.data_t = q.t().contiguous();
  }
  if (spec.data) {
    out.data = std::move(q);
  }
  if (spec.column_sums) {
    out.column_sums = source.sum(0, /*keepdim=*/false, at::kFloat);
  }
  if (spec.ride.defined()) {
    out.bias16 = spec.ride.to(spec.ride_dtype);
  }
  return out;
}

Fp8Cast fp8_weight_operand(
    const at::Tensor& weight,
    const Fp8DelayedState* delayed,
    const at::Tensor& bias,
    at::ScalarType out_dtype) {
  const auto& layer_scale = delayed ? delayed->scale : at::Tensor();
  const auto newest = [&] {
    return delayed->history.select(0, 1).select(0, 0);
  };
  // NOTE: the bias in the GEMM's 16-bit output dtype, as fp8_scaled_mm
  // would cast it, where it is not that already.
  const bool bias16 = bias.defined() && bias.scalar_type() != out_dtype &&
      (out_dtype == at::kBFloat16 || out_dtype == at::kHalf);
  if (const auto* copy = fp8_cached_weight(weight, layer_scale)) {
    // NOTE: the amax the cast recorded, recorded again; where the history
    // was not rolled since, its newest slot holds it already (at least).
    if (delayed && copy->amax.defined()) {
      newest().copy_(copy->amax);
    }
    auto cast = copy->cast;
    if (!bias16) {
      cast.bias16 = at::Tensor();
    } else if (!fp8_cached_bias_holds(*copy, bias, out_dtype)) {
      // Another bias with the same weight (two layers tied to it).
      cast.bias16 = bias.to(out_dtype);
    }
    return cast;
  }
  Fp8CastSpec spec;
  spec.fp8 = at::kFloat8_e4m3fn;
  spec.delayed = delayed;
  spec.row = 1;
  if (bias16) {
    spec.ride = bias;
    spec.ride_dtype = out_dtype;
  }
  Fp8WeightCopy copy;
  copy.cast = fp8_cast(weight, spec);
  weight_casts.fetch_add(1, std::memory_order_relaxed);
  if (delayed) {
    // NOTE: its amax is copied only if the history is rolled while the
    // copy is held (fp8_keep_weight_amaxes): most steps never reuse it.
    copy.history = delayed->history;
  }
  if (bias16) {
    copy.bias = bias;
    copy.bias_version = bias._version();
  }
  auto cast = copy.cast;
  fp8_cache_weight(weight, layer_scale, std::move(copy));
  return cast;
}

at::ScalarType fp8_out_dtype(const at::Tensor& input) {
  const auto type = input.device().type();
  if (at::autocast::is_autocast_enabled(type)) {
    return at::autocast::get_autocast_dtype(type);
  }
  return input.scalar_type();
}

bool fp8_forward_fast_accum() {
  return Fp8AutocastGuard::recipe().fast_accum_forward();
}

at::Tensor fp8_scaled_mm(
    const at::Tensor& a,
    const at::Tensor& a_inv,
    const at::Tensor& b,
    const at::Tensor& b_inv,
    at::ScalarType out_dtype,
    const at::Tensor& bias,
    bool fast_accum) {
  // NOTE: the bias in the GEMM's epilogue where _scaled_mm takes it (a
  // 16-bit output), else one add.
  const bool epilogue =
      bias.defined() && (out_dtype == at::kBFloat16 || out_dtype == at::kHalf);
  auto y = at::_scaled_mm(
      a,
      b,
      a_inv,
      b_inv,
      epilogue ? std::optional<at::Tensor>(bias.to(out_dtype)) : std::nullopt,
      /*scale_result=*/std::nullopt,
      out_dtype,
      fast_accum);
  if (bias.defined() && !epilogue) {
    y = y + bias.to(out_dtype);
  }
  return y;
}

namespace {

struct Fp8LinearFunction : torch::autograd::Function<Fp8LinearFunction> {
  // `history` and `scale`: a delayed-scaling state, or both absent
  // (current scaling). NOTE: buffers, not differentiable inputs; kept in
  // saved_data, not saved variables, since the casts write their amaxes
  // into `history` after it is saved.
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      std::optional<at::Tensor> bias,
      std::optional<at::Tensor> history,
      std::optional<at::Tensor> scale) {
    const auto out_dtype = fp8_out_dtype(input);
    const int64_t in = weight.size(1);
    // NOTE: under autocast the input is cast to its dtype first, as
    // torchao's Float8Linear does (a linear's inputs are autocast's).
    const auto rows = input.reshape({-1, in}).to(out_dtype);
    Fp8DelayedState state;
    if (history) {
      state = {*history, *scale};
    }
    const Fp8DelayedState* delayed = history ? &state : nullptr;
    fp8_save_state(ctx, delayed);
    // NOTE: the transposes for the backward's GEMMs are written now, by the
    // same kernel, and saved instead of the row-major copies (same memory).
    Fp8CastSpec spec;
    spec.fp8 = at::kFloat8_e4m3fn;
    spec.delayed = delayed;
    const auto x8 = fp8_cast(rows, spec);
    const auto b = bias ? *bias : at::Tensor();
    const auto w8 = fp8_weight_operand(weight, delayed, b, out_dtype);
    const auto y = fp8_scaled_mm(
        x8.data,
        x8.inverse_scale,
        w8.data.t(),
        w8.inverse_scale,
        out_dtype,
        w8.bias16.defined() ? w8.bias16 : b,
        fp8_forward_fast_accum());
    ctx->save_for_backward(
        {x8.data_t, x8.inverse_scale, w8.data_t, w8.inverse_scale});
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["in_dtype"] = input.scalar_type();
    ctx->saved_data["w_dtype"] = weight.scalar_type();
    auto sizes = input.sizes().vec();
    sizes.back() = weight.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x8_t = saved[0]; // [in, rows]
    const auto& x_inv = saved[1];
    const auto& w8_t = saved[2]; // [in, out]
    const auto& w_inv = saved[3];
    const auto in_dtype = ctx->saved_data["in_dtype"].toScalarType();
    const auto w_dtype = ctx->saved_data["w_dtype"].toScalarType();
    const int64_t out = w8_t.size(1);
    const auto& grad = grads[0];
    const auto g = grad.reshape({-1, out});
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto state = fp8_saved_state(ctx);
    Fp8CastSpec spec;
    spec.fp8 = at::kFloat8_e5m2;
    spec.delayed = state ? &*state : nullptr;
    spec.row = 2;
    spec.column_sums = has_bias;
    const auto g8 = fp8_cast(g, spec);
    // dX = dY @ W: e5m2 x e4m3 (W column-major: its transpose's view).
    auto dx =
        fp8_scaled_mm(g8.data, g8.inverse_scale, w8_t.t(), w_inv, in_dtype);
    auto in_sizes = grad.sizes().vec();
    in_sizes.back() = w8_t.size(0);
    // dW = dY^T @ X: e5m2 x e4m3, into the weight's dtype (fp32 master).
    auto dw =
        fp8_scaled_mm(g8.data_t, g8.inverse_scale, x8_t.t(), x_inv, w_dtype);
    // The bias's gradient in fp32 from the unquantised gradient.
    const auto db = has_bias ? g8.column_sums.to(w_dtype) : at::Tensor();
    return {dx.view(in_sizes), dw, db, at::Tensor(), at::Tensor()};
  }
};

} // namespace

void fp8_save_state(
    AutogradContext* ctx,
    const Fp8DelayedState* state,
    const std::string& prefix) {
  if (state) {
    ctx->saved_data[prefix + "history"] = state->history;
    ctx->saved_data[prefix + "scale"] = state->scale;
  }
}

std::optional<Fp8DelayedState> fp8_saved_state(
    AutogradContext* ctx,
    const std::string& prefix) {
  const auto it = ctx->saved_data.find(prefix + "history");
  if (it == ctx->saved_data.end()) {
    return std::nullopt;
  }
  return Fp8DelayedState{
      it->second.toTensor(), ctx->saved_data.at(prefix + "scale").toTensor()};
}

int64_t fp8_linear_weight_cast_count() {
  return weight_casts.load(std::memory_order_relaxed);
}

std::pair<at::Tensor, at::Tensor> quantize_tensorwise(
    const at::Tensor& x,
    at::ScalarType fp8) {
  const double max = fp8_max_of(fp8);
  const auto amax = x.abs().amax().to(at::kFloat);
  const auto scale = max / amax.clamp_min(kFp8AmaxEps);
  auto data = (x.to(at::kFloat) * scale).clamp(-max, max).to(fp8);
  return {std::move(data), scale.reciprocal()};
}

std::pair<at::Tensor, at::Tensor> quantize_delayed(
    const at::Tensor& x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax) {
  const double max = fp8_max_of(fp8);
  amax.copy_(at::maximum(amax, x.abs().amax().to(amax.scalar_type())));
  const auto scaled = x.to(at::kFloat) * scale;
  // NOTE: saturate finite values only: an inf must not become the
  // format's largest number (Fp8AutocastGuard: overflow).
  auto data =
      at::where(scaled.isfinite(), scaled.clamp(-max, max), scaled).to(fp8);
  return {std::move(data), scale.reciprocal()};
}

void fp8_update_delayed(const Fp8DelayedState& s, const Fp8Recipe& recipe) {
  fp8_keep_weight_amaxes(s.history); // before the reduction and the roll
  const auto& group = recipe.amax_group();
  if (group && group->world_size() > 1) {
    // Transformer Engine's amax reduction: the amaxes recorded since the
    // last update (column 0), their max over the ranks; with every other
    // layer's in one all-reduce (Note [FP8 amax reduction]).
    fp8_reduce_amaxes(s.history, *group);
  }
#if LAMP_WITH_CUDA
  if (kFusedCasts && fp8_update_cuda_applies(s)) {
    fp8_update_delayed_cuda(s, recipe); // one kernel, the same bits
    return;
  }
#endif
  fp8_update_delayed_reference(s, recipe);
}

void fp8_update_delayed_reference(
    const Fp8DelayedState& s,
    const Fp8Recipe& recipe) {
  const auto amax = recipe.amax_compute() == Fp8AmaxCompute::kMax
      ? s.history.amax(1)
      : s.history.select(1, 0).clone();
  // Transformer Engine's _default_sf_compute: (fp8_max / amax) / 2^margin,
  // the fp8 max per row (e4m3 for the input and weight, e5m2 for the
  // gradient). NOTE: filled, not copied from the host (capturable).
  auto fp8_max = at::full({3}, fp8_max_of(at::kFloat8_e4m3fn), amax.options());
  fp8_max.narrow(0, 2, 1).fill_(fp8_max_of(at::kFloat8_e5m2));
  const auto sf = fp8_max.div(amax).div_(std::ldexp(1.0, recipe.margin()));
  s.scale.copy_(
      at::where(amax.gt(0).logical_and_(amax.isfinite()), sf, s.scale));
  // Transformer Engine's _update_amax_history.
  s.history.copy_(s.history.roll(-1, 1));
  s.history.select(1, 0).zero_();
}

bool fp8_applies(const at::Tensor& input, const at::Tensor& weight) {
  if (!Fp8AutocastGuard::is_enabled() || !input.is_floating_point() ||
      !weight.is_floating_point() || weight.dim() != 2 || input.dim() < 1) {
    return false;
  }
  if (!input.is_cuda()) {
    return true;
  }
#if LAMP_WITH_CUDA
  const auto* props = at::cuda::getDeviceProperties(input.device().index());
  TORCH_CHECK(
      props->major * 10 + props->minor >= 89,
      "lamp::Fp8AutocastGuard: FP8 GEMMs need compute capability 8.9 or "
      "newer (Ada, Hopper); ",
      input.device(),
      " is ",
      props->major,
      ".",
      props->minor,
      ". Train in bf16 (leave the FP8 scope out).");
#endif
  // NOTE: cuBLASLt's FP8 GEMMs take dimensions that are multiples of 16;
  // every GEMM of forward and backward uses rows, in and out.
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t rows = in > 0 ? input.numel() / in : 0;
  return rows % 16 == 0 && in % 16 == 0 && out % 16 == 0 && rows > 0;
}

at::Tensor fp8_linear(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const Fp8DelayedState* delayed) {
  auto optional = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  return Fp8LinearFunction::apply(
      input,
      weight,
      optional(bias),
      delayed ? optional(delayed->history) : std::nullopt,
      delayed ? optional(delayed->scale) : std::nullopt);
}

} // namespace lamp::nn::detail
