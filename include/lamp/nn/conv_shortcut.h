#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>
#include <utility>

namespace lamp::nn {

/// `{torch::conv2d(input, weight), input}` for a residual block whose input
/// feeds both a bias-free 1x1 convolution (stride 1, no padding, one group)
/// and the block's shortcut (the identity, or a downsampling convolution):
/// use `.first` as the convolution's output and `.second` wherever the
/// block used `input` for its shortcut.
///
/// Why: autograd sums the two gradients of `input` in a separate pass over
/// the block's largest tensor (in ResNet-50's backward at batch 256, 16 adds
/// and 1.9 ms a step on an H200). Here the 1x1 convolution's input gradient
/// is one matrix product, dY (N*H*W x Cout) times W (Cout x Cin), which
/// cuBLAS accumulates straight into the shortcut's gradient.
///
/// The fused path is taken for a channels-last contiguous floating-point
/// 4-d `input` and a 1x1 `weight` of its dtype (under `AutocastGuard`, after
/// autocast's casts, as torch::conv2d's), on any device, when grad mode is on
/// and either needs a gradient. The forward is
/// torch::conv2d's and the weight gradient too; only the sum of the input's
/// gradients is computed in the matrix product (in its accumulation type,
/// so in fp16 it is rounded once, not twice). Other inputs take the unfused
/// `{torch::conv2d(input, weight), input}`. No double backward on the fused
/// path.
///
/// Example (a ResNet bottleneck):
/// \code
///   auto [out, shortcut] = lamp::nn::conv1x1_and_shortcut(x, conv1->weight);
///   out = bn2(conv2(bn1(out)));
///   return bn3(conv3(out), downsample ? downsample->forward(shortcut)
///                                     : shortcut);
/// \endcode
LAMP_API std::pair<torch::Tensor, torch::Tensor> conv1x1_and_shortcut(
    const torch::Tensor& input,
    const torch::Tensor& weight);

/// How the fused path's backward summed the input's two gradients.
enum class ShortcutGradient {
  /// The convolution's input gradient accumulated into the shortcut's, in
  /// place: nothing else held that gradient (autograd's own test).
  kInPlace,
  /// Into a copy of the shortcut's gradient (another holder, another
  /// layout or dtype): still one matrix product, plus a copy.
  kCopy,
  /// The shortcut had no gradient: the product alone.
  kNoShortcutGradient,
};

} // namespace lamp::nn
