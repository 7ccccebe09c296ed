#pragma once

// Internal: lamp::nn::gelu_mlp on CUDA, with cuBLASLt's GELU epilogues
// (Note [GELU in the GEMMs' epilogues] in gelu_mlp_cuda.cpp).

#include <ATen/core/Tensor.h>

namespace lamp::nn::detail {

/// Whether gelu_mlp_cuda takes these: CUDA tensors on one device, a
/// contiguous input of rank 2 or more, 2-D weights and 1-D biases of
/// matching shapes, widths a multiple of 8, bf16 or fp16 (or autocast to
/// one).
bool gelu_mlp_cuda_applies(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias);

/// gelu_mlp with the epilogues, autocast as at::linear's; with
/// `skip_output`, the second GEMM left out (GeluMlpOptions).
at::Tensor gelu_mlp_cuda(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias,
    bool skip_output);

} // namespace lamp::nn::detail
