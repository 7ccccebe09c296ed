#pragma once

// Internal: lamp::nn::space_to_depth_conv2d's input rearrangement on CUDA,
// one kernel (space_to_depth_kernel.cu).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace lamp::nn::detail {

/// X2 of Note [A stride-2 convolution as a stride-1 one]
/// (space_to_depth_conv.cpp) for a 4-D fp32/fp16/bf16 CUDA `x` in any
/// layout: (N, channels, h2, w2) sizes, channels-last memory, `dtype`
/// (fp32/fp16/bf16), x zero-padded by `pad`, cast and rearranged in one
/// kernel on the current stream. Returns nullopt, having run nothing, when
/// x or dtype is not for it.
std::optional<at::Tensor> cuda_input_to_depth(
    const at::Tensor& x,
    int64_t pad,
    int64_t h2,
    int64_t w2,
    int64_t channels,
    at::ScalarType dtype);

} // namespace lamp::nn::detail
