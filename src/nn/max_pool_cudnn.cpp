#include "max_pool_cudnn.h"

#include "cudnn_utils.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

namespace lamp::nn::detail {
namespace {

// Note [Max pooling on cuDNN]
// Forward and backward run on ATen's cuDNN handle bound to the current
// stream (the autograd engine runs backward on the forward's stream), with
// no workspace: ordered like ATen ops, no host sync, capturable in a CUDA
// graph. Backward reads x, y and dy and recomputes each window's argmax;
// CUDNN_POOLING_MAX_DETERMINISTIC makes that choice the same every run.
// cuDNN's max pooling skips the padding (as -inf), as ATen's does.
struct Descriptors {
  Descriptors(
      const at::Tensor& input,
      const at::Tensor& output,
      int64_t kernel_size,
      int64_t stride,
      int64_t padding) {
    set_nhwc(x, input);
    set_nhwc(y, output);
    LAMP_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
        pool.get(),
        CUDNN_POOLING_MAX_DETERMINISTIC,
        CUDNN_PROPAGATE_NAN,
        static_cast<int>(kernel_size),
        static_cast<int>(kernel_size),
        static_cast<int>(padding),
        static_cast<int>(padding),
        static_cast<int>(stride),
        static_cast<int>(stride)));
  }
  TensorDescriptor x;
  TensorDescriptor y;
  PoolingDescriptor pool;
};

class MaxPoolFunction : public torch::autograd::Function<MaxPoolFunction> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      int64_t kernel_size,
      int64_t stride,
      int64_t padding) {
    const c10::cuda::CUDAGuard guard(input.device());
    const auto out_size = [&](int64_t in) {
      return (in + 2 * padding - kernel_size) / stride + 1;
    };
    auto output = at::empty(
        {input.size(0),
         input.size(1),
         out_size(input.size(2)),
         out_size(input.size(3))},
        input.options().memory_format(at::MemoryFormat::ChannelsLast));
    const Descriptors d(input, output, kernel_size, stride, padding);
    const float one = 1.0f;
    const float zero = 0.0f;
    LAMP_CUDNN_CHECK(cudnnPoolingForward(
        handle(),
        d.pool.get(),
        &one,
        d.x.get(),
        input.const_data_ptr(),
        &zero,
        d.y.get(),
        output.data_ptr()));
    ctx->save_for_backward({input, output});
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return output;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& output = saved[1];
    const c10::cuda::CUDAGuard guard(input.device());
    const auto grad_output =
        grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    auto grad_input = at::empty_like(input, at::MemoryFormat::ChannelsLast);
    const Descriptors d(
        input,
        output,
        ctx->saved_data["kernel_size"].toInt(),
        ctx->saved_data["stride"].toInt(),
        ctx->saved_data["padding"].toInt());
    const float one = 1.0f;
    const float zero = 0.0f;
    // dy has y's shape and layout: y's descriptor serves for both (and x's
    // for dx).
    LAMP_CUDNN_CHECK(cudnnPoolingBackward(
        handle(),
        d.pool.get(),
        &one,
        d.y.get(),
        output.const_data_ptr(),
        d.y.get(),
        grad_output.const_data_ptr(),
        d.x.get(),
        input.const_data_ptr(),
        &zero,
        d.x.get(),
        grad_input.data_ptr()));
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

} // namespace

std::optional<at::Tensor> cudnn_max_pool2d(
    const at::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding,
    std::string& why) {
  if (!input.is_cuda() || input.dim() != 4 ||
      (input.scalar_type() != at::kHalf &&
       input.scalar_type() != at::kBFloat16) ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      input.numel() == 0) {
    return std::nullopt; // not for cuDNN; `why` stays empty
  }
  try {
    return MaxPoolFunction::apply(input, kernel_size, stride, padding);
  } catch (const CudnnRejected& e) {
    why = e.what_without_backtrace();
    return std::nullopt;
  }
}

} // namespace lamp::nn::detail
