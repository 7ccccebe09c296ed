#pragma once

// Internal: what a lamp::checkpoint's forward call keeps for its recompute
// (CheckpointOptions::keep_attention: lamp::nn::qkv_attention's output and
// softmax statistics), and which checkpoint's fn this thread is running.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace lamp::detail {

// Note [a checkpoint's kept tensors]
// The forward call appends in call order; the recompute, which calls the
// same ops in the same order (lamp::checkpoint's contract), reads them back
// from `next` on. The stash belongs to the checkpoint's autograd state; its
// backward empties it once the recompute has run, unless the graph is kept
// for another backward pass (retain_graph), which then reads it from the
// start again, as saved tensors are freed or kept. A kept tensor is handed
// to fn's caller in the forward call too: where fn changed it in place
// since (its version moved), the recompute computes afresh instead of
// reading it. The thread-local pointer is set around each call of fn: the
// forward call on the caller's thread, the recompute on the autograd
// engine's thread that runs the checkpoint's backward; a nested checkpoint
// sets its own (null when it keeps nothing) and restores the outer one.
struct CheckpointStash {
  struct Kept {
    at::Tensor tensor;
    int64_t version;
  };
  std::vector<Kept> kept;
  size_t next = 0;

  void push(const at::Tensor& t) {
    kept.push_back({t, static_cast<int64_t>(t._version())});
  }
};

/// The stash of the checkpoint whose fn this thread runs, where that
/// checkpoint keeps attention; null elsewhere.
CheckpointStash*& checkpoint_stash();

/// Sets checkpoint_stash() for its life (also when fn throws).
class StashScope {
 public:
  explicit StashScope(CheckpointStash* stash) : previous_(checkpoint_stash()) {
    checkpoint_stash() = stash;
  }
  ~StashScope() {
    checkpoint_stash() = previous_;
  }
  StashScope(const StashScope&) = delete;
  StashScope& operator=(const StashScope&) = delete;

 private:
  CheckpointStash* previous_;
};

} // namespace lamp::detail
