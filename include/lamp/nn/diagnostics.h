#pragma once

/// Diagnostics of lamp's fused layers, for tests and for finding out why a
/// layer ran unfused: which path a call took, why it fell back, and how
/// many calls took a path. Not part of the training API (namespace detail);
/// one pattern: `<layer>_last_path`, `<layer>_fallback_reason`,
/// `<layer>_..._count`. The "last" ones are per thread, the counts per
/// process.

#include <lamp/export.h>
#include <lamp/nn/batch_norm_act.h>
#include <lamp/nn/conv_shortcut.h>

#include <cstdint>
#include <string>

namespace lamp::nn::detail {

/// The path this thread's last `batch_norm_act` call took (so a test can
/// tell the fused kernel from the fallback).
LAMP_API BatchNormActPath batch_norm_act_last_path();

/// Why this thread's last `batch_norm_act` call did not take the fused
/// cuDNN path ("" when it did), e.g. "input is not channels-last
/// contiguous".
LAMP_API std::string batch_norm_act_fallback_reason();

/// `batch_norm_act` calls in this process that took `path`.
LAMP_API int64_t batch_norm_act_path_count(BatchNormActPath path);

/// Why this thread's last `conv_bn_add_relu` call ran the modules unfused
/// ("" when it took the fused path).
LAMP_API std::string conv_bn_add_relu_fallback_reason();

/// `conv_bn_add_relu` calls in this process that took the fused path.
LAMP_API int64_t conv_bn_add_relu_fused_count();

/// `conv_shortcut`'s fused backward calls in this process that summed the
/// gradients `how`.
LAMP_API int64_t conv_shortcut_gradient_count(ShortcutGradient how);

/// Weights that `lamp::nn::linear`'s FP8 path (lamp/fp8.h) cast to FP8 in
/// this process; a weight whose copy its scope made already is not cast
/// again, and not counted.
LAMP_API int64_t fp8_linear_weight_cast_count();

/// All-reduces of delayed FP8 scaling's amaxes over an
/// `Fp8Recipe::amax_group` in this process (one a forward pass for all of
/// its layers, once they are known).
LAMP_API int64_t fp8_amax_reduction_count();

/// Why this thread's last `qkv_attention` call ran ATen's attention instead
/// of lamp's cuDNN graphs ("" when it ran them), e.g. "dropout_p > 0".
LAMP_API std::string qkv_attention_fallback_reason();

/// `qkv_attention` calls in this process that ran lamp's cuDNN graphs.
LAMP_API int64_t qkv_attention_cudnn_count();

/// `qkv_attention` calls in a checkpoint's recompute, in this process,
/// that took their output and statistics from the forward call
/// (CheckpointOptions::keep_attention) instead of running the forward
/// graph again.
LAMP_API int64_t qkv_attention_kept_count();

} // namespace lamp::nn::detail
