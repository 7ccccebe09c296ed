#pragma once

// Internal: self-attention over packed q/k/v ([B, T, 3C], as a GPT's
// c_attn writes it) through cuDNN's SDPA graphs (lamp::nn::qkv_attention).
// Only with LAMP_WITH_CUDNN_FRONTEND.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace lamp::nn::detail {

// One problem: qkv's sizes, the heads, the mask and the scale.
struct AttentionProblem {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool causal = true;
  float scale = 1.0F;
};

// Why cuDNN's graphs cannot take `qkv` for `p` (the device, the dtype, the
// layout, cuDNN's own verdict on the forward and, when `backward`, on the
// backward graph, each planned once per problem); empty when they can.
std::string cudnn_attention_unsupported(
    const at::Tensor& qkv,
    const AttentionProblem& p,
    bool backward);

// The forward: out [B, T, C] (heads side by side, as c_proj reads it) and
// the softmax's log-sum-exp per row [B, H, T, 1] (fp32) for the backward.
struct AttentionForward {
  at::Tensor out, stats;
};
AttentionForward cudnn_attention_forward(
    const at::Tensor& qkv,
    const AttentionProblem& p);

// The backward: the gradient of qkv, [B, T, 3C], dQ, dK and dV written by
// cuDNN into their places in one buffer (no concatenation after).
at::Tensor cudnn_attention_backward(
    const at::Tensor& qkv,
    const AttentionForward& saved,
    const at::Tensor& grad_out,
    const AttentionProblem& p);

} // namespace lamp::nn::detail
