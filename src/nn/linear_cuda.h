#pragma once

// Internal: lamp::nn::linear on CUDA when the bias needs a gradient or the
// weight's is wanted in fp32: ATen's linear forward, ATen's GEMMs for the
// input's and weight's gradients (the latter writing fp32 for the weight's
// fp32 parameter where a CastWeightsGuard asks for it: Note [fp32 weight
// gradients] in amp/fp32_grad_weights.cpp), and lamp's column sums for the
// bias's (Note [The bias gradient of a linear layer] in linear_cuda.cpp).

#include <ATen/core/Tensor.h>

namespace lamp::nn::detail {

/// Whether linear_cuda takes these: a CUDA input of rank 2 or more,
/// contiguous (ATen's one-GEMM case), grad mode on, and a bias that
/// requires grad or a weight with an fp32 gradient parameter
/// (detail::fp32_grad_param). Otherwise at::linear is the whole story.
bool linear_cuda_applies(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias);

/// at::linear(input, weight, bias), autocast as at::linear's.
at::Tensor linear_cuda(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias);

/// A [rows, columns] gradient's column sums, as a linear layer's bias
/// gradient: lamp's column-sum kernel for contiguous, 16-byte aligned
/// fp16/bf16 with columns a multiple of 8 outside grad mode (Note [The bias
/// gradient of a linear layer]), else ATen's sum(0). In the gradient's type.
at::Tensor bias_grad(const at::Tensor& grad2d);

} // namespace lamp::nn::detail
