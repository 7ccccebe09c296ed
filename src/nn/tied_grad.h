#pragma once

// Internal: how a tied LM head hands its weight gradient to the token
// embedding that shares the weight, so that the embedding adds its rows
// into it in place (Note [A tied embedding's gradient] in embedding.cpp).
// lamp::nn::embedding offers a slot in its forward call;
// lamp::nn::linear_cross_entropy takes it in its own, with the same weight,
// and fills it in its backward.

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <mutex>

namespace lamp::nn::detail {

struct TiedGradSlot : torch::CustomClassHolder {
  std::mutex mutex;
  // The head's gradient for the weight, from the head's backward to the end
  // of that backward pass (or until the embedding takes it).
  at::Tensor grad;
};

/// A new slot for `weight`, which the next `take_tied_grad_slot(weight)` on
/// this thread returns (while the weight keeps its version and history).
c10::intrusive_ptr<TiedGradSlot> offer_tied_grad_slot(const at::Tensor& weight);

/// The slot the last embedding on this thread offered for this very weight,
/// taken (a second call gets null), or null.
c10::intrusive_ptr<TiedGradSlot> take_tied_grad_slot(const at::Tensor& weight);

/// Puts `grad` in the slot until the current backward pass ends (a callback
/// of autograd's engine empties it then). Call from a backward function.
void hand_tied_grad(
    const c10::intrusive_ptr<TiedGradSlot>& slot,
    const at::Tensor& grad);

/// The gradient handed in this backward pass, taken (the slot is empty
/// after), or undefined if none was handed yet.
at::Tensor take_tied_grad(const c10::intrusive_ptr<TiedGradSlot>& slot);

/// How many times, in this process, an embedding's backward added into a
/// head's gradient (for tests: that the path was taken).
int64_t tied_grad_adds();
void count_tied_grad_add();

} // namespace lamp::nn::detail
