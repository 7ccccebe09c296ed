#pragma once

#include <lamp/export.h>

#include <torch/types.h>

namespace lamp::nn {

/// `torch::adaptive_avg_pool2d(input, {1, 1})`, the mean over each
/// channel's pixels (ResNet's last pooling), with a channels-last backward.
///
/// The forward is ATen's (`mean` over H and W, as adaptive_avg_pool2d runs
/// it for a 1x1 output). For CUDA channels-last fp32/fp16/bf16 input that
/// needs a gradient, backward writes the channels-last input gradient in
/// one kernel: ATen's broadcasts the output gradient into an NCHW tensor,
/// which the next layer's backward then copies into channels-last (two
/// passes more over a full activation). Output and gradient equal ATen's bit
/// for bit. Everything else runs `torch::adaptive_avg_pool2d`.
///
/// Example (ResNet's head):
/// \code
///   x = fc(lamp::nn::global_avg_pool2d(x).flatten(1));
/// \endcode
LAMP_API torch::Tensor global_avg_pool2d(const torch::Tensor& input);

} // namespace lamp::nn
