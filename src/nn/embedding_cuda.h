#pragma once

// Internal: lamp::nn::embedding's weight gradient on CUDA: the indices
// sorted (ATen's stable sort), then embedding_kernel.h's kernel. The caller
// (embedding.cpp) checks shapes and dtypes.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lamp::nn::detail {

/// Whether the kernel takes this gradient: a CUDA tensor of fp32, fp16 or
/// bf16.
bool embedding_backward_cuda_applies(const at::Tensor& grad_out);

/// Sets (add: increases) grad_weight's row of each index by the sum of the
/// gradient rows that looked it up, on the current stream; rows of
/// padding_idx (-1: none) stay as they are. grad_out (n, dim) and
/// grad_weight (rows, dim) contiguous of one dtype, indices (n) int64.
void embedding_backward_cuda(
    const at::Tensor& grad_out,
    const at::Tensor& indices,
    const at::Tensor& grad_weight,
    int64_t padding_idx,
    bool add);

} // namespace lamp::nn::detail
