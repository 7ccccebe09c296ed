#pragma once

// Internal: lamp::nn::add_layer_norm on CUDA (add_layer_norm_kernel.cu).

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace lamp::nn::detail {

/// Whether the kernels take these: CUDA, x and weight (and bias) float32
/// and contiguous, C <= kMaxNormColumns, residual (if any) fp32/fp16/bf16
/// contiguous of x's shape, residual_bias (if any) fp32/fp16/bf16
/// contiguous (C), `y_dtype` fp32/fp16/bf16.
bool add_norm_supported(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& residual_bias,
    const at::Tensor& weight,
    const at::Tensor& bias,
    at::ScalarType y_dtype);

struct AddNormOutputs {
  at::Tensor sum; // undefined without a residual
  at::Tensor y, mean, rstd;
};

AddNormOutputs cuda_add_norm_forward(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& residual_bias,
    const at::Tensor& weight,
    const at::Tensor& bias,
    double eps,
    at::ScalarType y_dtype);

/// {dx, dresidual (residual_dtype; undefined if none), dweight, dbias,
/// dresidual_bias (residual_bias_dtype: dresidual's column sums; undefined
/// if none)}.
std::vector<at::Tensor> cuda_add_norm_backward(
    const at::Tensor& sum,
    const at::Tensor& weight,
    const at::Tensor& mean,
    const at::Tensor& rstd,
    const at::Tensor& dy,
    const at::Tensor& dsum,
    std::optional<at::ScalarType> residual_dtype,
    bool want_bias,
    std::optional<at::ScalarType> residual_bias_dtype);

} // namespace lamp::nn::detail
