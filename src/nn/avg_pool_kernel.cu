#include "avg_pool_kernel.h"

#include "cuda_dtype.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>

namespace lamp::nn::detail {
namespace {

constexpr int kThreads = 256;

// VEC elements written with one store (16 bytes for the vector widths the
// launcher picks).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// Thread t writes elements [t * VEC, (t + 1) * VEC) of dx, all of one
// pixel of image n. Index is 32-bit where the element count allows: the
// divisions are most of this kernel's arithmetic.
template <typename T, int VEC, typename Index>
__global__ void global_avg_pool_backward_nhwc(
    const T* __restrict__ dy,
    T* __restrict__ dx,
    Index packs,
    Index channel_packs,
    Index image_packs,
    Index channels,
    float scale) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < packs;
       t += stride) {
    const Index c = (t % channel_packs) * VEC;
    const T* g = dy + (t / image_packs) * channels + c;
    Pack<T, VEC> out;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      out.v[i] = from_float<T>(to_float(g[i]) * scale);
    }
    reinterpret_cast<Pack<T, VEC>*>(dx)[t] = out;
  }
}

template <typename T, int VEC, typename Index>
cudaError_t launch(
    int64_t n,
    int64_t pixels,
    int64_t channels,
    const void* dy,
    void* dx,
    cudaStream_t stream) {
  const int64_t channel_packs = channels / VEC;
  const int64_t packs = n * pixels * channel_packs;
  // NOTE: a grid-stride loop over at most 132 * 32 blocks of 256 threads
  // (32 resident-block rounds of an H200), enough to keep every SM's stores
  // in flight.
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, 132 * 32);
  // NOTE: ATen's reciprocal, opmath_t(1.0) / scalar, in float.
  const float scale = 1.0f / static_cast<float>(pixels);
  global_avg_pool_backward_nhwc<T, VEC, Index>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<const T*>(dy),
          static_cast<T*>(dx),
          static_cast<Index>(packs),
          static_cast<Index>(channel_packs),
          static_cast<Index>(pixels * channel_packs),
          static_cast<Index>(channels),
          scale);
  return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t dispatch_index(
    int64_t n,
    int64_t pixels,
    int64_t channels,
    const void* dy,
    void* dx,
    cudaStream_t stream) {
  // NOTE: the last thread's t + stride must not wrap: a margin of the
  // largest grid.
  const bool fits = n * pixels * channels <
      std::numeric_limits<int32_t>::max() - int64_t{132} * 32 * kThreads;
  return fits ? launch<T, VEC, uint32_t>(n, pixels, channels, dy, dx, stream)
              : launch<T, VEC, uint64_t>(n, pixels, channels, dy, dx, stream);
}

template <typename T>
cudaError_t dispatch_vector(
    int64_t n,
    int64_t pixels,
    int64_t channels,
    const void* dy,
    void* dx,
    int vector,
    cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  return vector == kWide
      ? dispatch_index<T, kWide>(n, pixels, channels, dy, dx, stream)
      : dispatch_index<T, 1>(n, pixels, channels, dy, dx, stream);
}

} // namespace

cudaError_t launch_global_avg_pool_backward(
    AvgPoolDtype dtype,
    int64_t n,
    int64_t pixels,
    int64_t channels,
    const void* dy,
    void* dx,
    int vector,
    cudaStream_t stream) {
  switch (dtype) {
    case AvgPoolDtype::kHalf:
      return dispatch_vector<__half>(
          n, pixels, channels, dy, dx, vector, stream);
    case AvgPoolDtype::kBFloat16:
      return dispatch_vector<__nv_bfloat16>(
          n, pixels, channels, dy, dx, vector, stream);
    case AvgPoolDtype::kFloat:
      break;
  }
  return dispatch_vector<float>(n, pixels, channels, dy, dx, vector, stream);
}

} // namespace lamp::nn::detail
