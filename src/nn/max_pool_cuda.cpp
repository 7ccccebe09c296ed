#include "max_pool_cuda.h"

#include "max_pool_kernel.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

namespace lamp::nn::detail {
namespace {

// Note [lamp's max pooling kernels]
// Forward writes y and a byte per output element: where in its window the
// maximum was (ATen keeps an int64, 8 bytes, for the same). Backward
// gathers dx from dy and those bytes alone; x and y are not saved. Both
// kernels run on the current stream (the autograd engine runs backward on
// the forward's stream) into tensors from the caching allocator: ordered
// like ATen ops, no host sync, capturable in a CUDA graph. The choice of
// maximum, ties and NaN included, and the order of the gradient sums are
// ATen's, so the results equal torch::max_pool2d's bit for bit.

PoolGeometry geometry(
    const at::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding) {
  const auto out_size = [&](int64_t in) {
    return (in + 2 * padding - kernel_size) / stride + 1;
  };
  return PoolGeometry{
      input.size(0),
      input.size(1),
      input.size(2),
      input.size(3),
      out_size(input.size(2)),
      out_size(input.size(3)),
      static_cast<int>(kernel_size),
      static_cast<int>(stride),
      static_cast<int>(padding)};
}

PoolDtype max_pool_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? PoolDtype::kHalf : PoolDtype::kBFloat16;
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Eight channels a thread where the channel count and addresses allow.
int vector_width(int64_t channels, const void* a, const void* b) {
  return channels % 8 == 0 && aligned16(a) && aligned16(b) ? 8 : 1;
}

class MaxPoolFunction : public torch::autograd::Function<MaxPoolFunction> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      int64_t kernel_size,
      int64_t stride,
      int64_t padding) {
    const c10::cuda::CUDAGuard guard(input.device());
    const auto g = geometry(input, kernel_size, stride, padding);
    auto output = at::empty(
        {g.n, g.channels, g.out_height, g.out_width},
        input.options().memory_format(at::MemoryFormat::ChannelsLast));
    // NHWC, as the output.
    auto argmax = at::empty(
        {g.n, g.out_height, g.out_width, g.channels},
        input.options().dtype(at::kByte));
    C10_CUDA_CHECK(launch_max_pool_forward(
        max_pool_dtype(input),
        g,
        input.const_data_ptr(),
        output.data_ptr(),
        argmax.data_ptr<uint8_t>(),
        vector_width(g.channels, input.const_data_ptr(), output.data_ptr()),
        c10::cuda::getCurrentCUDAStream(input.device().index()).stream()));
    ctx->save_for_backward({argmax});
    ctx->saved_data["sizes"] = input.sizes();
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return output;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::max_pool2d: lamp's NHWC kernels have no double backward "
        "(backward with create_graph=true); use torch::max_pool2d there");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& argmax = saved[0];
    const c10::cuda::CUDAGuard guard(argmax.device());
    const auto grad_output =
        grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    auto grad_input = at::empty(
        ctx->saved_data["sizes"].toIntVector(),
        grad_output.options().memory_format(at::MemoryFormat::ChannelsLast));
    const auto g = geometry(
        grad_input,
        ctx->saved_data["kernel_size"].toInt(),
        ctx->saved_data["stride"].toInt(),
        ctx->saved_data["padding"].toInt());
    C10_CUDA_CHECK(launch_max_pool_backward(
        max_pool_dtype(grad_output),
        g,
        grad_output.const_data_ptr(),
        argmax.const_data_ptr<uint8_t>(),
        grad_input.data_ptr(),
        vector_width(
            g.channels, grad_output.const_data_ptr(), grad_input.data_ptr()),
        c10::cuda::getCurrentCUDAStream(argmax.device().index()).stream()));
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

} // namespace

std::optional<at::Tensor> cuda_max_pool2d(
    const at::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding) {
  // NOTE: the argmax is a byte: windows of at most 255 elements.
  if (!input.is_cuda() || input.dim() != 4 ||
      (input.scalar_type() != at::kHalf &&
       input.scalar_type() != at::kBFloat16) ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      input.numel() == 0 || kernel_size * kernel_size > 255) {
    return std::nullopt;
  }
  return MaxPoolFunction::apply(input, kernel_size, stride, padding);
}

} // namespace lamp::nn::detail
