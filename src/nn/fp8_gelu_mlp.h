#pragma once

// Internal: lamp::nn::gelu_mlp in an FP8 scope (lamp/fp8.h). Both layers'
// GEMMs in FP8 as lamp::nn::linear runs them, with the GELU inside the
// casts between them (fp8_cast_op.h): forward, the hidden activation is
// cast to e4m3 straight from the pre-activation; backward, its gradient is
// cast to e5m2 with GELU's derivative applied. No GELU kernels and no pass
// over the 4x-wide hidden activation but the casts' own.

#include <ATen/core/Tensor.h>

#include "fp8_linear.h"

namespace lamp::nn::detail {

/// Whether both layers' GEMMs run in FP8 (fp8_applies of each; proj takes
/// fc's output).
bool fp8_gelu_mlp_applies(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& proj_weight);

/// linear(gelu(linear(input, fc_weight, fc_bias), "tanh"), proj_weight,
/// proj_bias) in FP8, with gradients: the values of fp8_linear, at::gelu
/// and fp8_linear with the same scales (the casts' GELU is ATen's, bit for
/// bit). `fc`, `proj`: the layers' delayed-scaling states, or null for
/// current scaling. Biases may be undefined.
at::Tensor fp8_gelu_mlp(
    const at::Tensor& input,
    const at::Tensor& fc_weight,
    const at::Tensor& fc_bias,
    const at::Tensor& proj_weight,
    const at::Tensor& proj_bias,
    const Fp8DelayedState* fc,
    const Fp8DelayedState* proj);

} // namespace lamp::nn::detail
