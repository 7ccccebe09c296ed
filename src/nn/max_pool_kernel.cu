#include "max_pool_kernel.h"

#include "cuda_dtype.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace lamp::nn::detail {
namespace {

constexpr int kThreads = 256;

// VEC elements of T (and VEC argmax bytes) moved as one load or store:
// 16 bytes of fp16/bf16 and 8 of argmax for VEC = 8.
// PoolGeometry in the kernel's index type.
template <typename Index>
struct Shape {
  __device__ explicit Shape(const PoolGeometry& g)
      : n(static_cast<Index>(g.n)),
        channels(static_cast<Index>(g.channels)),
        height(static_cast<Index>(g.height)),
        width(static_cast<Index>(g.width)),
        out_height(static_cast<Index>(g.out_height)),
        out_width(static_cast<Index>(g.out_width)),
        kernel(g.kernel),
        stride(g.stride),
        padding(g.padding) {}
  Index n, channels, height, width, out_height, out_width, kernel, stride,
      padding;
};

// Where thread t works in an NHWC tensor of images of rows x columns
// pixels of `groups` channel groups (channels fastest): image n, which is
// past the last image for the threads past the end.
template <typename Index>
struct Element {
  __device__ Element(Index t, Index rows, Index columns, Index groups) {
    group = t % groups;
    Index pixel = t / groups;
    column = pixel % columns;
    pixel /= columns;
    row = pixel % rows;
    n = pixel / rows;
  }
  Index n, row, column, group;
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};
template <int VEC>
struct alignas(VEC) BytePack {
  uint8_t v[VEC];
};

// Index: int32_t where every element offset fits (the common case: 64-bit
// division costs several times the 32-bit one, and these kernels divide to
// find their pixel), int64_t otherwise.
template <typename T, int VEC, typename Index>
__global__ void max_pool_forward_nhwc(
    const T* __restrict__ x,
    T* __restrict__ y,
    uint8_t* __restrict__ argmax,
    PoolGeometry geometry) {
  const Shape<Index> g(geometry);
  const Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Element<Index> e(t, g.out_height, g.out_width, g.channels / VEC);
  if (e.n >= g.n) {
    return;
  }
  const Index n = e.n;
  const Index oh = e.row;
  const Index ow = e.column;
  const Index group = e.group;

  const Index h0 = oh * g.stride - g.padding;
  const Index w0 = ow * g.stride - g.padding;
  const Index h_begin = h0 > 0 ? h0 : 0;
  const Index w_begin = w0 > 0 ? w0 : 0;
  const Index h_end = min(h0 + g.kernel, g.height);
  const Index w_end = min(w0 + g.kernel, g.width);

  float best[VEC];
  BytePack<VEC> where;
  const auto first =
      static_cast<uint8_t>((h_begin - h0) * g.kernel + (w_begin - w0));
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    best[v] = -INFINITY;
    where.v[v] = first;
  }
  for (Index h = h_begin; h < h_end; ++h) {
    for (Index w = w_begin; w < w_end; ++w) {
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
  const Index o = t * VEC; // NHWC output, channels fastest
  *reinterpret_cast<Pack<T, VEC>*>(y + o) = out;
  *reinterpret_cast<BytePack<VEC>*>(argmax + o) = where;
}

template <typename T, int VEC, typename Index>
__global__ void max_pool_backward_nhwc(
    const T* __restrict__ dy,
    const uint8_t* __restrict__ argmax,
    T* __restrict__ dx,
    PoolGeometry geometry) {
  const Shape<Index> g(geometry);
  const Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Element<Index> e(t, g.height, g.width, g.channels / VEC);
  if (e.n >= g.n) {
    return;
  }
  const Index n = e.n;
  const Index h = e.row;
  const Index w = e.column;
  const Index group = e.group;

  // The windows that contain (h, w), as ATen bounds them.
  const Index ph_begin =
      h + g.padding < g.kernel ? 0 : (h + g.padding - g.kernel) / g.stride + 1;
  const Index pw_begin =
      w + g.padding < g.kernel ? 0 : (w + g.padding - g.kernel) / g.stride + 1;
  const Index ph_end = min((h + g.padding) / g.stride + 1, g.out_height);
  const Index pw_end = min((w + g.padding) / g.stride + 1, g.out_width);

  float sum[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    sum[v] = 0.0f;
  }
  for (Index ph = ph_begin; ph < ph_end; ++ph) {
    for (Index pw = pw_begin; pw < pw_end; ++pw) {
      const Index o =
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
  *reinterpret_cast<Pack<T, VEC>*>(dx + static_cast<Index>(t * VEC)) = out;
}

// The same two kernels for 3x3 windows, stride 2, padding 1 (ResNet's, and
// most networks' stem pool). Forward with the window unrolled: every load
// of a window is issued before the first comparison, where the general
// kernel's runtime-bounded loops wait for each load in turn. Backward a
// thread a window (below), where the general kernel's threads, one an input
// pixel, load each window up to four times and loop over one or two windows
// a row (diverging). Same order of comparisons and sums as above, so the
// same bits.
template <typename T, int VEC, typename Index>
__global__ void max_pool_forward_nhwc_3x3s2(
    const T* __restrict__ x,
    T* __restrict__ y,
    uint8_t* __restrict__ argmax,
    PoolGeometry geometry) {
  const Shape<Index> g(geometry);
  const Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Element<Index> e(t, g.out_height, g.out_width, g.channels / VEC);
  if (e.n >= g.n) {
    return;
  }
  const Index h0 = e.row * 2 - 1;
  const Index w0 = e.column * 2 - 1;
  Pack<T, VEC> in[3][3];
  bool inside[3][3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const Index h = h0 + i;
      const Index w = w0 + j;
      inside[i][j] = h >= 0 && h < g.height && w >= 0 && w < g.width;
      if (inside[i][j]) {
        in[i][j] = *reinterpret_cast<const Pack<T, VEC>*>(
            x + ((e.n * g.height + h) * g.width + w) * g.channels +
            e.group * VEC);
      }
    }
  }
  float best[VEC];
  BytePack<VEC> where;
  // The first window element inside the image, as the general kernel.
  const auto first = static_cast<uint8_t>((h0 < 0 ? 3 : 0) + (w0 < 0 ? 1 : 0));
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    best[v] = -INFINITY;
    where.v[v] = first;
  }
#pragma unroll
  for (int i = 0; i < 3; ++i) {
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if (inside[i][j]) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          const float val = to_float(in[i][j].v[v]);
          if (val > best[v] || isnan(val)) {
            best[v] = val;
            where.v[v] = static_cast<uint8_t>(i * 3 + j);
          }
        }
      }
    }
  }
  Pack<T, VEC> out;
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    out.v[v] = from_float<T>(best[v]);
  }
  const Index o = t * VEC;
  *reinterpret_cast<Pack<T, VEC>*>(y + o) = out;
  *reinterpret_cast<BytePack<VEC>*>(argmax + o) = where;
}

