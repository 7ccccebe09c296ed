#include "space_to_depth_cuda.h"

#include "space_to_depth_kernel.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace lamp::nn::detail {
namespace {

std::optional<DepthDtype> depth_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DepthDtype::kFloat;
    case at::kHalf:
      return DepthDtype::kHalf;
    case at::kBFloat16:
      return DepthDtype::kBFloat16;
    default:
      return std::nullopt;
  }
}

} // namespace

std::optional<at::Tensor> cuda_input_to_depth(
    const at::Tensor& x,
    int64_t pad,
    int64_t h2,
    int64_t w2,
    int64_t channels,
    at::ScalarType dtype) {
  const auto in = depth_dtype(x.scalar_type());
  const auto out = depth_dtype(dtype);
  if (!x.is_cuda() || x.dim() != 4 || !in || !out || channels % 8 != 0 ||
      channels < 4 * x.size(1)) {
    return std::nullopt;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  // NOTE: NHWC memory, allocated as such: the caching allocator's blocks
  // are 512-byte aligned, and each pixel's `channels` values are a whole
  // number of the kernel's 16-byte stores.
  auto result =
      at::empty({x.size(0), h2, w2, channels}, x.options().dtype(dtype));
  SpaceToDepthArgs a;
  a.in_dtype = *in;
  a.out_dtype = *out;
  a.n = x.size(0);
  a.c = x.size(1);
  a.h = x.size(2);
  a.w = x.size(3);
  a.stride_n = x.stride(0);
  a.stride_c = x.stride(1);
  a.stride_h = x.stride(2);
  a.stride_w = x.stride(3);
  a.x = x.const_data_ptr();
  a.pad = pad;
  a.h2 = h2;
  a.w2 = w2;
  a.channels = channels;
  a.out = result.data_ptr();
  C10_CUDA_CHECK(launch_space_to_depth(
      a, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()));
  return result.permute({0, 3, 1, 2}); // (N, C, H, W) sizes, NHWC memory
}

} // namespace lamp::nn::detail
