#include <lamp/nn/embedding.h>

#include <lamp/config.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <utility>

#include "tied_grad.h"

#if LAMP_WITH_CUDA
#include "embedding_cuda.h"
#endif

namespace lamp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

// Note [A tied embedding's gradient]
// GPT-2's token embedding and LM head share one weight W (V, C). Autograd
// gives W's accumulator one gradient from each use and adds them: ATen's
// embedding backward zeroes a (V, C) tensor and writes the looked-up rows'
// sums into it, the head's backward returns its own dense (V, C) gradient,
// and the engine adds the two (for GPT-2, three passes over 154 MB of fp32
// besides the zeroing). Here the embedding adds its rows' sums into the
// head's gradient instead and returns none for W, so W receives that one
// tensor, with the values of the sum (each row's sum rounded to the
// dtype, then added, as the engine adds).
//
// How they meet: the embedding's forward call offers a slot for W
// (tied_grad.h); the head (linear_cross_entropy) called later in the
// forward pass with the same W, at the same version and history, takes
// it; the head's backward puts its gradient in it, and the embedding's
// backward takes it from there. That is in place on a tensor autograd
// still holds for W's accumulator and has not yet used: the accumulator
// (or whatever node consumes W's gradient) waits for every use of W,
// the embedding's included, before it reads its inputs. If the embedding's
// backward runs first (the head's input does not depend on the
// embedding), the slot is empty and it returns its own gradient; the
// head's gradient left in the slot is dropped when the backward pass ends
// (an engine callback), so it is never added into in a later pass.
// And W used a third time (a penalty on it, a second head): once a third
// gradient arrives, the engine sums it with the head's into a new tensor
// (or into the third one), and the head's is no longer what W receives.
// So the embedding adds in place only while the head's gradient has no
// holder but the engine's buffer and itself; else it returns its own.
// The backward functions of one device run on one engine thread; the
// slot's mutex orders them where they do not.

class EmbeddingFunction : public torch::autograd::Function<EmbeddingFunction> {
 public:
  static Variable forward(
      AutogradContext* ctx,
      const Variable& weight,
      const Variable& indices,
      int64_t padding_idx,
      c10::intrusive_ptr<detail::TiedGradSlot> slot) {
    ctx->save_for_backward({indices});
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["num_weights"] = weight.size(0);
    if (slot) {
      ctx->saved_data["slot"] = c10::IValue::make_capsule(std::move(slot));
    }
    return at::embedding(weight, indices, padding_idx);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(4);
    const auto& grad = grads[0];
    if (!grad.defined() || !ctx->needs_input_grad(0)) {
      return out;
    }
    const auto indices = ctx->get_saved_variables()[0].reshape({-1});
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    const int64_t rows = ctx->saved_data["num_weights"].toInt();
    const int64_t dim = grad.size(-1);
    at::Tensor tied;
    if (ctx->saved_data.count("slot")) {
      tied = detail::take_tied_grad(
          c10::static_intrusive_pointer_cast<detail::TiedGradSlot>(
              ctx->saved_data["slot"].toCapsule()));
    }
    // NOTE: only a gradient laid out as this one's own would be, and only
    // while autograd's buffer for W still holds it (with `tied`, its only
    // holders): where a third use of W gave W another gradient, the engine
    // has summed the two into another tensor (see the Note).
    const bool into = tied.defined() && tied.use_count() == 2 &&
        tied.dim() == 2 && tied.size(0) == rows && tied.size(1) == dim &&
        tied.scalar_type() == grad.scalar_type() &&
        tied.device() == grad.device() && tied.is_contiguous() &&
        tied.layout() == at::kStrided;
#if LAMP_WITH_CUDA
    if (detail::embedding_backward_cuda_applies(grad)) {
      const auto g = grad.reshape({-1, dim}).contiguous();
      if (into) {
        detail::embedding_backward_cuda(g, indices, tied, padding_idx, true);
        detail::count_tied_grad_add();
        return out;
      }
      out[0] = at::zeros({rows, dim}, grad.options());
      detail::embedding_backward_cuda(g, indices, out[0], padding_idx, false);
      return out;
    }
#endif
    auto dense = at::embedding_dense_backward(
        grad, indices, rows, padding_idx, /*scale_grad_by_freq=*/false);
    if (into) {
      tied.add_(dense);
      detail::count_tied_grad_add();
      return out;
    }
    out[0] = std::move(dense);
    return out;
  }
};

} // namespace

torch::Tensor embedding(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    std::optional<int64_t> padding_idx) {
  const char* name = "lamp::nn::embedding";
  TORCH_CHECK_VALUE(
      input.defined() && weight.defined() && weight.dim() == 2,
      name,
      ": expected indices and a 2-D weight (num_embeddings, dim), got ",
      weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK_VALUE(
      input.scalar_type() == at::kLong || input.scalar_type() == at::kInt,
      name,
      ": expected int64 or int32 indices, got ",
      input.scalar_type());
  const int64_t rows = weight.size(0);
  int64_t pad = -1;
  if (padding_idx) {
    TORCH_CHECK_VALUE(
        *padding_idx < rows && *padding_idx >= -rows,
        name,
        ": padding_idx must be within num_embeddings (",
        rows,
        "), got ",
        *padding_idx);
    pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  c10::intrusive_ptr<detail::TiedGradSlot> slot;
  if (at::GradMode::is_enabled() && weight.requires_grad()) {
    slot = detail::offer_tied_grad_slot(weight);
  }
  return EmbeddingFunction::apply(
      weight, input.to(at::kLong), pad, std::move(slot));
}

} // namespace lamp::nn
