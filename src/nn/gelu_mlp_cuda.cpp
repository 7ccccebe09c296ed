#include "gelu_mlp_cuda.h"

#include "../amp/fp32_grad_weights.h"
#include "linear_cuda.h"
#include "lt_matmul.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <utility>
#include <vector>

// Note [GELU in the GEMMs' epilogues]
// GPT-2's MLP is fc (C -> 4C), GELU (tanh), proj (4C -> C). As three ops,
// the GELU is a kernel of its own each way over the [tokens, 4C] hidden
// activations: forward reads h and writes a = gelu(h); backward reads the
// gradient of a and h and writes the gradient of h. On GPT-2 124M (16 x
// 1,024 tokens, bf16, H100) that is 0.8 + 1.1 ms of a 35 ms step. cuBLASLt
// computes both in the GEMMs' epilogues, on the fp32 accumulator, while
// the tile is still in registers:
// - forward, fc's GEMM with GELU_AUX_BIAS: a = gelu(x W1^T + b1), and
//   h = x W1^T + b1 written beside it (the backward pass needs it, as
//   ATen's GELU saves it);
// - backward, the GEMM for a's gradient with DGELU: dh = (dy W2) *
//   gelu'(h), never writing a's gradient.
// The other GEMMs (proj's forward with its bias epilogue, the weights'
// and the input's gradients) are ATen's, the biases' gradients lamp's
// column sums (Note [The bias gradient of a linear layer]); cuBLASLt's
// DGELU_BGRAD epilogue, which would sum the fc bias's gradient too, made
// the step 2.7 ms slower on an H100. Memory: a and h are saved, as the
// three ops save them. This is llm.c's gelu_fusion.

namespace lamp::nn::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool half_type(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf;
}

// fc's GEMM with the GELU_AUX_BIAS epilogue: a = gelu(h), h = x W1^T + b1
// (the two ops where cuBLASLt declines). The training forward and the
// no-grad one both call it, so that their values are the same bits.
std::pair<at::Tensor, at::Tensor> hidden_of(
    const at::Tensor& x,
    const at::Tensor& w1,
    const at::Tensor& b1) {
  const auto x2 = x.view({-1, w1.size(1)});
  at::Tensor h = at::empty({x2.size(0), w1.size(0)}, x.options());
  at::Tensor a = at::empty_like(h);
  if (!lt_matmul(a, x2, false, w1, true, LtEpilogue::kGeluAuxBias, h, b1)) {
    h = at::linear(x2, w1, b1);
    a = at::gelu(h, "tanh");
  }
  return {a, h};
}

std::vector<int64_t> output_sizes(const at::Tensor& x, const at::Tensor& w2) {
  auto sizes = x.sizes().vec();
  sizes.back() = w2.size(0);
  return sizes;
}

// The fp32 parameter behind a weight (Note [fp32 weight gradients]), or
// nothing.
std::optional<at::Tensor> param_of(const at::Tensor& weight) {
  auto p = lamp::detail::fp32_grad_param(weight);
  return p.defined() ? std::optional<at::Tensor>(std::move(p)) : std::nullopt;
}

