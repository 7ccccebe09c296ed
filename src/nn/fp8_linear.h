#pragma once

// Internal: lamp::nn::linear's FP8 path inside an Fp8AutocastGuard scope
// (lamp/fp8.h): the forward GEMM and both backward GEMMs through
// at::_scaled_mm, tensorwise scales computed on the device.

#include <ATen/core/Tensor.h>

namespace lamp::nn::detail {

/// True when the current thread is in an FP8 scope and this layer's GEMMs
/// can run in FP8 (floating-point input and weight; on a GPU, every GEMM
/// dimension a multiple of 16).
bool fp8_applies(const at::Tensor& input, const at::Tensor& weight);

/// y = input @ weight^T + bias in FP8 (see lamp/fp8.h), with gradients.
at::Tensor fp8_linear(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias);

/// `x` in `fp8` (Float8_e4m3fn or Float8_e5m2) with its current
/// (tensorwise) scale, torchao's definition: scale = fp8 max /
/// max(amax(x), 1e-12) in fp32, data = saturate(x * scale). Returns the
/// data and 1 / scale (what dequantises: x ~ data * inverse_scale).
std::pair<at::Tensor, at::Tensor> quantize_tensorwise(
    const at::Tensor& x,
    at::ScalarType fp8);

} // namespace lamp::nn::detail
