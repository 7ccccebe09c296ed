#pragma once

// Internal: lamp's column-sum kernel (channel_sums_kernel.h) on a tensor
// whose elements are rows of `channels` values, channels innermost: a
// channels-last activation's per-channel sums (conv_stats.cpp) or a linear
// layer's bias gradient (linear_cuda.cpp). The callers check the layout;
// this file owns the dtype, alignment and scratch the kernel needs.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace lamp::nn::detail {

/// Whether the kernel takes `x`: float16/bfloat16, `channels` a multiple of
/// 8, its data 16-byte aligned (a CUDA tensor laid out as above).
bool channel_sums_cuda_applies(const at::Tensor& x, int64_t channels);

/// The float32 sums over the rows, [channels], and of the squares when
/// `squares` (else undefined), on x's current stream.
std::pair<at::Tensor, at::Tensor> channel_sums_cuda(
    const at::Tensor& x,
    int64_t channels,
    bool squares);

/// The sums over the rows, [channels], rounded once to x's dtype (what
/// `channel_sums_cuda(x, channels, false).first.to(x.scalar_type())` gives,
/// the rounding done by the kernel that adds them: one launch less).
at::Tensor channel_sums_rounded_cuda(const at::Tensor& x, int64_t channels);

} // namespace lamp::nn::detail
