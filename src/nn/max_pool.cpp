#include <lamp/nn/max_pool.h>

#include <lamp/config.h>

#include <torch/torch.h>

#if LAMP_WITH_CUDA
#include "max_pool_cuda.h"
#endif

namespace lamp::nn {

torch::Tensor max_pool2d(
    const torch::Tensor& input,
    int64_t kernel_size,
    int64_t stride,
    int64_t padding) {
  TORCH_CHECK_VALUE(
      kernel_size > 0 && stride > 0 && padding >= 0 &&
          2 * padding <= kernel_size,
      "lamp::nn::max_pool2d: need kernel_size > 0, stride > 0 and 0 <= "
      "padding <= kernel_size / 2; got kernel_size ",
      kernel_size,
      ", stride ",
      stride,
      ", padding ",
      padding);
#if LAMP_WITH_CUDA
  if (input.is_cuda() && input.dim() == 4 &&
      input.size(2) + 2 * padding >= kernel_size &&
      input.size(3) + 2 * padding >= kernel_size) {
    if (auto output =
            detail::cuda_max_pool2d(input, kernel_size, stride, padding)) {
      return *output;
    }
  }
#endif
  return torch::max_pool2d(input, kernel_size, stride, padding);
}

} // namespace lamp::nn
