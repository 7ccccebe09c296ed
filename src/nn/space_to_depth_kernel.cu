#include "space_to_depth_kernel.h"

#include "cuda_dtype.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>

namespace lamp::nn::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 8; // output channels a thread writes

template <typename T>
struct alignas(sizeof(T) * kGroup) Group {
  T v[kGroup];
};

// Thread t writes output channels [8g, 8g + 8) of one output pixel (t = pixel
// * groups + g): neighbouring threads write neighbouring 16 (32) bytes, and
// read neighbouring 2x2 windows of the input.
template <typename In, typename Out, typename Index>
__global__ void __launch_bounds__(kThreads)
    space_to_depth_kernel(SpaceToDepthArgs a, Index total) {
  const In* __restrict__ x = static_cast<const In*>(a.x);
  const Index groups = static_cast<Index>(a.channels / kGroup);
  const Index real = static_cast<Index>(4 * a.c);
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < total;
       t += stride) {
    const Index g = t % groups;
    Index p = t / groups;
    const Index j = p % static_cast<Index>(a.w2);
    p /= static_cast<Index>(a.w2);
    const Index i = p % static_cast<Index>(a.h2);
    const Index n = p / static_cast<Index>(a.h2);
    Group<Out> out;
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      const Index k = g * kGroup + q;
      float v = 0.f;
      if (k < real) {
        // NOTE: signed: the padding makes rows and columns negative.
        const int64_t row = 2 * static_cast<int64_t>(i) + (k >> 1) % 2 - a.pad;
        const int64_t col = 2 * static_cast<int64_t>(j) + k % 2 - a.pad;
        if (row >= 0 && row < a.h && col >= 0 && col < a.w) {
          v = to_float(
              x[static_cast<int64_t>(n) * a.stride_n +
                static_cast<int64_t>(k >> 2) * a.stride_c + row * a.stride_h +
                col * a.stride_w]);
        }
      }
      out.v[q] = from_float<Out>(v);
    }
    reinterpret_cast<Group<Out>*>(a.out)[t] = out;
  }
}

template <typename In, typename Out>
cudaError_t launch_typed(const SpaceToDepthArgs& a, cudaStream_t stream) {
  const int64_t total = a.n * a.h2 * a.w2 * (a.channels / kGroup);
  if (total == 0) {
    return cudaSuccess;
  }
  // NOTE: a grid-stride loop over at most 132 * 32 blocks (enough to fill
  // an H200's SMs several times over).
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 32));
  // 32-bit indices where they fit: the divisions are most of the
  // arithmetic.
  if (total <= std::numeric_limits<int32_t>::max()) {
    space_to_depth_kernel<In, Out, int32_t>
        <<<blocks, kThreads, 0, stream>>>(a, static_cast<int32_t>(total));
  } else {
    space_to_depth_kernel<In, Out, int64_t>
        <<<blocks, kThreads, 0, stream>>>(a, total);
  }
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_in(const SpaceToDepthArgs& a, cudaStream_t stream) {
  switch (a.out_dtype) {
    case DepthDtype::kFloat:
      return launch_typed<In, float>(a, stream);
    case DepthDtype::kHalf:
      return launch_typed<In, __half>(a, stream);
    case DepthDtype::kBFloat16:
      return launch_typed<In, __nv_bfloat16>(a, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace

cudaError_t launch_space_to_depth(
    const SpaceToDepthArgs& args,
    cudaStream_t stream) {
  switch (args.in_dtype) {
    case DepthDtype::kFloat:
      return launch_in<float>(args, stream);
    case DepthDtype::kHalf:
      return launch_in<__half>(args, stream);
    case DepthDtype::kBFloat16:
      return launch_in<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace lamp::nn::detail
