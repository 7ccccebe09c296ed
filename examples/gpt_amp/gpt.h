#pragma once

// GPT-2 as nanoGPT's model.py and llm.c's train_gpt2 have it: pre-LN
// blocks, causal self-attention (lamp::nn::qkv_attention: cuDNN's fused
// attention on a GPU), a GELU (tanh) MLP, learned positions, and the
// LM head tied to the token embedding. Module names are nanoGPT's (without
// its `transformer.` prefix), so benchmarks/gpt2.py loads lamp's checkpoints
// with load_state_dict(strict=True).

#include <lamp/lamp.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace gpt {

struct Config {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  int64_t vocab_size = 50304; // GPT-2's 50,257 padded to a multiple of 64
  int64_t block_size = 1024;
  double dropout = 0.0;
};

/// The sizes of `name`: gpt2 (124M), gpt2-medium (350M), gpt2-large
/// (774M), gpt2-xl (1.5B), or tiny (a CPU-sized model on bytes).
inline std::optional<Config> config_of(const std::string& name) {
  if (name == "gpt2") {
    return Config{12, 12, 768};
  }
  if (name == "gpt2-medium") {
    return Config{24, 16, 1024};
  }
  if (name == "gpt2-large") {
    return Config{36, 20, 1280};
  }
  if (name == "gpt2-xl") {
    return Config{48, 25, 1600};
  }
  if (name == "tiny") {
    return Config{2, 2, 64, 256, 64};
  }
  return std::nullopt;
}