// One thread a window (p, q): it writes the 2x2 input pixels (2p, 2q) ..
// (2p+1, 2q+1) (those inside the image), which windows (p, q), (p, q+1),
// (p+1, q) and (p+1, q+1) cover, so each window's dy and argmax are loaded
// once a thread instead of once an input pixel. An even row or column lies
// in one window only; window (p, q) covers rows 2p-1 .. 2p+1.
template <typename T, int VEC, typename Index>
__global__ void max_pool_backward_nhwc_3x3s2(
    const T* __restrict__ dy,
    const uint8_t* __restrict__ argmax,
    T* __restrict__ dx,
    PoolGeometry geometry) {
  const Shape<Index> g(geometry);
  const Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Element<Index> e(t, g.out_height, g.out_width, g.channels / VEC);
  if (e.n >= g.n) {
    return;
  }
  const bool down = e.row + 1 < g.out_height; // windows p+1 exist
  const bool right = e.column + 1 < g.out_width; // windows q+1 exist
  BytePack<VEC> where[2][2];
  Pack<T, VEC> grad[2][2];
#pragma unroll
  for (int a = 0; a < 2; ++a) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if ((a == 0 || down) && (b == 0 || right)) {
        const Index o =
            ((e.n * g.out_height + e.row + a) * g.out_width + e.column + b) *
                g.channels +
            e.group * VEC;
        where[a][b] = *reinterpret_cast<const BytePack<VEC>*>(argmax + o);
        grad[a][b] = *reinterpret_cast<const Pack<T, VEC>*>(dy + o);
      }
    }
  }
  // Input pixel (2p + i, 2q + j) is element (i + 1 - 2a) * 3 + (j + 1 - 2b)
  // of window (p + a, q + b), for a <= i and b <= j; summed in ATen's
  // order (window rows, then window columns, ascending).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const Index h = 2 * e.row + i;
      const Index w = 2 * e.column + j;
      if (h >= g.height || w >= g.width) {
        continue;
      }
      float sum[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        sum[v] = 0.0f;
      }