class GeluMlpFunction : public torch::autograd::Function<GeluMlpFunction> {
 public:
  // Inputs: x, w1, b1, w2, b2, skip_output, then p1 and p2: the fp32
  // parameters that w1 and w2 are the casts of where they get their
  // gradients in fp32 (Note [fp32 weight gradients]; w1 or w2 is then
  // detached), else nothing.
  static constexpr size_t kP1 = 6, kP2 = 7;

  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& x,
      const at::Tensor& w1,
      const at::Tensor& b1,
      const at::Tensor& w2,
      // NOTE: optional, not undefined: apply() asks every tensor argument
      // for its device. None: GeluMlpOptions::skip_proj_bias.
      const std::optional<at::Tensor>& maybe_b2,
      bool skip_output,
      const std::optional<at::Tensor>& p1,
      const std::optional<at::Tensor>& p2) {
    const at::Tensor b2 = maybe_b2.value_or(at::Tensor());
    auto [a, h] = hidden_of(x, w1, b1);
    ctx->save_for_backward(
        {x,
         w1,
         b1,
         w2,
         b2,
         a,
         h,
         p1.value_or(at::Tensor()),
         p2.value_or(at::Tensor())});
    if (skip_output) {
      // GeluMlpOptions::skip_output_in_recompute: backward reads a and h,
      // never the output, whose values nothing reads.
      return at::empty(output_sizes(x, w2), x.options());
    }
    return at::linear(a, w2, b2).view(output_sizes(x, w2));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w1 = saved[1];
    const at::Tensor& w2 = saved[3];
    const at::Tensor& a = saved[5];
    const at::Tensor& h = saved[6];
    const at::Tensor& dy = grads[0];
    variable_list out(8);
    if (!dy.defined()) {
      return out;
    }
    if (at::GradMode::is_enabled()) {
      return double_backward(saved, dy);
    }
    // Where each weight's gradient goes: its own slot, or its fp32
    // parameter's.
    const bool fp32_1 = saved[7].defined(), fp32_2 = saved[8].defined();
    const size_t g1 = fp32_1 ? kP1 : 1, g2 = fp32_2 ? kP2 : 3;
    // NOTE: needs_input_grad counts the tensor arguments given (not the
    // flag, not an empty optional), the gradients returned every argument.
    size_t next = saved[4].defined() ? 5 : 4;
    const size_t n1 = fp32_1 ? next++ : 1;
    const size_t n2 = fp32_2 ? next++ : 3;
    const auto dy2 = dy.reshape({-1, w2.size(0)}).contiguous();
    if (saved[4].defined() && ctx->needs_input_grad(4)) {
      out[4] = bias_grad(dy2);
    }
    if (ctx->needs_input_grad(n2)) {
      out[g2] = lamp::detail::weight_grad(dy2, a, fp32_2);
    }
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(n1) &&
        !ctx->needs_input_grad(2)) {
      return out;
    }
    at::Tensor dh = at::empty_like(h);
    if (!lt_matmul(dh, dy2, false, w2, false, LtEpilogue::kDGelu, h)) {
      dh = at::gelu_backward(dy2.mm(w2), h, "tanh");
    }
    if (ctx->needs_input_grad(2)) {
      out[2] = bias_grad(dh);
    }
    const auto x2 = x.view({-1, w1.size(1)});
    if (ctx->needs_input_grad(n1)) {
      out[g1] = lamp::detail::weight_grad(dh, x2, fp32_1);
    }
    if (ctx->needs_input_grad(0)) {
      out[0] = dh.mm(w1).view(x.sizes());
    }
    return out;
  }

 private:
  // A gradient that is itself differentiated (create_graph): the three ops
  // again, from the saved inputs (a weight whose fp32 parameter gets its
  // gradient: that parameter cast again), and their gradients with a
  // graph.
  static variable_list double_backward(
      const variable_list& saved,
      const at::Tensor& dy) {
    // The five operands and, for each, the tensor and slot its gradient is
    // for.
    variable_list operands(saved.begin(), saved.begin() + 5);
    variable_list targets = operands;
    size_t slot[5] = {0, 1, 2, 3, 4};
    for (const auto& [w, p, k] :
         {std::tuple<size_t, size_t, size_t>{1, 7, kP1}, {3, 8, kP2}}) {
      if (saved[p].defined()) {
        operands[w] = saved[p].to(saved[w].scalar_type());
        targets[w] = saved[p];
        slot[w] = k;
      }
    }
    const auto y = at::linear(
        at::gelu(at::linear(operands[0], operands[1], operands[2]), "tanh"),
        operands[3],
        operands[4]);
    variable_list inputs;
    std::vector<size_t> which;
    for (size_t i = 0; i < 5; ++i) {
      if (targets[i].defined() && targets[i].requires_grad()) {
        inputs.push_back(targets[i]);
        which.push_back(slot[i]);
      }
    }
    variable_list out(8);
    if (inputs.empty()) {
      return out;
    }
    const auto g = torch::autograd::grad(
        {y},
        inputs,
        {dy},
        /*retain_graph=*/true,
        /*create_graph=*/true,
        /*allow_unused=*/true);
    for (size_t j = 0; j < which.size(); ++j) {
      out[which[j]] = g[j];
    }
    return out;
  }
};

} // namespace

