#include "fp8_update_scales.h"

#include <lamp/config.h>
#include <lamp/dist/process_group.h>
#include <lamp/fp8.h>
#include <lamp/nn/linear.h>

#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#if LAMP_WITH_CUDA
#include "fp8_cast_cuda.h"
#endif
#include "fp8_amax_reduction.h"
#include "fp8_weight_cache.h"

#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace lamp::nn::detail {
namespace {

// Note [FP8 scales updated ahead]
// Under delayed scaling each layer's forward call first updates its scales
// (one small kernel a layer: 192 a gpt2-xl step, ~0.5 ms). A layer's update
// reads only its own history, which changes only in its own calls (the
// casts record their amaxes after the update) and its backward. So at the
// top of a step, after the last backward and before the forward, updating
// every layer at once gives each the values its own call would have given,
// in one launch (Transformer Engine updates all its layers' scales at once
// too). lamp::update_fp8_scales does that and marks each state fresh here;
// the layer's next forward call takes the mark and skips its update, so a
// layer is still updated once per forward call: a second call in the same
// forward, or one after a second update_fp8_scales without a call between
// (which skips fresh states), behaves as without it.
// - The mark holds the tensors' versions: a state changed in between (a
//   checkpoint loaded into it) is updated at its call as usual.
// - Per thread, as the FP8 scope: the thread that runs the forward pass
//   calls update_fp8_scales.
// - Captured in a CUDA graph, the launch replays with the graph; the marks
//   are host state, taken during the capture as in an eager step.

using WeakImpl =
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct Fresh {
  WeakImpl history;
  int64_t history_version = 0, scale_version = 0;
};

std::unordered_map<const c10::TensorImpl*, Fresh>& fresh_states() {
  thread_local std::unordered_map<const c10::TensorImpl*, Fresh> f;
  return f;
}

// Whether `s` is marked fresh and unchanged since (the mark stays).
bool is_fresh(const Fp8DelayedState& s) {
  auto& f = fresh_states();
  const auto it = f.find(s.history.unsafeGetTensorImpl());
  if (it == f.end()) {
    return false;
  }
  const Fresh& m = it->second;
  // NOTE: the address may be a new layer's once the old one is freed.
  return m.history.lock().get() == s.history.unsafeGetTensorImpl() &&
      m.history_version == s.history._version() &&
      m.scale_version == s.scale._version();
}

} // namespace

bool fp8_take_fresh_scales(const Fp8DelayedState& s) {
  const bool fresh = is_fresh(s);
  fresh_states().erase(s.history.unsafeGetTensorImpl());
  return fresh;
}

} // namespace lamp::nn::detail

namespace lamp {

void update_fp8_scales(torch::nn::Module& model) {
  using nn::detail::Fp8DelayedState;
  if (!Fp8AutocastGuard::is_enabled()) {
    return;
  }
  const auto recipe = Fp8AutocastGuard::recipe();
  if (recipe.scaling() != Fp8Scaling::kDelayed) {
    return;
  }
  torch::NoGradGuard no_grad;
  // The layers with state, each once (a module registered under two names
  // is one layer), in the modules' order (the same on every rank), not
  // fresh already.
  std::vector<Fp8DelayedState> states;
  std::unordered_set<const c10::TensorImpl*> seen;
  // NOTE: the model itself apart: modules(true) needs it in a shared_ptr.
  std::vector<torch::nn::Module*> modules{&model};
  for (const auto& module : model.modules(/*include_self=*/false)) {
    modules.push_back(module.get());
  }
  for (auto* module : modules) {
    auto* fc = dynamic_cast<nn::LinearImpl*>(module);
    if (fc == nullptr || !fc->fp8_amax_history.defined()) {
      continue;
    }
    Fp8DelayedState s{fc->fp8_amax_history, fc->fp8_scale};
    if (seen.insert(s.history.unsafeGetTensorImpl()).second &&
        !nn::detail::is_fresh(s)) {
      states.push_back(std::move(s));
    }
  }
  for (const auto& s : states) {
    nn::detail::fp8_keep_weight_amaxes(s.history); // before the roll
  }
  // Transformer Engine's amax reduction first: one all-reduce a device.
  const auto& group = recipe.amax_group();
  if (group && group->world_size() > 1) {
    std::map<std::pair<int, int>, std::vector<at::Tensor>> by_device;
    for (const auto& s : states) {
      const auto d = s.history.device();
      by_device[{static_cast<int>(d.type()), d.index()}].push_back(s.history);
    }
    for (const auto& [device, histories] : by_device) {
      nn::detail::fp8_reduce_newest_amaxes(histories, *group);
    }
  }
  // One launch for the states the CUDA kernel takes (a device and a
  // history length apiece); ATen's ops for the rest.
#if LAMP_WITH_CUDA
  std::map<std::tuple<int, int64_t>, std::vector<Fp8DelayedState>> batches;
#endif
  for (const auto& s : states) {
#if LAMP_WITH_CUDA
    if (nn::detail::fp8_update_cuda_applies(s)) {
      batches[{s.history.device().index(), s.history.size(1)}].push_back(s);
      continue;
    }
#endif
    nn::detail::fp8_update_delayed_reference(s, recipe);
  }
#if LAMP_WITH_CUDA
  for (const auto& [key, batch] : batches) {
    nn::detail::fp8_update_delayed_cuda(batch, recipe);
  }
#endif
  auto& fresh = nn::detail::fresh_states();
  for (const auto& s : states) {
    fresh.insert_or_assign(
        s.history.unsafeGetTensorImpl(),
        nn::detail::Fresh{
            nn::detail::WeakImpl(s.history.getIntrusivePtr()),
            s.history._version(),
            s.scale._version()});
  }
}

} // namespace lamp
