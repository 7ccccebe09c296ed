#pragma once

// Internal: a convolution that also gives the per-channel sums BatchNorm's
// batch statistics need, from cuDNN's graph API (the sums computed in the
// convolution's epilogue, so BatchNorm does not read the output again for
// them) where it can, else from ATen's convolution and ATen's BatchNorm
// statistics kernel (CUDA; one more pass) or two reductions (CPU).
//
// A building block of the fused ResNet block (BatchNorm's statistics in the
// convolutions, its scale, bias and ReLU in the next convolution's
// prologue): forward only, no autograd.

#include <lamp/export.h>

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace lamp::nn::detail {

// A convolution's output and its per-channel sums over N, H and W.
struct ConvStats {
  // conv2d(x, weight) in the input's dtype, channels-last.
  at::Tensor output;
  // float32 [C_out]: the sum of the output's values, and of their squares.
  at::Tensor sum;
  at::Tensor sum_of_squares;
};

// A bias-free, ungrouped 2-d convolution's geometry.
struct ConvGeometry {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
};

// The output and its sums of conv2d(x, weight), where x is `input`, or,
// when `scale` is defined, relu(input * scale + bias) per input channel
// (`scale` and `bias` float32 [C_in]: the previous BatchNorm's scale and
// shift folded, applied in the convolution's prologue).
//
// cuDNN's graph runs it for CUDA, channels-last, float16 or bfloat16 input
// and weight when lamp was built with its cuDNN graph code and cuDNN has a
// plan for the problem (one fused kernel, or a few; cuDNN 9.19 on sm_90 has
// one for float16 with the prologue's scale and bias in float16, none with
// them in float32, and no precompiled one for bfloat16); everything else runs
// ATen's conv2d (after the prologue's ops), then the sums: the same values
// within rounding (the graph sums the output before it is rounded to the
// input's dtype). `why_not`, if given, is set to why the graph did not run
// ("" when it did).
LAMP_API ConvStats conv2d_stats(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale = {},
    const at::Tensor& bias = {},
    std::string* why_not = nullptr);

// cuDNN's graph alone: std::nullopt, and the reason in `why_not`, where it
// cannot take the arguments. (src/nn/conv_stats_cudnn.cpp)
std::optional<ConvStats> conv2d_stats_cudnn(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale,
    const at::Tensor& bias,
    std::string* why_not);

// The float32 per-channel sum of `x`'s values and of their squares by
// lamp's kernel (channel_sums_kernel.h: one read, deterministic), for a CUDA
// channels-last float16/bfloat16 4-d tensor whose channels are a multiple
// of 8; std::nullopt for any other tensor (or in a build without CUDA). The
// composite path's sums on CUDA where it applies.
LAMP_API std::optional<std::pair<at::Tensor, at::Tensor>> channel_sums(
    const at::Tensor& x);

// Tests: cuDNN graphs built or rejected in this process (each problem once
// a thread; see Note [cuDNN graph cache] in cudnn_graph.h). 0 without the
// cuDNN graph code.
LAMP_API int64_t conv_stats_graphs_built();

} // namespace lamp::nn::detail
