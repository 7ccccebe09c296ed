#include "conv_stats.h"

#include <lamp/config.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <tuple>
#include <utility>

#if LAMP_WITH_CUDA
#include "channel_sums_cuda.h"
#endif

namespace lamp::nn::detail {
namespace {

void check_arguments(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale,
    const at::Tensor& bias) {
  TORCH_CHECK_VALUE(
      input.dim() == 4 && weight.dim() == 4,
      "conv2d_stats: expected a 4-d input (N, C, H, W) and a 4-d weight "
      "(C_out, C_in, kH, kW), got ",
      input.sizes(),
      " and ",
      weight.sizes());
  TORCH_CHECK_VALUE(
      input.size(1) == weight.size(1),
      "conv2d_stats: the input has ",
      input.size(1),
      " channels but the weight takes ",
      weight.size(1),
      " (grouped convolutions are not supported)");
  TORCH_CHECK_VALUE(
      input.device() == weight.device() &&
          input.scalar_type() == weight.scalar_type(),
      "conv2d_stats: input and weight must share device and dtype, got ",
      input.device(),
      " ",
      input.scalar_type(),
      " and ",
      weight.device(),
      " ",
      weight.scalar_type());
  for (int i = 0; i < 2; ++i) {
    TORCH_CHECK_VALUE(
        geometry.stride[i] > 0 && geometry.dilation[i] > 0 &&
            geometry.padding[i] >= 0,
        "conv2d_stats: strides and dilations must be positive and paddings "
        "non-negative");
  }
  TORCH_CHECK_VALUE(
      scale.defined() == bias.defined(),
      "conv2d_stats: give both scale and bias (the prologue), or neither");
  if (scale.defined()) {
    for (const at::Tensor* t : {&scale, &bias}) {
      TORCH_CHECK_VALUE(
          t->dim() == 1 && t->size(0) == input.size(1) &&
              t->device() == input.device() && t->is_contiguous() &&
              (t->scalar_type() == at::kFloat ||
               t->scalar_type() == input.scalar_type()),
          "conv2d_stats: scale and bias must be contiguous [",
          input.size(1),
          "] tensors on the input's device, float32 or the input's dtype; "
          "got ",
          t->scalar_type(),
          " ",
          t->sizes(),
          " on ",
          t->device());
    }
  }
}

// ATen's convolution (after the prologue's ops), then the sums.
ConvStats composite(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale,
    const at::Tensor& bias) {
  at::Tensor x = input;
  if (scale.defined()) {
    // In float32, rounded once to the input's dtype, as the graph's
    // prologue feeds the convolution.
    x = at::relu(
            input.to(at::kFloat) * scale.to(at::kFloat).view({1, -1, 1, 1}) +
            bias.to(at::kFloat).view({1, -1, 1, 1}))
            .to(input.scalar_type())
            .contiguous(input.suggest_memory_format());
  }
  ConvStats result;
  result.output = at::conv2d(
      x, weight, {}, geometry.stride, geometry.padding, geometry.dilation);
  const int64_t channels = result.output.size(1);
  const double count = channels > 0
      ? static_cast<double>(result.output.numel() / channels)
      : 0.0;
  if (auto sums = channel_sums(result.output); sums && count > 0) {
    // One pass over the output at the memory's rate (ATen's statistics
    // kernel below took ~4x the time of a read on an H200 in bf16,
    // docs/design/batchnorm-in-convolutions.md).
    result.sum = std::move(sums->first);
    result.sum_of_squares = std::move(sums->second);
    return result;
  }
  if (result.output.is_cuda() && count > 0) {
    // One pass over the output (ATen's BatchNorm statistics kernel, Welford
    // in float32, channels-last aware), not a float32 copy and two
    // reductions (five passes): the sums back from the mean and the
    // variance. NOTE: eps 0, so invstd is 1 / std (inf for a constant
    // channel, whose variance comes back as 0).
    const auto stats = at::batch_norm_stats(result.output, 0.0);
    const at::Tensor mean = std::get<0>(stats).to(at::kFloat);
    const at::Tensor invstd = std::get<1>(stats).to(at::kFloat);
    result.sum = mean * count;
    result.sum_of_squares = (invstd.pow(-2) + mean * mean) * count;
    return result;
  }
  const at::Tensor wide = result.output.to(at::kFloat);
  result.sum = wide.sum({0, 2, 3});
  result.sum_of_squares = wide.square().sum({0, 2, 3});
  return result;
}

} // namespace

std::optional<std::pair<at::Tensor, at::Tensor>> channel_sums(
    const at::Tensor& x) {
#if LAMP_WITH_CUDA
  if (x.dim() != 4 || !x.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      !channel_sums_cuda_applies(x, x.size(1))) {
    return std::nullopt;
  }
  return channel_sums_cuda(x, x.size(1), /*squares=*/true);
#else
  (void)x;
  return std::nullopt;
#endif
}

ConvStats conv2d_stats(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale,
    const at::Tensor& bias,
    std::string* why_not) {
  check_arguments(input, weight, geometry, scale, bias);
  std::string reason = "the input is not on a CUDA device";
  std::optional<ConvStats> fused;
  if (input.is_cuda()) {
    fused = conv2d_stats_cudnn(input, weight, geometry, scale, bias, &reason);
  }
  if (fused) {
    if (why_not != nullptr) {
      why_not->clear();
    }
    return *std::move(fused);
  }
  if (why_not != nullptr) {
    *why_not = std::move(reason);
  }
  return composite(input, weight, geometry, scale, bias);
}

#if !LAMP_WITH_CUDNN_FRONTEND
std::optional<ConvStats> conv2d_stats_cudnn(
    const at::Tensor& /*input*/,
    const at::Tensor& /*weight*/,
    const ConvGeometry& /*geometry*/,
    const at::Tensor& /*scale*/,
    const at::Tensor& /*bias*/,
    std::string* why_not) {
  if (why_not != nullptr) {
    *why_not =
        "lamp was built without its cuDNN graph code "
        "(LAMP_WITH_CUDNN_FRONTEND=OFF)";
  }
  return std::nullopt;
}

int64_t conv_stats_graphs_built() {
  return 0;
}
#endif

} // namespace lamp::nn::detail
