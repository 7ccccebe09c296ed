#pragma once

// Internal: BatchNorm's training-mode statistics from the per-channel sums
// that conv2d_stats gives, and its affine transform folded into one scale
// and shift a channel (what the next convolution's prologue applies). The
// second brick of the fused ResNet block, after src/nn/conv_stats.h.

#include <lamp/export.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lamp::nn::detail {

struct BatchNormFold {
  // float32 [C]: the batch mean and 1 / sqrt(biased variance + eps), as
  // torch::native_batch_norm's save_mean and save_invstd.
  at::Tensor mean;
  at::Tensor invstd;
  // [C] in the dtype asked for: weight * invstd and bias - mean * scale, so
  // that batch_norm(y) = y * scale + shift.
  at::Tensor scale;
  at::Tensor shift;
};

// From `sum` and `sum_of_squares` (float32 [C]) over `count` values a
// channel (N * H * W of the convolution's output; more than one), the
// statistics and the fold, in `fold_type` (float32, or the next
// convolution's float16 / bfloat16). `weight` and `bias` (float32 [C]) may
// be undefined (no affine). `running_mean` and `running_var` (float32 [C],
// both or neither) are updated in place as torch::batch_norm does in
// training: (1 - momentum) * running + momentum * batch value, the
// variance unbiased. The variance is E[y^2] - E[y]^2 computed in double
// from the float sums (cuDNN's and MLPerf's recipe), not Welford's: for
// outputs whose mean is large against their spread it loses digits that
// ATen's keeps.
//
// On CUDA one kernel on the current stream, no host sync, capturable; on
// the CPU the same arithmetic in ATen ops.
LAMP_API BatchNormFold batch_norm_finalize(
    const at::Tensor& sum,
    const at::Tensor& sum_of_squares,
    int64_t count,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double momentum,
    double eps,
    at::ScalarType fold_type);

} // namespace lamp::nn::detail
