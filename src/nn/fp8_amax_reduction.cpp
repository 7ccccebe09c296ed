#include "fp8_amax_reduction.h"

#include <lamp/nn/diagnostics.h>

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/cat.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace lamp::nn::detail {
namespace {

// Note [FP8 amax reduction]
// Transformer Engine reduces the amaxes of every FP8 layer over the
// data-parallel group in one collective, not one a layer. Here a layer's
// update (each forward call under delayed scaling) needs its own newest
// amaxes reduced first, and between one layer's update and the next's no
// other layer's newest amaxes change (a layer records them in its own
// forward, after its update, and in its backward, after the pass). So the
// first update of a pass reduces every known layer's column 0 at once and
// the others skip theirs: the same values as reducing each at its update,
// one all-reduce instead of one a layer.
// - Known layers: those this thread updated with the group before, in the
//   order first seen (every rank makes the same forward calls in the scope,
//   so the order and sizes agree). A layer not known yet is reduced alone
//   and joins.
// - A pass: a layer updated again (the next micro-batch, the next step, a
//   module called twice) starts a new round: a new collective for all.
//   Reducing a layer whose column 0 did not change since is harmless (the
//   maximum of maxima).
// - Per thread, as the FP8 scope; a new group, or a layer on another
//   device, starts over / is reduced alone.

using WeakImpl =
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// A layer (its history) this thread reduced with the group before.
struct Known {
  WeakImpl history;
  const c10::TensorImpl* address = nullptr;
  // Reduced at the last collective and not updated since: its update skips.
  bool pending = false;
  // Updated since the last collective: its column 0 may have changed since.
  bool updated = false;
};

struct Round {
  const dist::ProcessGroup* group = nullptr;
  std::vector<Known> known; // in the order first seen
  std::unordered_map<const c10::TensorImpl*, size_t> index;
};

Round& round() {
  thread_local Round r;
  return r;
}

std::atomic<int64_t> reductions{0};

} // namespace

void fp8_reduce_newest_amaxes(
    const std::vector<at::Tensor>& histories,
    dist::ProcessGroup& group) {
  std::vector<at::Tensor> newest;
  newest.reserve(histories.size());
  for (const auto& h : histories) {
    newest.push_back(h.select(1, 0));
  }
  auto flat = at::cat(newest);
  group.allreduce(flat, dist::ReduceOp::kMax);
  reductions.fetch_add(1, std::memory_order_relaxed);
  at::_foreach_copy_(newest, flat.split(3));
}

int64_t fp8_amax_reduction_count() {
  return reductions.load(std::memory_order_relaxed);
}

void fp8_reduce_amaxes(const at::Tensor& history, dist::ProcessGroup& group) {
  auto& r = round();
  if (r.group != &group) {
    r = Round{};
    r.group = &group;
  }
  const auto* self = history.unsafeGetTensorImpl();
  Known* mine = nullptr;
  if (const auto it = r.index.find(self); it != r.index.end()) {
    // NOTE: the address may be a new layer's once the old one is freed.
    if (r.known[it->second].history.lock().get() == self) {
      mine = &r.known[it->second];
    }
  }
  if (mine && mine->pending) {
    mine->pending = false;
    mine->updated = true;
    return; // reduced with the others at this pass's first update
  }
  // A layer updated again starts a new pass; a new one joins this pass.
  const bool new_pass = mine && mine->updated;
  // The known layers still alive, in their order (the ranks' concatenations
  // agree), this one last if new; those on its device are reduced.
  std::vector<Known> known;
  std::vector<at::Tensor> alive;
  bool found = false;
  for (auto& k : r.known) {
    auto impl = k.history.lock();
    if (!impl) {
      continue; // a layer that is gone
    }
    if (impl.get() == self) {
      found = true;
      k.pending = false;
      k.updated = true;
      alive.push_back(history);
    } else if (impl->device() == history.device()) {
      alive.emplace_back(std::move(impl));
      k.pending = new_pass || !k.updated;
      k.updated = k.updated && !new_pass;
    } else {
      k.pending = false;
    }
    known.push_back(std::move(k));
  }
  if (!found) {
    known.push_back({WeakImpl(history.getIntrusivePtr()), self, false, true});
    alive.push_back(history);
  }
  fp8_reduce_newest_amaxes(alive, group);
  r.known = std::move(known);
  r.index.clear();
  for (size_t i = 0; i < r.known.size(); ++i) {
    r.index.emplace(r.known[i].address, i);
  }
}

} // namespace lamp::nn::detail
