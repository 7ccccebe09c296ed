#pragma once

// Internal: lamp::nn::linear's FP8 path inside an Fp8AutocastGuard scope
// (lamp/fp8.h): the forward GEMM and both backward GEMMs through
// at::_scaled_mm, tensorwise scales computed on the device.

#include <lamp/fp8.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#include "fp8_cast_op.h"

namespace torch::autograd {
struct AutogradContext;
} // namespace torch::autograd
namespace lamp::nn {
class LinearImpl;
} // namespace lamp::nn

namespace lamp::nn::detail {

/// True when the current thread is in an FP8 scope and this layer's GEMMs
/// can run in FP8 (floating-point input and weight; on a GPU, every GEMM
/// dimension a multiple of 16).
bool fp8_applies(const at::Tensor& input, const at::Tensor& weight);

/// A layer's delayed-scaling state (lamp::nn::Linear's buffers): `history`
/// [3, len] fp32, rows the input, the weight and the output gradient,
/// column 0 the newest amax; `scale` [3] fp32, what each multiplies by
/// before its cast.
struct Fp8DelayedState {
  at::Tensor history, scale;
};

/// In an FP8 scope whose recipe is delayed scaling: `layer`'s state, made
/// on first use and updated for this forward call (not in a checkpoint's
/// recompute: that keeps the forward call's scales). Else nullopt.
std::optional<Fp8DelayedState> fp8_layer_state(LinearImpl& layer);

/// y = input @ weight^T + bias in FP8 (see lamp/fp8.h), with gradients:
/// current (tensorwise) scales, or `delayed`'s scales when given (the casts
/// record their amaxes in its column 0).
at::Tensor fp8_linear(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const Fp8DelayedState* delayed = nullptr);

/// Transformer Engine's DelayedScaling update, in place on the device: per
/// row, amax = the history's largest (kMax) or column 0 (kMostRecent),
/// scale = fp8 max / amax / 2^margin where amax is positive and finite
/// (else the scale stays), then the history rolled one column towards 0
/// (column 0 going to the end) and column 0 zeroed for this step's amaxes.
void fp8_update_delayed(const Fp8DelayedState& s, const Fp8Recipe& recipe);

/// fp8_update_delayed's update without the reduction over the ranks, in
/// ATen ops (the reference its CUDA kernel is tested against).
void fp8_update_delayed_reference(
    const Fp8DelayedState& s,
    const Fp8Recipe& recipe);

/// The largest finite value of an FP8 format (Float8_e4m3fn: 448,
/// Float8_e5m2: 57344).
inline double fp8_max_of(at::ScalarType fp8) {
  return fp8 == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
}

/// The smallest amax current scaling divides by (torchao's EPS).
inline constexpr double kFp8AmaxEps = 1e-12;

/// An operand in FP8: its data row-major, its transpose (contiguous, what
/// the backward's GEMMs take), either undefined where not asked for, and
/// 1 / scale (what dequantises).
struct Fp8Cast {
  at::Tensor data, data_t, inverse_scale;
  /// The column sums in fp32 of what was cast (a bias gradient), where
  /// asked for (Fp8CastSpec::column_sums); else undefined.
  at::Tensor column_sums;
  /// Fp8CastSpec::ride in its ride_dtype (a bias for the GEMM's epilogue),
  /// where asked for; else undefined.
  at::Tensor bias16;
};

/// What fp8_cast makes of its operand.
struct Fp8CastSpec {
  at::ScalarType fp8 = at::kFloat8_e4m3fn;
  /// A delayed-scaling state and its row (0 input, 1 weight, 2 output
  /// gradient): its scale, its amax recorded in the history's column 0.
  /// Null: the current (tensorwise) scale.
  const Fp8DelayedState* delayed = nullptr;
  int64_t row = 0;
  /// Which copies: row-major, transposed (what the backward's GEMMs take).
  bool data = true, transposed = true;
  /// Also the fp32 column sums of op(x) (a bias gradient).
  bool column_sums = false;
  /// What is cast: op(x), with `aux` for kGeluBackward (fp8_cast_op.h).
  Fp8CastOp op = Fp8CastOp::kNone;
  at::Tensor aux;
  /// Also this tensor (a weight's bias) in `ride_dtype`, by the same kernel
  /// where it can (Fp8Cast::bias16).
  at::Tensor ride;
  at::ScalarType ride_dtype = at::kBFloat16;
};

/// `x` (a matrix) cast as `spec` says: on CUDA one kernel (fp8_cast_cuda.h),
/// elsewhere fp8_reference_op, the quantize_* reference and a transpose;
/// the same bytes.
Fp8Cast fp8_cast(const at::Tensor& x, const Fp8CastSpec& spec);

/// op(x) by ATen's ops (at::gelu / at::gelu_backward, "tanh").
at::Tensor fp8_reference_op(
    const at::Tensor& x,
    Fp8CastOp op,
    const at::Tensor& aux);

/// `weight` in e4m3, row-major and transposed: the copies this thread's FP8
/// scope made of it already when they still hold (Note [FP8 weight cache]),
/// else new ones, kept for the scope's next calls. Under delayed scaling
/// (the layer's state) a reused copy records the amax its cast recorded, as
/// casting again would. With a `bias` and a 16-bit `out_dtype`, also the
/// bias in `out_dtype` for the GEMM's epilogue (Fp8Cast::bias16), made by
/// the weight's cast and kept with it.
Fp8Cast fp8_weight_operand(
    const at::Tensor& weight,
    const Fp8DelayedState* delayed,
    const at::Tensor& bias = at::Tensor(),
    at::ScalarType out_dtype = at::kFloat);

/// A GEMM's output dtype: autocast's when it is on for the input's device,
/// else the input's.
at::ScalarType fp8_out_dtype(const at::Tensor& input);

/// a (row-major, times a_inv) @ b (column-major, times b_inv) + bias (if
/// defined; in the GEMM's epilogue for a 16-bit output), in `out_dtype`;
/// `fast_accum`: at::_scaled_mm's (pass fp8_forward_fast_accum() for a
/// forward GEMM, false for a gradient's).
at::Tensor fp8_scaled_mm(
    const at::Tensor& a,
    const at::Tensor& a_inv,
    const at::Tensor& b,
    const at::Tensor& b_inv,
    at::ScalarType out_dtype,
    const at::Tensor& bias = at::Tensor(),
    bool fast_accum = false);

/// The scope's Fp8Recipe::fast_accum_forward.
bool fp8_forward_fast_accum();

/// An autograd function's delayed-scaling state (if any) kept for its
/// backward in saved_data under `prefix` (a buffer, not a saved variable:
/// the casts write their amaxes into it after it is saved).
void fp8_save_state(
    torch::autograd::AutogradContext* ctx,
    const Fp8DelayedState* state,
    const std::string& prefix = "");
std::optional<Fp8DelayedState> fp8_saved_state(
    torch::autograd::AutogradContext* ctx,
    const std::string& prefix = "");

/// `x` in `fp8` with a given scale (a 0-d fp32 tensor): data = x * scale,
/// finite values saturated at the format's maximum, inf and NaN left as
/// they are (e4m3 turns them into NaN); amax(|x|) folded into `amax` (a
/// 0-d fp32 view: it becomes the larger of the two, NaN winning), as
/// Transformer Engine's casts fold theirs into the history's newest slot,
/// which the scale update zeroes. Returns the data and 1 / scale.
std::pair<at::Tensor, at::Tensor> quantize_delayed(
    const at::Tensor& x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax);

/// `x` in `fp8` (Float8_e4m3fn or Float8_e5m2) with its current
/// (tensorwise) scale, torchao's definition: scale = fp8 max /
/// max(amax(x), 1e-12) in fp32, data = saturate(x * scale). Returns the
/// data and 1 / scale (what dequantises: x ~ data * inverse_scale).
std::pair<at::Tensor, at::Tensor> quantize_tensorwise(
    const at::Tensor& x,
    at::ScalarType fp8);

} // namespace lamp::nn::detail
