#pragma once

// Internal: the version counters of parameters written by kernels that do
// not bump them.
//
// ATen's fused optimizer kernels (_fused_adam_, _fused_adamw_, _fused_sgd_)
// write the parameters in place without bumping their version counters, as
// an in-place op would (Python's fused optimizers have the same gap), and a
// CUDA graph replay runs such writes without any host op at all. Autograd
// then cannot tell a parameter saved for a backward was stepped since, and
// lamp's FP8 weight copies (Note [FP8 weight cache], src/nn) cannot tell they
// are stale. lamp's fused optimizers and GraphedStep's replays bump them.

#include <ATen/core/Tensor.h>

#include <vector>

namespace lamp::detail {

/// Bumps each tensor's version counter, as an in-place op on it would.
inline void bump_versions(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    // NOTE: inference tensors have no version counter to bump.
    if (t.defined() && !t.is_inference()) {
      t.unsafeGetTensorImpl()->bump_version();
    }
  }
}

} // namespace lamp::detail
