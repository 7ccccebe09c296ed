#pragma once

// Internal: lamp::nn::max_pool2d on cuDNN's max pooling.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace lamp::nn::detail {

/// Max pooling of channels-last fp16/bf16 CUDA `input` on cuDNN as an
/// autograd function that saves the input and output (no indices). Returns
/// nullopt when the input is not for cuDNN, or when cuDNN rejected it (then
/// `why` says why); nothing ran then. The caller has checked the sizes.
std::optional<at::Tensor> cudnn_max_pool2d(
    const at::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding,
    std::string& why);

} // namespace lamp::nn::detail
