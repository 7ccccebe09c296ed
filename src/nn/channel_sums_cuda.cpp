#include "channel_sums_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "channel_sums_kernel.h"

namespace lamp::nn::detail {

bool channel_sums_cuda_applies(const at::Tensor& x, int64_t channels) {
  const auto dtype = x.scalar_type();
  return x.is_cuda() && (dtype == at::kHalf || dtype == at::kBFloat16) &&
      channels % 8 == 0 &&
      reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
}

namespace {

// The kernel's arguments for x, with its scratch (kept alive by `partials`).
ChannelSumsArgs channel_sums_args(
    const at::Tensor& x,
    int64_t channels,
    at::Tensor& partials) {
  const int64_t rows = channels > 0 ? x.numel() / channels : 0;
  partials = at::empty(
      {channel_sums_partial_floats(rows, channels)},
      x.options().dtype(at::kFloat));
  ChannelSumsArgs a;
  a.dtype =
      x.scalar_type() == at::kHalf ? ActDtype::kHalf : ActDtype::kBFloat16;
  a.rows = rows;
  a.channels = channels;
  a.x = x.const_data_ptr();
  a.partials = partials.mutable_data_ptr<float>();
  return a;
}

} // namespace

std::pair<at::Tensor, at::Tensor> channel_sums_cuda(
    const at::Tensor& x,
    int64_t channels,
    bool squares) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor partials;
  ChannelSumsArgs a = channel_sums_args(x, channels, partials);
  const auto f32 = x.options().dtype(at::kFloat);
  auto sum = at::empty({channels}, f32);
  at::Tensor sum_of_squares;
  a.sum = sum.mutable_data_ptr<float>();
  if (squares) {
    sum_of_squares = at::empty({channels}, f32);
    a.sum_of_squares = sum_of_squares.mutable_data_ptr<float>();
  }
  C10_CUDA_CHECK(launch_channel_sums(
      a, c10::cuda::getCurrentCUDAStream(x.device().index())));
  return {std::move(sum), std::move(sum_of_squares)};
}

at::Tensor channel_sums_rounded_cuda(const at::Tensor& x, int64_t channels) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor partials;
  ChannelSumsArgs a = channel_sums_args(x, channels, partials);
  auto sum = at::empty({channels}, x.options());
  a.sum_rounded = sum.mutable_data_ptr();
  C10_CUDA_CHECK(launch_channel_sums(
      a, c10::cuda::getCurrentCUDAStream(x.device().index())));
  return sum;
}

} // namespace lamp::nn::detail
