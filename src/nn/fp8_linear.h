#pragma once

// Internal: lamp::nn::linear's FP8 path inside an Fp8AutocastGuard scope
// (lamp/fp8.h): the forward GEMM and both backward GEMMs through
// at::_scaled_mm, tensorwise scales computed on the device.

#include <lamp/fp8.h>

#include <ATen/core/Tensor.h>

#include <utility>

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
  /// The operand's column sums in fp32 (a bias gradient), where the cast
  /// was asked for them and summed them in the same read; else undefined.
  at::Tensor column_sums;
};

/// `x` in `fp8` with a given scale (a 0-d fp32 tensor): data = x * scale,
/// finite values saturated at the format's maximum, inf and NaN left as
/// they are (e4m3 turns them into NaN); amax(|x|) written to `amax` (a 0-d
/// fp32 view). Returns the data and 1 / scale.
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
