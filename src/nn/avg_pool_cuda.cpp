#include "avg_pool_cuda.h"

#include "avg_pool_kernel.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

namespace lamp::nn::detail {
namespace {

// Note [lamp's global average pooling backward]
// Forward is ATen's adaptive_avg_pool2d for a 1x1 output: the mean over H
// and W, its output restrided as ATen does for a channels-last input.
// Backward saves nothing but the input's sizes and writes dx = dy / (H * W)
// straight into a channels-last tensor, one kernel on the current stream
// (the autograd engine runs backward on the forward's stream) into memory
// from the caching allocator: ordered like ATen ops, no host sync,
// capturable in a CUDA graph. The arithmetic is ATen's (float, times the
// reciprocal, rounded once), so the gradient equals ATen's bit for bit.
// Backward with create_graph=true runs ATen's ops instead, so that double
// backward works.

AvgPoolDtype avg_pool_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return AvgPoolDtype::kHalf;
    case at::kBFloat16:
      return AvgPoolDtype::kBFloat16;
    default:
      return AvgPoolDtype::kFloat;
  }
}

class GlobalAvgPoolFunction
    : public torch::autograd::Function<GlobalAvgPoolFunction> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input) {
    const c10::cuda::CUDAGuard guard(input.device());
    ctx->saved_data["sizes"] = input.sizes();
    // NOTE: ATen's adaptive_avg_pool2d, word for word, for a 1x1 output of
    // a channels-last input (AdaptiveAveragePooling.cpp).
    // (A 1x1 image is both layouts; ATen then keeps mean's strides.)
    auto output = input.mean({-1, -2}, /*keepdim=*/true);
    if (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast) {
      const int64_t n = input.size(0);
      const int64_t c = input.size(1);
      output.as_strided_({n, c, 1, 1}, {c, 1, c, c});
    }
    return output;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t n = sizes[0];
    const int64_t channels = sizes[1];
    const int64_t pixels = sizes[2] * sizes[3];
    const c10::cuda::CUDAGuard guard(grads[0].device());
    if (at::GradMode::is_enabled()) {
      // NOTE: backward with create_graph=true: ATen's differentiable ops
      // (the same values), so that a double backward sees them.
      return {(grads[0].expand(sizes) / pixels)
                  .contiguous(at::MemoryFormat::ChannelsLast)};
    }
    // NOTE: dy is N x C x 1 x 1 in any strides; the kernel reads it dense.
    const auto grad_output = grads[0].reshape({n, channels}).contiguous();
    auto grad_input = at::empty(
        sizes,
        grad_output.options().memory_format(at::MemoryFormat::ChannelsLast));
    const int wide = 16 / static_cast<int>(grad_output.element_size());
    const bool vectorized = channels % wide == 0 &&
        reinterpret_cast<std::uintptr_t>(grad_input.data_ptr()) % 16 == 0;
    C10_CUDA_CHECK(launch_global_avg_pool_backward(
        avg_pool_dtype(grad_output),
        n,
        pixels,
        channels,
        grad_output.const_data_ptr(),
        grad_input.data_ptr(),
        vectorized ? wide : 1,
        c10::cuda::getCurrentCUDAStream(grad_output.device().index())
            .stream()));
    return {grad_input};
  }
};

} // namespace

std::optional<at::Tensor> cuda_global_avg_pool2d(const at::Tensor& input) {
  const auto dtype = input.scalar_type();
  if (!input.is_cuda() || input.dim() != 4 ||
      (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      input.numel() == 0) {
    return std::nullopt;
  }
  return GlobalAvgPoolFunction::apply(input);
}

} // namespace lamp::nn::detail
