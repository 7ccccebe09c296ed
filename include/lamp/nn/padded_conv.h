#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>

namespace lamp::nn {

/// `torch::conv2d(input, weight, bias, stride, padding)` for a network's
/// first convolution, whose input has 3 channels (RGB): the input and the
/// weight get zero channels up to a multiple of 4 first, so cuDNN's
/// channels-last kernels need no padding of their own. Same result: a zero
/// channel adds zeros to every sum.
///
/// Why: cuDNN's NHWC convolution kernels for so few channels take 4 (ResNet's
/// 7x7 stem runs `...k64c4r7s7...`); given 3 they copy the image into a
/// padded buffer in the forward and again in the weight-gradient pass, each
/// a memset and a padding kernel: ~70 us a step at batch 64 on an H200.
/// Here the input is padded once, in the same pass that casts it to the
/// compute dtype (the autocast dtype inside `AutocastGuard` on CUDA, else
/// the input's), and the weight's gradient is the first channels of the
/// padded weight's.
///
/// The padded path is taken for a CUDA, channels-last contiguous 4-d
/// floating-point `input` whose channel count is not a multiple of 4, with a
/// weight for one group; everything else is the plain `torch::conv2d`.
///
/// Example (ResNet's stem):
/// \code
///   auto y = lamp::nn::padded_conv2d(images, conv1->weight, {}, 2, 3);
/// \endcode
LAMP_API torch::Tensor padded_conv2d(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    int64_t stride,
    int64_t padding);

} // namespace lamp::nn
