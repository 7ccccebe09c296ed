#pragma once

// Internal: the 16-bit copies of parameters that a fused optimizer keeps
// (FusedOptimizer::keep_weight_casts) and lamp::CastWeightsGuard takes
// instead of casting (Note [Kept weight casts] in kept_casts.cpp).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace lamp::detail {

/// One parameter's kept copy. Owned by the optimizer that keeps it (and by
/// a GraphedStep whose graph writes it); the process-wide registry only
/// points at it.
struct KeptCast {
  KeptCast(at::Tensor param_, at::ScalarType dtype_)
      : param(std::move(param_)), dtype(dtype_) {}
  at::Tensor param; // fp32
  at::ScalarType dtype; // kBFloat16 or kHalf
  at::Tensor copy; // made at a guard's first use; laid out as `param`
  const void* data = nullptr; // param.data_ptr() when the copy was written
  int64_t version = -1; // param._version() then

  /// Whether the copy holds `param`'s values now (as far as its storage
  /// and version counter tell).
  bool current() const;
  /// Records that the copy holds `param`'s values as they are now, and
  /// bumps the copy's version counter (it was written in place).
  void mark_written();
};

using KeptCasts = std::vector<std::shared_ptr<KeptCast>>;

/// Makes `casts` findable by their parameters for the life of the entries.
/// Throws if a parameter already has a live entry of another owner.
void register_kept_casts(const KeptCasts& casts);

/// For CastWeightsGuard: each parameter's kept copy in `dtype`, undefined
/// where none is kept (an empty vector where none of them has one); a copy
/// made now or found stale is written from its parameter first (one
/// multi-tensor cast for all of them).
std::vector<at::Tensor> take_kept_casts(
    at::TensorList params,
    at::ScalarType dtype);

/// Writes each entry's copy from its parameter (one multi-tensor cast) and
/// marks it current. Every entry must have its copy.
void write_kept_casts(const std::vector<KeptCast*>& casts);

/// Writes the copies of `casts` that are stale (one multi-tensor cast) and
/// marks them current; those without a copy yet are left alone. For a
/// GraphedStep before a replay whose graph reads them.
void refresh_kept_casts(const KeptCasts& casts);

} // namespace lamp::detail
