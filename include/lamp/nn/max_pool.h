#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>

namespace lamp::nn {

/// `torch::max_pool2d(input, kernel_size, stride, padding)` (dilation 1,
/// floor mode) that keeps no index tensor for backward.
///
/// For CUDA channels-last fp16/bf16 input (windows of up to 255 elements)
/// it runs lamp's own NHWC kernels, which keep one byte per output element
/// for backward (where in its window the maximum was) instead of ATen's
/// int64 index (8 bytes, four times an fp16 output). Output and gradient
/// equal ATen's bit for bit, ties and NaN included (the maximum is the first
/// in (row, column) order, a NaN always wins; gradients are summed in ATen's
/// order). Everything else runs `torch::max_pool2d`.
///
/// Example (ResNet's stem):
/// \code
///   x = lamp::nn::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2,
///                            /*padding=*/1);
/// \endcode
LAMP_API torch::Tensor max_pool2d(
    const torch::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding = 0);

} // namespace lamp::nn
