#include "add_layer_norm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

namespace lamp::nn::detail {
namespace {

// Row kernels: one warp a row, kWarps rows a block; a lane holds the row's
// columns lane, lane + 32, ... in registers (kPer of them). Many small
// blocks keep enough loads in flight to run at the memory's speed.
constexpr int kWarps = 4;
// The weight's and bias's gradients: blocks of 32 columns x kColumnRows
// threads, each block over a chunk of at least kChunkRows rows, at most
// kMaxChunks chunks (their partial sums are added in a fixed order).
constexpr int kColumnRows = 8;
constexpr int64_t kChunkRows = 256;
constexpr int64_t kMaxChunks = 1024;

template <typename T>
struct Type {
  using type = T;
};

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

// Calls fn(Type<T>{}) for the element type of `f`.
template <typename F>
cudaError_t with_type(NormFormat f, const F& fn) {
  switch (f) {
    case NormFormat::kFloat:
      return fn(Type<float>{});
    case NormFormat::kHalf:
      return fn(Type<__half>{});
    case NormFormat::kBFloat16:
      return fn(Type<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// NOTE: the element types are template arguments, and each operand is
// loaded in a loop of its own: all of a row's loads are in flight before
// the first is used (a switch on the type per element kept one in flight).
template <int kPer, typename R, typename Y>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_forward_kernel(AddNormForward a) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) {
    return;
  }
  const int64_t base = row * a.columns;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    v[i] = j < a.columns ? a.x[base + j] : 0.f;
  }
  if (a.r != nullptr) {
    const R* r = static_cast<const R*>(a.r) + base;
    float rv[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      rv[i] = j < a.columns ? to_float(r[j]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      v[i] += rv[i];
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    sum += v[i]; // columns past the row's end hold 0
  }
  const float mean = warp_sum(sum) / a.columns;
  float var = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < a.columns) {
      const float d = v[i] - mean;
      var += d * d;
    }
  }
  // NOTE: two passes over registers (mean, then squares about it): the
  // biased variance, as LayerNorm's.
  const float rstd = rsqrtf(warp_sum(var) / a.columns + a.eps);
  Y* y = static_cast<Y*>(a.y) + base;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < a.columns) {
      if (a.sum != nullptr) {
        a.sum[base + j] = v[i];
      }
      float out = (v[i] - mean) * rstd * a.weight[j];
      if (a.bias != nullptr) {
        out += a.bias[j];
      }
      y[j] = from_float<Y>(out);
    }
  }
  if (lane == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

// The input gradient, a warp a row; the residual's gradient (the same
// values) in the residual's type when dr is set (then DY's type).
template <int kPer, typename DY>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_dx_kernel(AddNormBackward a) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) {
    return;
  }
  const int64_t base = row * a.columns;
  const DY* dy = static_cast<const DY*>(a.dy) + base;
  float xhat[kPer], g[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    xhat[i] = j < a.columns ? a.sum[base + j] : 0.f;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    g[i] = j < a.columns ? to_float(dy[j]) * a.weight[j] : 0.f;
  }
  const float mean = a.mean[row];
  const float rstd = a.rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    xhat[i] = lane + 32 * i < a.columns ? (xhat[i] - mean) * rstd : 0.f;
    sum_g += g[i];
    sum_gx += g[i] * xhat[i];
  }
  sum_g = warp_sum(sum_g);
  sum_gx = warp_sum(sum_gx);
  const float inv_columns = 1.f / a.columns;
  float d[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    d[i] = rstd * (g[i] - (sum_g + xhat[i] * sum_gx) * inv_columns);
  }
  if (a.dsum != nullptr) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j < a.columns) {
        d[i] += a.dsum[base + j];
      }
    }
  }
  DY* dr = a.dr != nullptr ? static_cast<DY*>(a.dr) + base : nullptr;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < a.columns) {
      a.dx[base + j] = d[i];
      if (dr != nullptr) {
        dr[j] = from_float<DY>(d[i]);
      }
    }
  }
}

// The weight's and bias's gradients (sums over rows of dy * xhat and of
// dy): block (x, c) sums 32 columns over chunk c's rows, kColumnRows
// threads down each column, and writes the chunk's sums to
// partials[c][0, C) (weight) and [C, 2C) (bias), the threads' sums added in
// thread order (deterministic).
template <typename DY>
__global__ void __launch_bounds__(32 * kColumnRows)
    add_norm_dweight_kernel(AddNormBackward a, int64_t chunk_rows) {
  __shared__ float sums[2][kColumnRows][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = int64_t{blockIdx.y} * chunk_rows;
  const int64_t end = begin + chunk_rows < a.rows ? begin + chunk_rows : a.rows;
  const DY* dy = static_cast<const DY*>(a.dy);
  float dw = 0.f, db = 0.f;
  if (j < a.columns) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnRows) {
      const int64_t i = r * a.columns + j;
      const float g = to_float(dy[i]);
      dw += g * ((a.sum[i] - a.mean[r]) * a.rstd[r]);
      db += g;
    }
  }
  sums[0][threadIdx.y][threadIdx.x] = dw;
  sums[1][threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y < 2 && j < a.columns) {
    float total = 0.f;
    for (int k = 0; k < kColumnRows; ++k) {
      total += sums[threadIdx.y][k][threadIdx.x];
    }
    a.partials
        [int64_t{blockIdx.y} * 2 * a.columns + threadIdx.y * a.columns + j] =
        total;
  }
}

