#pragma once

// Internal: lamp::nn::max_pool2d on lamp's own NHWC kernels
// (max_pool_kernel.cu).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace lamp::nn::detail {

/// Max pooling of a channels-last fp16/bf16 CUDA `input` as an autograd
/// function that saves one byte per output element (the window position of
/// its maximum) instead of ATen's int64 index. Returns nullopt, having run
/// nothing, when the input is not for these kernels. The caller has checked
/// the arguments.
std::optional<at::Tensor> cuda_max_pool2d(
    const at::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding);

} // namespace lamp::nn::detail
