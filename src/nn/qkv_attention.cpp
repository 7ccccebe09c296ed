#include <lamp/nn/diagnostics.h>
#include <lamp/nn/qkv_attention.h>

#include <lamp/activation_checkpoint.h>
#include <lamp/config.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <string>

#include "../autograd/checkpoint_stash.h"

#if LAMP_WITH_CUDNN_FRONTEND
#include "attention_cudnn.h"
#endif

namespace lamp::nn {
namespace {

thread_local std::string last_fallback_reason;
std::atomic<int64_t> cudnn_calls{0};
std::atomic<int64_t> kept_calls{0};

#if LAMP_WITH_CUDNN_FRONTEND
// The next output and statistics a checkpoint's forward call kept for
// this call of its recompute (Note [a checkpoint's kept tensors]); none
// outside such a recompute or where the forward call kept none.
std::optional<detail::AttentionForward> take_kept(
    lamp::detail::CheckpointStash* stash,
    const at::Tensor& qkv,
    const detail::AttentionProblem& p) {
  if (stash == nullptr || !lamp::is_recomputing() ||
      stash->next + 2 > stash->kept.size()) {
    return std::nullopt;
  }
  const auto& out = stash->kept[stash->next];
  const auto& stats = stash->kept[stash->next + 1];
  stash->next += 2;
  if (out.tensor._version() != out.version ||
      stats.tensor._version() != stats.version) {
    return std::nullopt; // changed in place since: computed afresh
  }
  detail::AttentionForward kept{out.tensor, stats.tensor};
  TORCH_CHECK(
      kept.out.sizes() ==
              c10::IntArrayRef({p.batch, p.seq, p.heads * p.head_dim}) &&
          kept.out.scalar_type() == qkv.scalar_type(),
      "lamp::checkpoint (keep_attention): the recompute's attention call "
      "does not match the forward call's (kept output ",
      kept.out.sizes(),
      " ",
      kept.out.scalar_type(),
      ", recomputed qkv ",
      qkv.sizes(),
      " ",
      qkv.scalar_type(),
      "); fn must compute the same thing both times");
  kept_calls.fetch_add(1, std::memory_order_relaxed);
  return kept;
}
#endif

#if LAMP_WITH_CUDNN_FRONTEND
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class QkvAttentionFunction
    : public torch::autograd::Function<QkvAttentionFunction> {
 public:
  // `kept`: the forward call's output and statistics, where a checkpoint's
  // recompute has them (CheckpointOptions::keep_attention); else computed.
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& qkv,
      // NOTE: not tensor arguments: an undefined tensor cannot be an
      // autograd Function's input, and these need no gradient.
      const std::optional<detail::AttentionForward>& kept,
      int64_t batch,
      int64_t seq,
      int64_t heads,
      int64_t head_dim,
      bool causal,
      double scale) {
    const detail::AttentionProblem p{
        batch, seq, heads, head_dim, causal, static_cast<float>(scale)};
    // The kept output detached: a tensor of its own for autograd to give
    // this node's history (the stash's stays as the forward call made it).
    const auto out = kept
        ? detail::AttentionForward{kept->out.detach(), kept->stats}
        : detail::cudnn_attention_forward(qkv, p);
    ctx->save_for_backward({qkv, out.out, out.stats});
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["seq"] = seq;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["head_dim"] = head_dim;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    return {out.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::qkv_attention: no double backward (backward with "
        "create_graph=true) on the cuDNN path; split qkv and call "
        "at::scaled_dot_product_attention for that");
    const auto saved = ctx->get_saved_variables();
    const detail::AttentionProblem p{
        ctx->saved_data["batch"].toInt(),
        ctx->saved_data["seq"].toInt(),
        ctx->saved_data["heads"].toInt(),
        ctx->saved_data["head_dim"].toInt(),
        ctx->saved_data["causal"].toBool(),
        static_cast<float>(ctx->saved_data["scale"].toDouble())};
    const auto dqkv = detail::cudnn_attention_backward(
        saved[0], {saved[1], saved[2]}, grads[0], p);
    return {dqkv, {}, {}, {}, {}, {}, {}, {}};
  }
};
#endif

} // namespace

torch::Tensor qkv_attention(
    const torch::Tensor& qkv,
    int64_t n_head,
    bool is_causal,
    double dropout_p,
    std::optional<double> scale) {
  TORCH_CHECK_VALUE(
      qkv.defined() && qkv.dim() == 3 && n_head > 0 &&
          qkv.size(2) % (3 * n_head) == 0,
      "lamp::nn::qkv_attention: expected qkv (B, T, 3C) with C a multiple of "
      "n_head (",
      n_head,
      "); got ",
      qkv.defined() ? qkv.sizes() : c10::IntArrayRef{});
  TORCH_CHECK_VALUE(
      dropout_p >= 0.0 && dropout_p < 1.0,
      "lamp::nn::qkv_attention: dropout_p must be in [0, 1); got ",
      dropout_p);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  const int64_t d = c / n_head;
  TORCH_CHECK_VALUE(
      d > 0,
      "lamp::nn::qkv_attention: qkv has no features (",
      qkv.sizes(),
      ")");
  const double softmax_scale =
      scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  // Under autocast ATen's attention runs in the autocast dtype; so does
  // this, whichever path it takes.
  at::Tensor x = qkv;
  const auto device = qkv.device().type();
  if (at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(qkv, device)) {
    x = qkv.to(at::autocast::get_autocast_dtype(device));
  }
#if !LAMP_WITH_CUDNN_FRONTEND
  last_fallback_reason = "lamp was built without its cuDNN graph code";
#else
  const bool wants_grad = x.requires_grad() && at::GradMode::is_enabled();
  auto* const stash = lamp::detail::checkpoint_stash();
  if (dropout_p > 0.0) {
    // NOTE: cuDNN's dropout takes a Philox seed and offset that ATen's
    // generator would have to hand out (and advance inside CUDA graphs);
    // ATen's attention does that already.
    last_fallback_reason = "dropout_p > 0";
  } else {
    const detail::AttentionProblem p{
        b, t, n_head, d, is_causal, static_cast<float>(softmax_scale)};
    // NOTE: a checkpoint's forward call runs without gradients, its
    // recompute with: where the forward call keeps its results, it asks
    // for the backward graph too, so that both take this path or neither.
    last_fallback_reason = detail::cudnn_attention_unsupported(
        x, p, wants_grad || stash != nullptr);
    if (last_fallback_reason.empty()) {
      cudnn_calls.fetch_add(1, std::memory_order_relaxed);
      const c10::impl::ExcludeDispatchKeyGuard no_autocast(
          c10::autocast_dispatch_keyset);
      const auto kept = take_kept(stash, x, p);
      if (!wants_grad) {
        if (kept) {
          return kept->out;
        }
        auto out = detail::cudnn_attention_forward(x, p);
        if (stash != nullptr && !lamp::is_recomputing()) {
          stash->push(out.out);
          stash->push(out.stats);
        }
        return out.out;
      }
      return QkvAttentionFunction::apply(
          x, kept, b, t, n_head, d, is_causal, softmax_scale)[0];
    }
  }
#endif
  // ATen's ops: the Python lines of the header.
  auto parts = x.split(c, 2);
  for (auto& part : parts) {
    part = part.view({b, t, n_head, d}).transpose(1, 2);
  }
  const auto y = at::scaled_dot_product_attention(
      parts[0],
      parts[1],
      parts[2],
      /*attn_mask=*/std::nullopt,
      dropout_p,
      is_causal,
      softmax_scale);
  return y.transpose(1, 2).reshape({b, t, c});
}

namespace detail {

std::string qkv_attention_fallback_reason() {
  return last_fallback_reason;
}

int64_t qkv_attention_cudnn_count() {
  return cudnn_calls.load(std::memory_order_relaxed);
}

int64_t qkv_attention_kept_count() {
  return kept_calls.load(std::memory_order_relaxed);
}

} // namespace detail
} // namespace lamp::nn
