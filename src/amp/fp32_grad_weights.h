#pragma once

// Internal: the weights whose gradients lamp's linear layers compute in
// fp32 for their parameter (CastWeightsOptions::fp32_weight_grads; Note
// [fp32 weight gradients] in fp32_grad_weights.cpp).

#include <ATen/core/Tensor.h>

#include <vector>

namespace lamp::detail {

/// The fp32 parameter that `weight` is the cast of, where a live
/// CastWeightsGuard with fp32_weight_grads made that cast on this thread;
/// undefined otherwise (also for an undefined `weight`).
at::Tensor fp32_grad_param(const at::Tensor& weight);

/// For CastWeightsGuard: makes fp32_grad_param(casts[i]) return params[i]
/// on this thread until unregister_fp32_grad_weights(casts).
void register_fp32_grad_weights(
    const std::vector<at::Tensor>& casts,
    const std::vector<at::Tensor>& params);

/// Ends what register_fp32_grad_weights(casts, ...) began.
void unregister_fp32_grad_weights(const std::vector<at::Tensor>& casts);

/// A weight's gradient from the GEMM grad^T · input ([rows, out] and
/// [rows, in] 2-D operands): in fp32 straight from the GEMM's accumulator
/// where `fp32` (ATen's mm with an fp32 out_dtype on CUDA for fp16/bf16
/// operands outside grad mode; elsewhere, and for a backward with
/// create_graph, the operands' fp32 values multiplied), else in the
/// operands' type as ATen's linear backward computes it.
at::Tensor weight_grad(
    const at::Tensor& grad2d,
    const at::Tensor& input2d,
    bool fp32);

} // namespace lamp::detail
