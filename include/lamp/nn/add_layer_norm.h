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

} // namespace lamp::nn
