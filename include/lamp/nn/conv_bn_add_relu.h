#pragma once

#include <lamp/export.h>
#include <lamp/nn/batch_norm_act.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace lamp::nn {

/// The tail of a ResNet bottleneck: `bn(conv(input), residual)`, that is
/// `relu(batch_norm(conv2d(input)) + residual)`, with the modules' own
/// parameters and buffers (so names, state dicts and results are those of
/// the unfused modules).
///
/// Why: BatchNorm in training reads the convolution's output once for its
/// statistics and once more to normalise it. Here the statistics come from
/// the convolution's epilogue (cuDNN's graph API: the output's per-channel
/// sums as it is written), and the normalisation, the add and the ReLU are
/// one pass that also keeps the ReLU's mask as one bit a value; the
/// backward is one reduction pass and one pass for both input gradients.
///
/// The fused path runs in training on CUDA for a channels-last contiguous
/// float16 or bfloat16 `input` (under `AutocastGuard`: in the autocast
/// dtype; the weight is cast as autocast would) with a bias-free, ungrouped
/// convolution whose output channels are a multiple of 8, and a `bn` with
/// `affine`, `track_running_stats`, a `momentum` and `relu`. Anything else
/// (CPU, float32, NCHW, evaluation, other options) runs the modules
/// unfused, `bn(conv(input), residual)`;
/// `detail::conv_bn_add_relu_fallback_reason()` (lamp/nn/diagnostics.h) says
/// why. Running statistics and `num_batches_tracked` are updated as the modules
/// do (also under `BatchCountGuard`); no host sync, so it can be captured by
/// `GraphedStep`. No double backward on the fused path.
///
/// Example (a bottleneck whose shortcut is the identity):
/// \code
///   out = lamp::nn::conv_bn_add_relu(out, conv3, bn3, x);
/// \endcode
LAMP_API torch::Tensor conv_bn_add_relu(
    const torch::Tensor& input,
    const torch::nn::Conv2d& conv,
    const BatchNormAct2d& bn,
    const torch::Tensor& residual);

/// As above, with a downsampling shortcut: `bn(conv(input),
/// shortcut_bn(shortcut_conv(shortcut_input)))`. On the fused path both
/// BatchNorms take their statistics from their convolutions' epilogues and
/// both normalisations, the add and the ReLU are one pass. `shortcut_bn`
/// needs the options `bn` needs.
///
/// Example (the first bottleneck of a ResNet stage):
/// \code
///   out = lamp::nn::conv_bn_add_relu(
///       out, conv3, bn3, x, downsample_conv, downsample_bn);
/// \endcode
LAMP_API torch::Tensor conv_bn_add_relu(
    const torch::Tensor& input,
    const torch::nn::Conv2d& conv,
    const BatchNormAct2d& bn,
    const torch::Tensor& shortcut_input,
    const torch::nn::Conv2d& shortcut_conv,
    const torch::nn::BatchNorm2d& shortcut_bn);

} // namespace lamp::nn
