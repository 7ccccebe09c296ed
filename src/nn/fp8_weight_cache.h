#pragma once

// Internal: the FP8 copies of weights made within an FP8 scope, so that a
// scope casts each weight once (lamp/fp8.h: a scope around a step's
// micro-batches casts each weight once a step). See Note [FP8 weight
// cache] in fp8_weight_cache.cpp.

#include <ATen/core/Tensor.h>

#include "fp8_linear.h"

namespace lamp::nn::detail {

/// A weight's FP8 copies; under delayed scaling the history whose row 1 its
/// cast recorded its amax in, and that amax (a 0-d fp32 tensor) once the
/// history is to be rolled (fp8_keep_weight_amaxes; undefined before: the
/// history's newest slot still holds it); where the cast made its layer's
/// bias in 16 bits too (Fp8Cast::bias16), that bias and its version then.
struct Fp8WeightCopy {
  Fp8Cast cast;
  at::Tensor history;
  at::Tensor amax;
  at::Tensor bias;
  int64_t bias_version = 0;
};

/// Before `history`'s layer updates its scales (which rolls its newest
/// amaxes away): the copies this thread keeps whose casts recorded their
/// amax in it take that amax along (one copy each, only for copies still
/// held: a scope around a step's micro-batches).
void fp8_keep_weight_amaxes(const at::Tensor& history);

/// Whether `copy`'s bias16 is `bias` in `dtype` as it is now (the same
/// tensor, storage and version).
bool fp8_cached_bias_holds(
    const Fp8WeightCopy& copy,
    const at::Tensor& bias,
    at::ScalarType dtype);

/// The copy of `weight` made earlier in this thread's FP8 scope with
/// `scale` (a delayed layer's `fp8_scale`; undefined under current
/// scaling), when it still holds the weight's values; null otherwise.
const Fp8WeightCopy* fp8_cached_weight(
    const at::Tensor& weight,
    const at::Tensor& scale);

/// Keeps `copy` for later calls in this thread's FP8 scope. Weights that
/// are not leaves (computed in the forward) are not kept: they are new
/// tensors at each call.
void fp8_cache_weight(
    const at::Tensor& weight,
    const at::Tensor& scale,
    Fp8WeightCopy copy);

/// Drops this thread's copies (the FP8 scope ended).
void fp8_clear_weight_cache();

} // namespace lamp::nn::detail
