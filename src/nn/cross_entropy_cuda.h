#pragma once

// Internal: lamp::nn::linear_cross_entropy's softmax cross-entropy of one
// chunk of logits on CUDA (cross_entropy_kernel.cu).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lamp::nn::detail {

/// Overwrites `logits` (rows x classes, CUDA, fp32/fp16/bf16, unit stride
/// along classes) with softmax(logits) - one_hot(target) (zeros in rows
/// whose target is `ignore_index`) and writes each row's cross-entropy to
/// `loss` (fp32, rows; 0 for ignored rows, NaN for targets out of range).
/// Returns false (and does nothing) where the kernel does not apply.
bool cuda_softmax_xent_grad_(
    at::Tensor& logits,
    const at::Tensor& target,
    int64_t ignore_index,
    at::Tensor& loss);

} // namespace lamp::nn::detail
