#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>

namespace lamp::nn {

/// `torch::max_pool2d(input, kernel_size, stride, padding)` (dilation 1,
/// floor mode) that keeps no index tensor for backward.
///
/// For CUDA channels-last fp16/bf16 input it runs cuDNN's max pooling
/// (CUDNN_POOLING_MAX_DETERMINISTIC, NaN propagated): backward finds each
/// window's maximum again from the input and output, which a ResNet keeps
/// anyway, instead of ATen's int64 indices (8 bytes an output element, four
/// times an fp16 output). Everything else, and inputs cuDNN turns down, run
/// `torch::max_pool2d`. The output equals ATen's; the gradient does too
/// where a window has one maximum. Where several elements tie for it, ATen
/// gives the gradient to the first in (row, column) order; cuDNN did the
/// same on an H200 with cuDNN 9.19 (tests/max_pool_test.cpp), which cuDNN
/// does not document. After a ReLU such ties are mostly zeros, whose
/// gradient the ReLU drops anyway.
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
