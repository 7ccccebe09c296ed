#include "cudnn_utils.h"

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <string>

namespace lamp::nn::detail {

void throw_cudnn_error(
    cudnnStatus_t status,
    const char* call,
    const char* file,
    uint32_t line) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = c10::str(
      "lamp: cuDNN ",
      call,
      " failed: ",
      cudnnGetErrorString(status),
      " (status ",
      static_cast<int>(status),
      ", cuDNN ",
      cudnnGetVersion(),
      ")");
  if (detail[0] != '\0') {
    message += c10::str(": ", detail);
  }
  const c10::SourceLocation where{"lamp cuDNN", file, line};
  const int category = CUDNN_STATUS_CATEGORY(status);
  if (category == CUDNN_STATUS_NOT_SUPPORTED ||
      category == CUDNN_STATUS_BAD_PARAM) {
    throw CudnnRejected(where, std::move(message));
  }
  throw c10::Error(where, std::move(message));
}

void set_nhwc(const TensorDescriptor& desc, const at::Tensor& t) {
  const auto type =
      t.scalar_type() == at::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  LAMP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      desc.get(),
      CUDNN_TENSOR_NHWC,
      type,
      static_cast<int>(t.size(0)),
      static_cast<int>(t.size(1)),
      static_cast<int>(t.size(2)),
      static_cast<int>(t.size(3))));
}

cudnnHandle_t handle() {
  cudnnHandle_t h = at::native::getCudnnHandle();
  LAMP_CUDNN_CHECK(cudnnSetStream(h, c10::cuda::getCurrentCUDAStream()));
  return h;
}

at::Tensor buffer(size_t size, const at::Tensor& like) {
  return at::empty(
      {static_cast<int64_t>(std::max<size_t>(size, 1))},
      like.options().dtype(at::kByte));
}

} // namespace lamp::nn::detail
