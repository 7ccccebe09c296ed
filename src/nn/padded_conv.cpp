#include <lamp/nn/padded_conv.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

namespace lamp::nn {

torch::Tensor padded_conv2d(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    int64_t stride,
    int64_t padding) {
  constexpr int64_t kMultiple = 4;
  const bool padded_path = input.defined() && weight.defined() &&
      input.is_cuda() && input.dim() == 4 && weight.dim() == 4 &&
      input.is_floating_point() && input.size(1) % kMultiple != 0 &&
      weight.size(1) == input.size(1) &&
      input.is_contiguous(at::MemoryFormat::ChannelsLast);
  if (!padded_path) {
    return at::conv2d(input, weight, bias, stride, padding);
  }
  const int64_t channels = input.size(1);
  const int64_t extra = kMultiple - channels % kMultiple;
  // The dtype autocast would give the convolution's input: cast it here, in
  // the copy that pads it.
  const auto dtype = at::autocast::is_autocast_enabled(at::kCUDA)
      ? at::autocast::get_autocast_dtype(at::kCUDA)
      : input.scalar_type();
  auto x = at::empty(
      {input.size(0), channels + extra, input.size(2), input.size(3)},
      input.options().dtype(dtype).memory_format(
          at::MemoryFormat::ChannelsLast));
  x.narrow(1, channels, extra).zero_();
  x.narrow(1, 0, channels).copy_(input);
  // The weight (a few thousand elements) in its own dtype and layout; its
  // gradient is the first `channels` channels of the padded one's.
  const auto w = at::cat(
      {weight,
       at::zeros(
           {weight.size(0), extra, weight.size(2), weight.size(3)},
           weight.options().memory_format(weight.suggest_memory_format()))},
      1);
  return at::conv2d(x, w, bias, stride, padding);
}

} // namespace lamp::nn
