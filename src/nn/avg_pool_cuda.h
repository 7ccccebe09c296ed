#pragma once

// Internal: lamp::nn::global_avg_pool2d with lamp's channels-last backward
// kernel (avg_pool_kernel.cu).

#include <ATen/core/Tensor.h>

#include <optional>

namespace lamp::nn::detail {

/// The mean over H and W of a 4-D channels-last fp32/fp16/bf16 CUDA `input`
/// (N x C x 1 x 1, strides as ATen's adaptive_avg_pool2d gives) as an
/// autograd function whose backward writes a channels-last gradient.
/// Returns nullopt, having run nothing, when the input is not for it.
std::optional<at::Tensor> cuda_global_avg_pool2d(const at::Tensor& input);

} // namespace lamp::nn::detail
