#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <utility>

namespace lamp::nn {

/// A pre-LN transformer's residual add and the LayerNorm after it, in one
/// pass: `sum = x + residual`, `y = layer_norm(sum, {C}, weight, bias,
/// eps)`, returned as `{sum, y}` (Python: `s = x + r; y = F.layer_norm(s,
/// (C,), w, b, eps)`). `residual` may be undefined: then `sum` is `x` and
/// only the LayerNorm runs.
///
/// Why: in a GPT's bf16 step the residual stream is fp32, and each block
/// adds its attention and MLP outputs to it and normalises it: an add, a
/// LayerNorm and a cast to bf16 for the next GEMM forward, and in backward
/// the LayerNorm's input gradient, its weight's and bias's (ATen's column
/// reduction), and an add of the two gradients of the stream. On CUDA this
/// is one kernel forward (it reads x and the residual, writes the sum and
/// y, already in autocast's dtype) and one plus a small reduction backward
/// (it adds the sum's own gradient and writes both inputs' gradients).
///
/// `x` is (..., C), float32, with C <= 2048 on CUDA; `residual` of x's
/// shape (any floating dtype: a GEMM's bf16 output under autocast),
/// `weight` and `bias` (C) float32 (`bias` may be undefined). Under
/// `AutocastGuard` y is in autocast's dtype (LayerNorm computed in fp32 and
/// rounded once, as Python's fp32 LayerNorm followed by the next GEMM's
/// cast); otherwise x's. `sum` is x's dtype. Elsewhere (the CPU, other
/// dtypes, wider rows) ATen's ops compute the same. Gradients equal
/// Python's within fp32 rounding; no double backward.
///
/// Example (GPT-2's blocks, each add fused with the LayerNorm after it):
/// \code
///   auto [h, y] = lamp::nn::add_layer_norm(h, mlp_out, ln->weight, ln->bias);
/// \endcode
LAMP_API std::pair<torch::Tensor, torch::Tensor> add_layer_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    double eps = 1e-5);

/// `add_layer_norm` with the residual branch's bias added here: `sum = x +
/// (residual + residual_bias)` (the inner add in float32), then `y =
/// layer_norm(sum, ...)`, returned as `{sum, y}`. For a linear layer whose
/// output is the residual, computed without its bias (`lamp::nn::linear(h,
/// w)`, `gelu_mlp` with an undefined `proj_bias`), whose bias is then
/// `residual_bias`. Python's twin: Megatron-LM's bias-dropout-add fusion
/// (`bias_dropout_add`, dropout 0) before the LayerNorm.
///
/// Why: the bias's gradient is the column sum of the residual's gradient,
/// which the backward's row kernel writes: it sums it in the same pass (a
/// GPT block's attention and MLP projections' bias gradients, otherwise a
/// reduction over the whole gradient each). Not Python's values bit for
/// bit under autocast: there the GEMM adds the bias before rounding its
/// output to bf16, here after (the sum's difference is one bf16 rounding
/// of the residual's, as between cuBLAS's epilogue and a separate add).
///
/// `residual` is required (like x); `residual_bias` (C) fp32, fp16 or bf16;
/// its gradient is in its dtype. Elsewhere ATen's ops compute the same
/// (the CPU: bit for bit those above).
///
/// Example (a GPT block's attention, its projection's bias added here):
/// \code
///   auto a = lamp::nn::linear(attn, c_proj->weight);
///   auto [h2, y2] = lamp::nn::bias_add_layer_norm(
///       h, a, c_proj->bias, ln_2->weight, ln_2->bias);
/// \endcode
LAMP_API std::pair<torch::Tensor, torch::Tensor> bias_add_layer_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& residual_bias,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    double eps = 1e-5);

} // namespace lamp::nn
