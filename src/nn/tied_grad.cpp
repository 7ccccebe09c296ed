#include "tied_grad.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

namespace lamp::nn::detail {
namespace {

struct Offer {
  c10::weak_intrusive_ptr<c10::TensorImpl> weight;
  // The weight's version and history when offered: an in-place change
  // between the embedding and the head gives the head's gradient another
  // path back, where the embedding could not add into it.
  int64_t version = 0;
  const torch::autograd::Node* grad_fn = nullptr;
  c10::weak_intrusive_ptr<TiedGradSlot> slot;
};

// NOTE: thread-local: a model's forward (embedding, then head) runs on one
// thread; the backward functions meet through the slot, not through this.
thread_local std::vector<Offer> offers;

std::atomic<int64_t> adds{0};

void drop_dead_offers() {
  offers.erase(
      std::remove_if(
          offers.begin(),
          offers.end(),
          [](const Offer& o) {
            return o.weight.expired() || o.slot.expired();
          }),
      offers.end());
}

} // namespace

c10::intrusive_ptr<TiedGradSlot> offer_tied_grad_slot(
    const at::Tensor& weight) {
  drop_dead_offers();
  auto slot = c10::make_intrusive<TiedGradSlot>();
  Offer offer{
      c10::weak_intrusive_ptr<c10::TensorImpl>(weight.getIntrusivePtr()),
      weight._version(),
      weight.grad_fn().get(),
      c10::weak_intrusive_ptr<TiedGradSlot>(slot)};
  const auto same = std::find_if(offers.begin(), offers.end(), [&](auto& o) {
    return o.weight.lock().get() == weight.unsafeGetTensorImpl();
  });
  if (same != offers.end()) {
    *same = std::move(offer);
  } else {
    offers.push_back(std::move(offer));
  }
  return slot;
}

c10::intrusive_ptr<TiedGradSlot> take_tied_grad_slot(const at::Tensor& weight) {
  for (auto it = offers.begin(); it != offers.end(); ++it) {
    if (it->weight.lock().get() != weight.unsafeGetTensorImpl()) {
      continue;
    }
    auto slot = it->slot.lock();
    const bool same_state = it->version == weight._version() &&
        it->grad_fn == weight.grad_fn().get();
    offers.erase(it);
    return same_state ? slot : c10::intrusive_ptr<TiedGradSlot>();
  }
  return {};
}

void hand_tied_grad(
    const c10::intrusive_ptr<TiedGradSlot>& slot,
    const at::Tensor& grad) {
  {
    const std::lock_guard<std::mutex> lock(slot->mutex);
    slot->grad = grad;
  }
  // NOTE: a gradient left in the slot (the embedding's backward ran first,
  // or not at all in this pass) must not reach a later pass, whose
  // gradient for the weight is another tensor.
  torch::autograd::Engine::get_default_engine().queue_callback([slot] {
    const std::lock_guard<std::mutex> lock(slot->mutex);
    slot->grad = at::Tensor();
  });
}

at::Tensor take_tied_grad(const c10::intrusive_ptr<TiedGradSlot>& slot) {
  const std::lock_guard<std::mutex> lock(slot->mutex);
  return std::exchange(slot->grad, at::Tensor());
}

int64_t tied_grad_adds() {
  return adds.load();
}

void count_tied_grad_add() {
  ++adds;
}

} // namespace lamp::nn::detail
