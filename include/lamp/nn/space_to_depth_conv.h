#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>

namespace lamp::nn {

/// `torch::conv2d(input, weight, {}, /*stride=*/2, padding)` (no bias, no
/// dilation, one group), computed as a stride-1 convolution of the padded
/// input's 2x2 space-to-depth rearrangement (4 * Cin channels, rounded up to
/// a multiple of 8 with zero channels) with the weight rearranged the same
/// way (its kernel padded to an even size with zeros): the same products,
/// summed in another order.
///
/// Why: a network's first convolution reads an image of 3 channels, a
/// layout for which cuDNN 9.19 has no fast bf16 kernel on sm_90: ResNet-50's
/// stem (3 -> 64, 7x7, stride 2) took 1.75 ms forward and 1.11 ms for its
/// weight gradient at batch 256 on an H200, against 0.55 and 0.55 in fp16.
/// Rearranged into 16 channels and a 4x4 kernel it took 0.64 and 0.45 ms in
/// bf16 (fp16 gains nothing: 0.65 and 0.45). The rearrangement is one pass
/// over the input in forward and another in backward (it is recomputed
/// there, so the larger input is not kept); on CUDA one kernel, the cast to
/// autocast's dtype included (no cast copy of the input is made or kept).
/// ResNet-50's whole bs256 bf16 step: 1.2 ms faster on an H200.
///
/// `input` is (N, Cin, H, W), `weight` (Cout, Cin, kH, kW); under
/// `AutocastGuard` both are taken in the autocast dtype, as torch::conv2d's
/// (the input's gradient comes back in the input's dtype). The output is
/// channels-last, with torch::conv2d's sizes. Gradients flow to both, in their
/// own layouts. Any device and floating dtype; no double backward
/// (`create_graph=true` is an error).
///
/// Example (a ResNet stem in bf16):
/// \code
///   x = bn1(lamp::nn::space_to_depth_conv2d(x, conv1->weight, /*padding=*/3));
/// \endcode
LAMP_API torch::Tensor space_to_depth_conv2d(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    int64_t padding = 0);

} // namespace lamp::nn