bool gelu_mlp_cuda_applies(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias) {
  // proj_bias may be undefined (GeluMlpOptions::skip_proj_bias).
  std::vector<const at::Tensor*> all{
      &input, &fc_weight, &fc_bias, &proj_weight};
  if (proj_bias.defined()) {
    all.push_back(&proj_bias);
  }
  for (const auto* t : all) {
    if (!t->defined() || !t->is_cuda() || t->device() != input.device()) {
      return false;
    }
  }
  if (input.dim() < 2 || !input.is_contiguous() || input.numel() == 0 ||
      fc_weight.dim() != 2 || fc_bias.dim() != 1 || proj_weight.dim() != 2 ||
      (proj_bias.defined() && proj_bias.dim() != 1)) {
    return false;
  }
  const int64_t c = fc_weight.size(1);
  const int64_t hidden = fc_weight.size(0);
  const int64_t out = proj_weight.size(0);
  if (input.size(-1) != c || fc_bias.size(0) != hidden ||
      proj_weight.size(1) != hidden ||
      (proj_bias.defined() && proj_bias.size(0) != out) || c % 8 != 0 ||
      hidden % 8 != 0 || out % 8 != 0) {
    return false;
  }
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    // NOTE: autocast casts fp32 only: a double (or other) operand would
    // reach the GEMMs as it is.
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    for (const auto* t : all) {
      if (t->scalar_type() != at::kFloat && t->scalar_type() != dtype) {
        return false;
      }
    }
    return half_type(dtype);
  }
  for (const auto* t : all) {
    if (t->scalar_type() != input.scalar_type()) {
      return false;
    }
  }
  return half_type(input.scalar_type());
}

at::Tensor gelu_mlp_cuda(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias,
    bool skip_output) {
  const auto p1 = param_of(fc_weight), p2 = param_of(proj_weight);
  at::Tensor x = input, w1 = fc_weight, b1 = fc_bias, w2 = proj_weight,
             b2 = proj_bias;
  // Autocast's policy for linear (lower_precision_fp), as linear_cuda's.
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    x = at::autocast::cached_cast(dtype, input, at::kCUDA);
    w1 = at::autocast::cached_cast(dtype, fc_weight, at::kCUDA);
    b1 = at::autocast::cached_cast(dtype, fc_bias, at::kCUDA);
    w2 = at::autocast::cached_cast(dtype, proj_weight, at::kCUDA);
    b2 = at::autocast::cached_cast(dtype, proj_bias, at::kCUDA);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  w1 = w1.contiguous();
  b1 = b1.contiguous();
  w2 = w2.contiguous();
  if (b2.defined()) {
    b2 = b2.contiguous();
  }
  const bool wants_grad = at::GradMode::is_enabled() &&
      (x.requires_grad() || w1.requires_grad() || b1.requires_grad() ||
       w2.requires_grad() || (b2.defined() && b2.requires_grad()));
  if (!wants_grad) {
    // An evaluation, or a checkpoint's forward call: the training
    // forward's GEMMs and epilogue (the same values), nothing saved.
    const auto a = hidden_of(x, w1, b1).first;
    return at::linear(a, w2, b2).view(output_sizes(x, w2));
  }
  // A weight whose fp32 parameter gets its gradient: the cast's own node
  // gets none from this layer.
  return GeluMlpFunction::apply(
      x,
      p1 ? w1.detach() : w1,
      b1,
      p2 ? w2.detach() : w2,
      b2.defined() ? std::optional<at::Tensor>(b2) : std::nullopt,
      skip_output,
      p1,
      p2);
}

} // namespace lamp::nn::detail
