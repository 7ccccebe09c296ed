#pragma once

// Internal: lamp::nn::linear's FP8 casts on CUDA, one kernel each
// (fp8_cast_kernel.h): quantize_delayed's and quantize_tensorwise's results
// (fp8_linear.h), bit for bit (a GELU op within a rounding of ATen's:
// fp8_cast_kernel.cu), with the row-major copy, the transposed copy the
// backward's GEMMs take, or both, from one read of the operand; and
// delayed scaling's update in one kernel.

#include <ATen/core/Tensor.h>

#include <vector>

#include "fp8_cast_op.h"
#include "fp8_linear.h"

namespace lamp::nn::detail {

/// Whether the kernels take `x`: a CUDA fp32, fp16 or bf16 matrix with an
/// even number of rows and columns (contiguous or not: it is made so).
bool fp8_cast_cuda_applies(const at::Tensor& x);

/// quantize_delayed(op(x), fp8, scale, amax), its data as asked; with
/// `column_sums`, also op(x)'s column sums in fp32 (Fp8Cast::column_sums)
/// where the kernel's 8-wide path takes x (rows and columns multiples of
/// 8). `op` (fp8_cast_op.h) in the same kernel where that path takes x,
/// else ATen's op first; `aux`: kGeluBackward's pre-activation (x's shape
/// and dtype), else undefined. `ride` (a bias, fp32 on x's device) comes
/// back in `ride_dtype` (bf16 or fp16) as Fp8Cast::bias16, cast by the same
/// kernel (Fp8CastArgs::ride_src); other dtypes by ATen after it.
Fp8Cast fp8_cast_delayed_cuda(
    const at::Tensor& x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax,
    bool data,
    bool transposed,
    bool column_sums = false,
    Fp8CastOp op = Fp8CastOp::kNone,
    const at::Tensor& aux = at::Tensor(),
    const at::Tensor& ride = at::Tensor(),
    at::ScalarType ride_dtype = at::kBFloat16);

/// quantize_tensorwise(op(x), fp8), its data as asked; `column_sums`, `op`,
/// `aux`, `ride` and `ride_dtype` as above.
Fp8Cast fp8_cast_tensorwise_cuda(
    const at::Tensor& x,
    at::ScalarType fp8,
    bool data,
    bool transposed,
    bool column_sums = false,
    Fp8CastOp op = Fp8CastOp::kNone,
    const at::Tensor& aux = at::Tensor(),
    const at::Tensor& ride = at::Tensor(),
    at::ScalarType ride_dtype = at::kBFloat16);

/// Whether the update kernel (fp8_scale_update_kernel.h) takes `s`: CUDA,
/// contiguous fp32 [3, len] and [3] on one device, len at most 1024.
bool fp8_update_cuda_applies(const Fp8DelayedState& s);

/// fp8_update_delayed_reference(s, recipe) in one kernel, bit for bit.
void fp8_update_delayed_cuda(const Fp8DelayedState& s, const Fp8Recipe& recipe);

/// The same for every state of `states` (each one fp8_update_cuda_applies
/// takes; all on one device, histories of one length), a launch for up to
/// kFp8UpdatesPerLaunch of them.
void fp8_update_delayed_cuda(
    const std::vector<Fp8DelayedState>& states,
    const Fp8Recipe& recipe);

} // namespace lamp::nn::detail
