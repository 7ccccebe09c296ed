#include "max_pool_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lamp::nn::detail {
namespace {

constexpr int kThreads = 256;

__device__ inline float to_float(__half v) {
  return __half2float(v);
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// VEC elements of T (and VEC argmax bytes) moved as one load or store:
// 16 bytes of fp16/bf16 and 8 of argmax for VEC = 8.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};
template <int VEC>
struct alignas(VEC) BytePack {
  uint8_t v[VEC];
};

template <typename T, int VEC>
__global__ void max_pool_forward_nhwc(
    const T* __restrict__ x,
    T* __restrict__ y,
    uint8_t* __restrict__ argmax,
    PoolGeometry g) {
  const int64_t groups = g.channels / VEC;
  const int64_t total = g.n * g.out_height * g.out_width * groups;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) {
    return;
  }
  const int64_t group = t % groups;
  int64_t pixel = t / groups;
  const int64_t ow = pixel % g.out_width;
  pixel /= g.out_width;
  const int64_t oh = pixel % g.out_height;
  const int64_t n = pixel / g.out_height;

  const int64_t h0 = oh * g.stride - g.padding;
  const int64_t w0 = ow * g.stride - g.padding;
  const int64_t h_begin = h0 > 0 ? h0 : 0;
  const int64_t w_begin = w0 > 0 ? w0 : 0;
  const int64_t h_end = min(h0 + g.kernel, g.height);
  const int64_t w_end = min(w0 + g.kernel, g.width);

  float best[VEC];
  BytePack<VEC> where;
  const auto first =
      static_cast<uint8_t>((h_begin - h0) * g.kernel + (w_begin - w0));
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    best[v] = -INFINITY;
    where.v[v] = first;
  }
  for (int64_t h = h_begin; h < h_end; ++h) {
    for (int64_t w = w_begin; w < w_end; ++w) {
      const auto in = *reinterpret_cast<const Pack<T, VEC>*>(
          x + ((n * g.height + h) * g.width + w) * g.channels + group * VEC);
      const auto at = static_cast<uint8_t>((h - h0) * g.kernel + (w - w0));
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const float val = to_float(in.v[v]);
        // NOTE: ATen's test, so that NaN propagates as it does there.
        if (val > best[v] || isnan(val)) {
          best[v] = val;
          where.v[v] = at;
        }
      }
    }
  }
  // The maximum is an input value: the round trip through float is exact.
  Pack<T, VEC> out;
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    out.v[v] = from_float<T>(best[v]);
  }
  const int64_t o = t * VEC; // NHWC output, channels fastest
  *reinterpret_cast<Pack<T, VEC>*>(y + o) = out;
  *reinterpret_cast<BytePack<VEC>*>(argmax + o) = where;
}

template <typename T, int VEC>
__global__ void max_pool_backward_nhwc(
    const T* __restrict__ dy,
    const uint8_t* __restrict__ argmax,
    T* __restrict__ dx,
    PoolGeometry g) {
  const int64_t groups = g.channels / VEC;
  const int64_t total = g.n * g.height * g.width * groups;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) {
    return;
  }
  const int64_t group = t % groups;
  int64_t pixel = t / groups;
  const int64_t w = pixel % g.width;
  pixel /= g.width;
  const int64_t h = pixel % g.height;
  const int64_t n = pixel / g.height;

  // The windows that contain (h, w), as ATen bounds them.
  const int64_t ph_begin =
      h + g.padding < g.kernel ? 0 : (h + g.padding - g.kernel) / g.stride + 1;
  const int64_t pw_begin =
      w + g.padding < g.kernel ? 0 : (w + g.padding - g.kernel) / g.stride + 1;
  const int64_t ph_end = min((h + g.padding) / g.stride + 1, g.out_height);
  const int64_t pw_end = min((w + g.padding) / g.stride + 1, g.out_width);

  float sum[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    sum[v] = 0.0f;
  }
  for (int64_t ph = ph_begin; ph < ph_end; ++ph) {
    for (int64_t pw = pw_begin; pw < pw_end; ++pw) {
      const int64_t o =
          ((n * g.out_height + ph) * g.out_width + pw) * g.channels +
          group * VEC;
      const auto here = static_cast<uint8_t>(
          (h - (ph * g.stride - g.padding)) * g.kernel +
          (w - (pw * g.stride - g.padding)));
      const auto where = *reinterpret_cast<const BytePack<VEC>*>(argmax + o);
      const auto grad = *reinterpret_cast<const Pack<T, VEC>*>(dy + o);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        if (where.v[v] == here) {
          sum[v] += to_float(grad.v[v]);
        }
      }
    }
  }
  Pack<T, VEC> out;
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    out.v[v] = from_float<T>(sum[v]);
  }
  *reinterpret_cast<Pack<T, VEC>*>(dx + t * VEC) = out;
}

int64_t blocks(int64_t threads) {
  return (threads + kThreads - 1) / kThreads;
}

template <typename T>
cudaError_t forward(
    const PoolGeometry& g,
    const void* x,
    void* y,
    uint8_t* argmax,
    int vector,
    cudaStream_t stream) {
  const int64_t outputs = g.n * g.out_height * g.out_width * g.channels;
  if (outputs == 0) {
    return cudaSuccess;
  }
  const auto* in = static_cast<const T*>(x);
  auto* out = static_cast<T*>(y);
  if (vector == 8) {
    max_pool_forward_nhwc<T, 8>
        <<<blocks(outputs / 8), kThreads, 0, stream>>>(in, out, argmax, g);
  } else {
    max_pool_forward_nhwc<T, 1>
        <<<blocks(outputs), kThreads, 0, stream>>>(in, out, argmax, g);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(
    const PoolGeometry& g,
    const void* dy,
    const uint8_t* argmax,
    void* dx,
    int vector,
    cudaStream_t stream) {
  const int64_t inputs = g.n * g.height * g.width * g.channels;
  if (inputs == 0) {
    return cudaSuccess;
  }
  const auto* grad = static_cast<const T*>(dy);
  auto* out = static_cast<T*>(dx);
  if (vector == 8) {
    max_pool_backward_nhwc<T, 8>
        <<<blocks(inputs / 8), kThreads, 0, stream>>>(grad, argmax, out, g);
  } else {
    max_pool_backward_nhwc<T, 1>
        <<<blocks(inputs), kThreads, 0, stream>>>(grad, argmax, out, g);
  }
  return cudaGetLastError();
}

} // namespace

cudaError_t launch_max_pool_forward(
    PoolDtype dtype,
    const PoolGeometry& g,
    const void* x,
    void* y,
    uint8_t* argmax,
    int vector,
    cudaStream_t stream) {
  return dtype == PoolDtype::kHalf
      ? forward<__half>(g, x, y, argmax, vector, stream)
      : forward<__nv_bfloat16>(g, x, y, argmax, vector, stream);
}

cudaError_t launch_max_pool_backward(
    PoolDtype dtype,
    const PoolGeometry& g,
    const void* dy,
    const uint8_t* argmax,
    void* dx,
    int vector,
    cudaStream_t stream) {
  return dtype == PoolDtype::kHalf
      ? backward<__half>(g, dy, argmax, dx, vector, stream)
      : backward<__nv_bfloat16>(g, dy, argmax, dx, vector, stream);
}

} // namespace lamp::nn::detail