#pragma unroll
      for (int a = 0; a <= i; ++a) {
#pragma unroll
        for (int b = 0; b <= j; ++b) {
          if ((a == 0 || down) && (b == 0 || right)) {
            const auto here =
                static_cast<uint8_t>((i + 1 - 2 * a) * 3 + (j + 1 - 2 * b));
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
              if (where[a][b].v[v] == here) {
                sum[v] += to_float(grad[a][b].v[v]);
              }
            }
          }
        }
      }
      Pack<T, VEC> out;
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        out.v[v] = from_float<T>(sum[v]);
      }
      *reinterpret_cast<Pack<T, VEC>*>(
          dx + ((e.n * g.height + h) * g.width + w) * g.channels +
          e.group * VEC) = out;
    }
  }
}

bool is_3x3s2(const PoolGeometry& g) {
  return g.kernel == 3 && g.stride == 2 && g.padding == 1;
}

// Whether every element offset of input and output, and the padded window
// arithmetic, fit in int32_t.
bool fits_int32(const PoolGeometry& g) {
  constexpr int64_t kLimit = int64_t{1} << 30;
  return g.n * g.channels * (g.height + 2 * g.padding + g.kernel) *
      (g.width + 2 * g.padding + g.kernel) <
      kLimit;
}

int64_t blocks(int64_t threads) {
  return (threads + kThreads - 1) / kThreads;
}

// Calls launch(std::integral_constant<int, VEC>{}, Index{}) with the vector
// width (8 or 1) and the index type the geometry allows, then reports the
// launch's error.
template <typename Launch>
cudaError_t dispatch(const PoolGeometry& g, int vector, const Launch& launch) {
  using Eight = std::integral_constant<int, 8>;
  using One = std::integral_constant<int, 1>;
  if (fits_int32(g)) {
    vector == 8 ? launch(Eight{}, int32_t{}) : launch(One{}, int32_t{});
  } else {
    vector == 8 ? launch(Eight{}, int64_t{}) : launch(One{}, int64_t{});
  }
  return cudaGetLastError();
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
  return dispatch(g, vector, [&](auto vec, auto index) {
    constexpr int kVec = decltype(vec)::value;
    using Index = decltype(index);
    const auto kernel = is_3x3s2(g)
        ? max_pool_forward_nhwc_3x3s2<T, kVec, Index>
        : max_pool_forward_nhwc<T, kVec, Index>;
    kernel<<<blocks(outputs / kVec), kThreads, 0, stream>>>(in, out, argmax, g);
  });
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
  return dispatch(g, vector, [&](auto vec, auto index) {
    constexpr int kVec = decltype(vec)::value;
    using Index = decltype(index);
    if (is_3x3s2(g)) { // a thread a window
      const int64_t windows = g.n * g.out_height * g.out_width * g.channels;
      max_pool_backward_nhwc_3x3s2<T, kVec, Index>
          <<<blocks(windows / kVec), kThreads, 0, stream>>>(
              grad, argmax, out, g);
    } else { // a thread an input pixel
      max_pool_backward_nhwc<T, kVec, Index>
          <<<blocks(inputs / kVec), kThreads, 0, stream>>>(
              grad, argmax, out, g);
    }
  });
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
