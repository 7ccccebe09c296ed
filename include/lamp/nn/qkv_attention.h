#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>
#include <optional>

namespace lamp::nn {

/// Multi-head self-attention over packed projections: `qkv` is (B, T, 3C),
/// the query, key and value of each token side by side as a GPT's fused
/// q/k/v projection (`c_attn`) writes them, each split into `n_head` heads
/// of C / n_head; returns (B, T, C), the heads side by side again (the
/// output projection's input). Python:
/// \code{.py}
///   q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, 2))
///   y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
///                                      is_causal=is_causal, scale=scale)
///   y = y.transpose(1, 2).reshape(B, T, C)
/// \endcode
///
/// Why: ATen's flash and cuDNN attention kernels return the gradients of
/// q, k and v in three buffers, which the split's backward then copies
/// into one for the projection's GEMMs: on GPT-2 124M at batch 16 x 1,024
/// that copy is 0.6 ms of a 33 ms step (H100). On CUDA in bf16 or fp16
/// (under `AutocastGuard` an fp32 `qkv` is cast first, as ATen's attention
/// is) lamp runs cuDNN's fused attention through graphs of its own that
/// read q, k and v where they lie and write their gradients into one
/// (B, T, 3C) tensor: the same kernels as ATen's cuDNN attention, without
/// the copy. Elsewhere, with `dropout_p` > 0, or where cuDNN has no plan
/// for the shape (the head size must be a multiple of 8; cuDNN decides the
/// rest, asked once per shape), it runs the Python lines above with ATen's
/// ops. No double backward on the cuDNN path. The first call with a shape
/// plans cuDNN's graphs, so it must not be inside a CUDA graph capture
/// (`GraphedStep`'s warm-up steps make that call).
///
/// \param qkv (B, T, 3C), C a multiple of `n_head`.
/// \param n_head the number of heads.
/// \param is_causal each token attends only to itself and earlier ones.
/// \param dropout_p the attention weights' dropout (training only; pass
///   0.0 in evaluation, as Python's modules do).
/// \param scale the softmax's scale; default 1 / sqrt(C / n_head).
///
/// Example (GPT-2's attention):
/// \code
///   auto y = lamp::nn::qkv_attention(c_attn(x), n_head);  // [B, T, C]
///   return c_proj(y);
/// \endcode
LAMP_API torch::Tensor qkv_attention(
    const torch::Tensor& qkv,
    int64_t n_head,
    bool is_causal = true,
    double dropout_p = 0.0,
    std::optional<double> scale = std::nullopt);

} // namespace lamp::nn