// Column sums of the chunks' partials: 32 columns a block, 8 threads down
// each, combined in a fixed order (deterministic).
__global__ void add_norm_partials_kernel(AddNormBackward a, int64_t parts) {
  __shared__ float sums[8][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.f;
  if (j < 2 * a.columns) {
    for (int64_t p = threadIdx.y; p < parts; p += 8) {
      sum += a.partials[p * 2 * a.columns + j];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < 2 * a.columns) {
    float total = 0.f;
    for (int k = 0; k < 8; ++k) {
      total += sums[k][threadIdx.x];
    }
    if (j < a.columns) {
      a.dweight[j] = total;
    } else if (a.dbias != nullptr) {
      a.dbias[j - a.columns] = total;
    }
  }
}

// Rows a chunk of the weight's gradient: kChunkRows, or more so that there
// are at most kMaxChunks.
int64_t chunk_rows(int64_t rows) {
  return std::max(kChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
}

int64_t chunks(int64_t rows) {
  const int64_t per = chunk_rows(rows);
  return (rows + per - 1) / per;
}

// Calls f(std::integral_constant<int, kPer>{}) for the smallest kPer that
// holds `columns` (<= kMaxNormColumns).
template <typename F>
cudaError_t with_per_lane(int columns, const F& f) {
  if (columns <= 32 * 8) {
    return f(std::integral_constant<int, 8>{});
  }
  if (columns <= 32 * 16) {
    return f(std::integral_constant<int, 16>{});
  }
  if (columns <= 32 * 24) {
    return f(std::integral_constant<int, 24>{});
  }
  if (columns <= 32 * 32) {
    return f(std::integral_constant<int, 32>{});
  }
  if (columns <= 32 * 48) {
    return f(std::integral_constant<int, 48>{});
  }
  return f(std::integral_constant<int, 64>{});
}

} // namespace

int64_t add_norm_backward_partials(int64_t rows, int columns) {
  return chunks(rows) * 2 * columns;
}

cudaError_t launch_add_norm_forward(
    const AddNormForward& a,
    cudaStream_t stream) {
  if (a.rows == 0) {
    return cudaSuccess;
  }
  if (a.columns <= 0 || a.columns > kMaxNormColumns ||
      (a.r != nullptr && a.r_format != NormFormat::kFloat &&
       a.r_format != a.y_format)) {
    return cudaErrorInvalidValue;
  }
  const auto blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  // NOTE: the residual is fp32 or y's type (the caller casts others to
  // fp32): five pairs of types instead of nine.
  const bool r_float = a.r == nullptr || a.r_format == NormFormat::kFloat;
  return with_type(a.y_format, [&](auto y) {
    using Y = typename decltype(y)::type;
    return with_per_lane(a.columns, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      if (r_float) {
        add_norm_forward_kernel<kPer, float, Y>
            <<<blocks, kWarps * 32, 0, stream>>>(a);
      } else {
        add_norm_forward_kernel<kPer, Y, Y>
            <<<blocks, kWarps * 32, 0, stream>>>(a);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_add_norm_backward(
    const AddNormBackward& a,
    cudaStream_t stream) {
  if (a.rows == 0) {
    return cudaSuccess;
  }
  if (a.columns <= 0 || a.columns > kMaxNormColumns ||
      (a.dr != nullptr && a.dr_format != a.dy_format)) {
    return cudaErrorInvalidValue;
  }
  const auto row_blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  const int64_t per = chunk_rows(a.rows);
  const dim3 column_blocks(
      static_cast<unsigned>((a.columns + 31) / 32),
      static_cast<unsigned>(chunks(a.rows)));
  const cudaError_t error = with_type(a.dy_format, [&](auto dy) {
    using DY = typename decltype(dy)::type;
    const cudaError_t e = with_per_lane(a.columns, [&](auto p) {
      add_norm_dx_kernel<decltype(p)::value, DY>
          <<<row_blocks, kWarps * 32, 0, stream>>>(a);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) {
      return e;
    }
    add_norm_dweight_kernel<DY>
        <<<column_blocks, dim3(32, kColumnRows), 0, stream>>>(a, per);
    return cudaGetLastError();
  });
  if (error != cudaSuccess) {
    return error;
  }
  add_norm_partials_kernel<<<
      static_cast<unsigned>((2 * a.columns + 31) / 32),
      dim3(32, 8),
      0,
      stream>>>(a, chunks(a.rows));
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