/// A bias-free linear layer over a weight registered elsewhere too: the LM
/// head, tied to the token embedding. Its `weight` is a second name for the
/// same tensor (LibTorch's parameters() lists it twice; lamp treats it as
/// one parameter, as Python does).
struct TiedHeadImpl : torch::nn::Module {
  // [snippet tied-head]
  explicit TiedHeadImpl(const torch::Tensor& shared) {
    weight = register_parameter("weight", shared);
  }
  // [end snippet]
  torch::Tensor forward(const torch::Tensor& x) {
    return lamp::nn::linear(x, weight);
  }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Config& c)
      : n_head(c.n_head), dropout(c.dropout) {
    c_attn =
        register_module("c_attn", lamp::nn::Linear(c.n_embd, 3 * c.n_embd));
    c_proj = register_module("c_proj", lamp::nn::Linear(c.n_embd, c.n_embd));
    resid_dropout =
        register_module("resid_dropout", torch::nn::Dropout(c.dropout));
  }
  /// Without c_proj's bias where `skip_bias` (the block adds it: see
  /// BlockImpl::skips_biases).
  torch::Tensor forward(const torch::Tensor& x, bool skip_bias = false) {
    // Python: split c_attn's output into q, k and v, their heads, and
    // F.scaled_dot_product_attention(q, k, v, is_causal=True); here with
    // the gradients of q, k and v written into one tensor on a GPU.
    auto y = lamp::nn::qkv_attention(
        c_attn(x), n_head, /*is_causal=*/true, is_training() ? dropout : 0.0);
    return skip_bias ? c_proj->forward_skip_bias(y) : resid_dropout(c_proj(y));
  }
  int64_t n_head;
  double dropout;
  lamp::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const Config& c) {
    c_fc = register_module("c_fc", lamp::nn::Linear(c.n_embd, 4 * c.n_embd));
    c_proj =
        register_module("c_proj", lamp::nn::Linear(4 * c.n_embd, c.n_embd));
    dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x, bool skip_bias = false) {
    // c_proj(gelu(c_fc(x), "tanh")), the GELU in the GEMMs' epilogues on a
    // GPU (lamp/nn/gelu_mlp.h). Its output is the block's `pending`, which
    // the next block adds: a checkpoint's recompute needs it as a root
    // only, and skips c_proj's GEMM (a quarter of the block's forward
    // GEMMs). Dropout keeps its mask, not its input.
    auto y = lamp::nn::gelu_mlp(
        x,
        c_fc,
        c_proj,
        lamp::nn::GeluMlpOptions()
            .skip_output_in_recompute(true)
            .skip_proj_bias(skip_bias));
    return skip_bias ? y : dropout(y);
  }
  lamp::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Config& c) {
    ln_1 = register_module(
        "ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    attn = register_module("attn", Attention(c));
    ln_2 = register_module(
        "ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    mlp = register_module("mlp", Mlp(c));
  }
  /// Whether the projections leave their biases to the residual adds
  /// (lamp::nn::bias_add_layer_norm, which sums their gradients in the
  /// LayerNorm backward's pass): on a GPU without dropout (dropout applies
  /// to the biased output). On the CPU the layers add them, as Python's.
  bool skips_biases(const torch::Tensor& h) const {
    return h.is_cuda() && (attn->dropout == 0.0 || !is_training());
  }

  /// The bias of this block's `pending` output where skips_biases(h),
  /// else undefined.
  torch::Tensor pending_bias(const torch::Tensor& h) const {
    return skips_biases(h) ? mlp->c_proj->bias : torch::Tensor();
  }

  /// `h` is the residual stream and `pending` the previous block's MLP
  /// output, not yet added to it (undefined before the first block), with
  /// its bias `pending_bias` where the previous block left it out: each
  /// add runs in one kernel with the LayerNorm after it
  /// (lamp::nn::add_layer_norm). Returns the stream and this block's MLP
  /// output, pending likewise (its bias: pending_bias(h)).
  // [snippet gpt-block]
  std::pair<torch::Tensor, torch::Tensor> forward(
      const torch::Tensor& h,
      const torch::Tensor& pending,
      const torch::Tensor& pending_bias = {}) {
    auto [h1, y1] = add_norm(h, pending, pending_bias, ln_1);
    const bool skip = skips_biases(h);
    auto a = attn->forward(y1, skip);
    auto [h2, y2] =
        add_norm(h1, a, skip ? attn->c_proj->bias : torch::Tensor(), ln_2);
    return {h2, mlp->forward(y2, skip)};
  }
  // [end snippet]

  /// x + (r + r_bias) and the LayerNorm after it; without r_bias x + r.
  static std::pair<torch::Tensor, torch::Tensor> add_norm(
      const torch::Tensor& x,
      const torch::Tensor& r,
      const torch::Tensor& r_bias,
      const torch::nn::LayerNorm& ln) {
    return r_bias.defined()
        ? lamp::nn::bias_add_layer_norm(x, r, r_bias, ln->weight, ln->bias)
        : lamp::nn::add_layer_norm(x, r, ln->weight, ln->bias);
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const Config& c) : config(c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
    drop = register_module("drop", torch::nn::Dropout(c.dropout));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) {
      blocks.push_back(Block(c));
      h->push_back(blocks.back());
    }
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    lm_head = register_module("lm_head", TiedHead(wte->weight));
    init_weights();
  }

  /// The step's (and a recompute's) CastWeightsGuard: the linear layers'
  /// weight gradients written in fp32 by their GEMMs (one pass over the
  /// weights fewer a step; lamp/cast_weights.h).
  static lamp::CastWeightsOptions cast_options() {
    return lamp::CastWeightsOptions().fp32_weight_grads(true);
  }

  /// GPT-2's initialisation (nanoGPT's _init_weights): N(0, 0.02) for
  /// linear and embedding weights, N(0, 0.02 / sqrt(2 n_layer)) for the
  /// projections into the residual stream, zero biases, LayerNorm 1 and 0.
  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const auto& name = item.key();
      auto& p = item.value();
      if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
        p.zero_();
      } else if (name.find("ln_") != std::string::npos) {
        p.fill_(1.0);
      } else if (name.find("c_proj.weight") != std::string::npos) {
        p.normal_(0.0, 0.02 / std::sqrt(2.0 * config.n_layer));
      } else if (name != "lm_head.weight") { // the tied wte.weight
        p.normal_(0.0, 0.02);
      }
    }
  }

  /// The final LayerNorm's output for token ids [B, T]: [B, T, C].
  torch::Tensor hidden(const torch::Tensor& idx) {
    const int64_t t = idx.size(1);
    TORCH_CHECK_VALUE(
        t <= config.block_size,
        "a sequence of ",
        t,
        " tokens is longer than the model's block size, ",
        config.block_size);
    const auto pos = torch::arange(t, idx.options());
    // NOTE: lamp's embedding adds its gradient into the tied head's
    // (lamp::nn::embedding), where wte(idx) would make a second dense one.
    auto x = drop(lamp::nn::embedding(idx, wte->weight) + wpe(pos));
    torch::Tensor pending, pending_bias;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto& block = blocks[i];
      if (is_training() && static_cast<int64_t>(i) < recompute_blocks) {
        // [snippet gpt-checkpoint]
        auto out = lamp::checkpoint(
            [block](const std::vector<torch::Tensor>& in) mutable {
              // The recompute runs in the backward pass, after the step's
              // CastWeightsGuard (main.cpp) has ended: the block's weights
              // cast in one kernel (their gradients written in fp32 by the
              // GEMMs: cast_options), not one by autocast each.
              std::optional<lamp::CastWeightsGuard> cast;
              if (lamp::is_recomputing() &&
                  !lamp::Fp8AutocastGuard::is_enabled()) {
                cast.emplace(*block, in[0].device().type(), cast_options());
              }
              auto [h, y] = block->forward(in[0], in[1], in[2]);
              return std::vector<torch::Tensor>{h, y};
            },
            // NOTE: the previous block's bias as an input, not captured:
            // inside the step's CastWeightsGuard it is a cast whose
            // gradient must flow back through the step's graph.
            {x, pending, pending_bias},
            // Attention's output and statistics kept from the forward
            // call: the recompute skips attention's forward kernel.
            lamp::CheckpointOptions().keep_attention(true));
        // [end snippet]
        x = out[0];
        pending = out[1];
      } else {
        std::tie(x, pending) = block->forward(x, pending, pending_bias);
      }
      pending_bias = block->pending_bias(x);
    }
    return BlockImpl::add_norm(x, pending, pending_bias, ln_f).second;
  }

  /// The mean cross-entropy of predicting `targets` [B, T], without the
  /// logits ever existing whole (lamp::nn::linear_cross_entropy).
  // [snippet gpt-loss]
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) {
    return lamp::nn::linear_cross_entropy(
        hidden(idx), lm_head->weight, targets);
  }
  // [end snippet]

  /// The logits of the last position, [B, V] (for sampling).
  torch::Tensor last_logits(const torch::Tensor& idx) {
    return lm_head(hidden(idx).select(1, -1));
  }

  /// Parameters, each tensor once (not wte's second name): nanoGPT's N for
  /// the model's size and MFU (position embeddings left out).
  int64_t num_params(bool without_positions = true) {
    int64_t n = 0;
    for (const auto& p : parameters()) {
      n += p.numel();
    }
    n -= lm_head->weight.numel(); // listed twice, counted once
    return without_positions ? n - wpe->weight.numel() : n;
  }

  /// AdamW's two groups, as nanoGPT's configure_optimizers: `options`'
  /// weight decay on matrices and embeddings (dim >= 2), none on biases
  /// and LayerNorms.
  std::vector<torch::optim::OptimizerParamGroup> param_groups(
      const torch::optim::AdamWOptions& options) {
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& p : parameters()) {
      if (p.is_same(lm_head->weight) && !decay.empty() &&
          decay.front().is_same(p)) {
        continue; // wte.weight's second name
      }
      (p.dim() >= 2 ? decay : no_decay).push_back(p);
    }
    auto without = std::make_unique<torch::optim::AdamWOptions>(options);
    without->weight_decay(0.0);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(
        std::move(decay),
        std::make_unique<torch::optim::AdamWOptions>(options));
    groups.emplace_back(std::move(no_decay), std::move(without));
    return groups;
  }

  Config config;
  /// Activation checkpointing: the first `recompute_blocks` blocks keep no
  /// activations for the backward pass but recompute them there
  /// (lamp::checkpoint), in training mode.
  int64_t recompute_blocks = 0;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  TiedHead lm_head{nullptr};
};
TORCH_MODULE(Gpt);

} // namespace gpt
