#include "add_layer_norm_kernel.h"

#include "cuda_dtype.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
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
// The fused backward (add_norm_dx_dweight_kernel): rows up to this wide,
// at least kFusedWarpRows rows a warp, at most kMaxChunks blocks.
constexpr int kMaxFusedColumns = 1024;
constexpr int64_t kFusedWarpRows = 8;

template <typename T>
struct Type {
  using type = T;
};

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

// V elements of type T at p (aligned to V of them), as floats; and back.
// NOTE: V = 4: one 16-byte load of fp32 (8 bytes of bf16) where four
// 4-byte loads were: fewer instructions a row, more bytes in flight.
template <int V, typename T>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ void load_pack(const T* p, float* out) {
  const Pack<V, T> pack = *reinterpret_cast<const Pack<V, T>*>(p);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    out[e] = to_float(pack.v[e]);
  }
}

template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, const float* in) {
  Pack<V, T> pack;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    pack.v[e] = from_float<T>(in[e]);
  }
  *reinterpret_cast<Pack<V, T>*>(p) = pack;
}

// Row kernels: lane `lane` holds packs k = 0, 1, ... of V columns starting
// at (lane + 32 k) V, kPer / V of them (kPer floats); packs past the row's
// end hold zeros. V = 4 needs columns % 4 == 0 and aligned rows.
//
// NOTE: the element types are template arguments, and each operand is
// loaded in a loop of its own: all of a row's loads are in flight before
// the first is used (a switch on the type per element kept one in flight).
template <int kPer, int V, typename R, typename Y>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_forward_kernel(AddNormForward a) {
  constexpr int kPacks = kPer / V;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) {
    return;
  }
  const int64_t base = row * a.columns;
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = (lane + 32 * k) * V;
    if (c < a.columns) {
      load_pack<V>(a.x + base + c, v + k * V);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        v[k * V + e] = 0.f;
      }
    }
  }
  if (a.r != nullptr) {
    const R* r = static_cast<const R*>(a.r) + base;
    float rv[kPer];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int c = (lane + 32 * k) * V;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        rv[k * V + e] = 0.f;
      }
      if (c < a.columns) {
        load_pack<V>(r + c, rv + k * V);
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      v[i] += rv[i];
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    sum += v[i];
  }
  const float mean = warp_sum(sum) / a.columns;
  float var = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if ((lane + 32 * k) * V < a.columns) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[k * V + e] - mean;
        var += d * d;
      }
    }
  }
  // NOTE: two passes over registers (mean, then squares about it): the
  // biased variance, as LayerNorm's.
  const float rstd = rsqrtf(warp_sum(var) / a.columns + a.eps);
  Y* y = static_cast<Y*>(a.y) + base;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = (lane + 32 * k) * V;
    if (c < a.columns) {
      if (a.sum != nullptr) {
        store_pack<V>(a.sum + base + c, v + k * V);
      }
      float w[V], b[V], out[V];
      load_pack<V>(a.weight + c, w);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        b[e] = 0.f;
      }
      if (a.bias != nullptr) {
        load_pack<V>(a.bias + c, b);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        out[e] = (v[k * V + e] - mean) * rstd * w[e] + b[e];
      }
      store_pack<V>(y + c, out);
    }
  }
  if (lane == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

// One row of the input gradient, by its warp; the residual's gradient (the
// same values) in the residual's type when dr is set (then DY's type).
// kSums: also adds the row's dy * xhat and dy to the lane's columns' sums
// in dw and db (the weight's and bias's gradients).
template <int kPer, int V, typename DY, bool kSums>
__device__ __forceinline__ void dx_row(
    const AddNormBackward& a,
    int64_t row,
    int lane,
    float* dw,
    float* db) {
  constexpr int kPacks = kPer / V;
  const int64_t base = row * a.columns;
  const DY* dy = static_cast<const DY*>(a.dy) + base;
  float xhat[kPer], g[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    xhat[i] = 0.f;
    g[i] = 0.f;
  }
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = (lane + 32 * k) * V;
    if (c < a.columns) {
      load_pack<V>(a.sum + base + c, xhat + k * V);
    }
  }
  // NOTE: with the sums, dy is kept as it is until they have it (w a
  // register a column); without, scaled by the weight as it comes.
  float w[kSums ? kPer : V];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = (lane + 32 * k) * V;
    if (c < a.columns) {
      load_pack<V>(dy + c, g + k * V);
      load_pack<V>(a.weight + c, w + (kSums ? k * V : 0));
      if constexpr (!kSums) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          g[k * V + e] *= w[e];
        }
      }
    }
  }
  const float mean = a.mean[row];
  const float rstd = a.rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const bool inside = (lane + 32 * k) * V < a.columns;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int i = k * V + e;
      xhat[i] = inside ? (xhat[i] - mean) * rstd : 0.f;
      if constexpr (kSums) {
        // NOTE: as add_norm_dweight_kernel: dy (0 past the row's end)
        // times xhat, before the weight scales dy.
        dw[i] += g[i] * xhat[i];
        db[i] += g[i];
        g[i] = inside ? g[i] * w[i] : 0.f;
      }
      sum_g += g[i];
      sum_gx += g[i] * xhat[i];
    }
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
    float ds[kPer];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int c = (lane + 32 * k) * V;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        ds[k * V + e] = 0.f;
      }
      if (c < a.columns) {
        load_pack<V>(a.dsum + base + c, ds + k * V);
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      d[i] += ds[i];
    }
  }
  DY* dr = a.dr != nullptr ? static_cast<DY*>(a.dr) + base : nullptr;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = (lane + 32 * k) * V;
    if (c < a.columns) {
      store_pack<V>(a.dx + base + c, d + k * V);
      if (dr != nullptr) {
        store_pack<V>(dr + c, d + k * V);
      }
    }
  }
}

// The input gradient, a warp a row.
template <int kPer, int V, typename DY>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_dx_kernel(AddNormBackward a) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (row < a.rows) {
    dx_row<kPer, V, DY, false>(a, row, threadIdx.x % 32, nullptr, nullptr);
  }
}

// The input gradient and the weight's and bias's partial sums in one read
// (rows of at most kMaxFusedColumns): block b takes `warp_rows` rows a
// warp, rows b kWarps warp_rows + kWarps i + warp; each lane keeps its
// columns' sums in registers over its rows, the block adds its warps' in
// warp order and writes them to partials[b][0, C) (weight) and [C, 2C)
// (bias), as add_norm_dweight_kernel does a chunk's (deterministic).
// NOTE: add_norm_dweight_kernel reads dy and the sum a second time (6 of
// the backward's 22 bytes an element): with the sums here a gpt2 step
// (768 columns) took 34.24 ms instead of 34.79, a gpt2-medium one (1,024)
// 86.68 instead of 87.87 (H100). Wider rows keep the two kernels: their
// sums would take more registers than a thread has left (152 at 1,600
// columns without them).
template <int kPer, int V, typename DY>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_dx_dweight_kernel(AddNormBackward a, int warp_rows) {
  __shared__ float sums[kWarps][2 * kPer * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float dw[kPer], db[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    dw[i] = 0.f;
    db[i] = 0.f;
  }
  const int64_t first = int64_t{blockIdx.x} * kWarps * warp_rows + warp;
  for (int i = 0; i < warp_rows; ++i) {
    const int64_t row = first + int64_t{kWarps} * i;
    if (row >= a.rows) {
      break;
    }
    dx_row<kPer, V, DY, true>(a, row, lane, dw, db);
  }
#pragma unroll
  for (int k = 0; k < kPer / V; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int c = (lane + 32 * k) * V + e;
      sums[warp][c] = dw[k * V + e];
      sums[warp][kPer * 32 + c] = db[k * V + e];
    }
  }
  __syncthreads();
  float* out = a.partials + int64_t{blockIdx.x} * 2 * a.columns;
  for (int j = threadIdx.x; j < 2 * a.columns; j += kWarps * 32) {
    const int c = j < a.columns ? j : kPer * 32 + (j - a.columns);
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      total += sums[w][c];
    }
    out[j] = total;
  }
}

// The weight's and bias's gradients (sums over rows of dy * xhat and of
// dy): block (x, c) sums 32 V columns over chunk c's rows, V adjacent
// columns a thread and kColumnRows threads down each, and writes the
// chunk's sums to partials[c][0, C) (weight) and [C, 2C) (bias), the
// threads' sums added in thread order (deterministic).
template <int V, typename DY>
__global__ void __launch_bounds__(32 * kColumnRows)
    add_norm_dweight_kernel(AddNormBackward a, int64_t chunk_rows) {
  __shared__ float sums[2][kColumnRows][32 * V + 1];
  const int j = (blockIdx.x * 32 + threadIdx.x) * V;
  const int64_t begin = int64_t{blockIdx.y} * chunk_rows;
  const int64_t end = begin + chunk_rows < a.rows ? begin + chunk_rows : a.rows;
  const DY* dy = static_cast<const DY*>(a.dy);
  float dw[V], db[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    dw[e] = 0.f;
    db[e] = 0.f;
  }
  if (j < a.columns) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnRows) {
      const int64_t i = r * a.columns + j;
      float g[V], s[V];
      load_pack<V>(dy + i, g);
      load_pack<V>(a.sum + i, s);
      const float mean = a.mean[r];
      const float rstd = a.rstd[r];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        dw[e] += g[e] * ((s[e] - mean) * rstd);
        db[e] += g[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sums[0][threadIdx.y][threadIdx.x * V + e] = dw[e];
    sums[1][threadIdx.y][threadIdx.x * V + e] = db[e];
  }
  __syncthreads();
  // Thread (x, y) of the first two rows of threads: column j0 + x + 32 i
  // of sums[y].
  if (threadIdx.y < 2) {
    const int j0 = blockIdx.x * 32 * V;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int local = threadIdx.x + 32 * e;
      if (j0 + local < a.columns) {
        float total = 0.f;
        for (int k = 0; k < kColumnRows; ++k) {
          total += sums[threadIdx.y][k][local];
        }
        a.partials
            [int64_t{blockIdx.y} * 2 * a.columns + threadIdx.y * a.columns +
             j0 + local] = total;
      }
    }
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

bool fused_backward(int columns) {
  return columns <= kMaxFusedColumns;
}

// Rows a warp of the fused backward: kFusedWarpRows, or more so that there
// are at most kMaxChunks blocks.
int64_t fused_warp_rows(int64_t rows) {
  return std::max(
      kFusedWarpRows, (rows + kWarps * kMaxChunks - 1) / (kWarps * kMaxChunks));
}

int64_t fused_blocks(int64_t rows) {
  const int64_t per_block = kWarps * fused_warp_rows(rows);
  return (rows + per_block - 1) / per_block;
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
  // NOTE: gpt2-xl's 1,600 columns: 52 a lane, not 64 (179 registers a
  // thread in the backward's row kernel, 2 blocks an SM), wastes fewer
  // registers: a gpt2-xl step 0.7-1.1 ms faster on an H100.
  if (columns <= 32 * 52) {
    return f(std::integral_constant<int, 52>{});
  }
  return f(std::integral_constant<int, 64>{});
}

// Whether every pointer (null ones aside) is 16-byte aligned.
bool aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return false;
    }
  }
  return true;
}

} // namespace

int64_t add_norm_backward_partials(int64_t rows, int columns) {
  return (fused_backward(columns) ? fused_blocks(rows) : chunks(rows)) * 2 *
      columns;
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
  const bool vec =
      a.columns % 4 == 0 && aligned({a.x, a.r, a.weight, a.bias, a.sum, a.y});
  return with_type(a.y_format, [&](auto y) {
    using Y = typename decltype(y)::type;
    return with_per_lane(a.columns, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      if (vec && r_float) {
        add_norm_forward_kernel<kPer, 4, float, Y>
            <<<blocks, kWarps * 32, 0, stream>>>(a);
      } else if (vec) {
        add_norm_forward_kernel<kPer, 4, Y, Y>
            <<<blocks, kWarps * 32, 0, stream>>>(a);
      } else if (r_float) {
        add_norm_forward_kernel<kPer, 1, float, Y>
            <<<blocks, kWarps * 32, 0, stream>>>(a);
      } else {
        add_norm_forward_kernel<kPer, 1, Y, Y>
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
  const bool vec = a.columns % 4 == 0 &&
      aligned({a.sum, a.weight, a.dy, a.dsum, a.dx, a.dr});
  const int v = vec ? 4 : 1;
  const dim3 column_blocks(
      static_cast<unsigned>((a.columns + 32 * v - 1) / (32 * v)),
      static_cast<unsigned>(chunks(a.rows)));
  const bool fused = fused_backward(a.columns);
  const cudaError_t error = with_type(a.dy_format, [&](auto dy) {
    using DY = typename decltype(dy)::type;
    if (fused) {
      const auto blocks = static_cast<unsigned>(fused_blocks(a.rows));
      const auto warp_rows = static_cast<int>(fused_warp_rows(a.rows));
      return with_per_lane(a.columns, [&](auto p) {
        constexpr int kPer = decltype(p)::value;
        // NOTE: with_per_lane's widths past kMaxFusedColumns are not
        // instantiated here (their shared sums would not fit).
        if constexpr (kPer * 32 <= kMaxFusedColumns) {
          if (vec) {
            add_norm_dx_dweight_kernel<kPer, 4, DY>
                <<<blocks, kWarps * 32, 0, stream>>>(a, warp_rows);
          } else {
            add_norm_dx_dweight_kernel<kPer, 1, DY>
                <<<blocks, kWarps * 32, 0, stream>>>(a, warp_rows);
          }
          return cudaGetLastError();
        }
        return cudaErrorInvalidValue;
      });
    }
    const cudaError_t e = with_per_lane(a.columns, [&](auto p) {
      constexpr int kPer = decltype(p)::value;
      if (vec) {
        add_norm_dx_kernel<kPer, 4, DY>
            <<<row_blocks, kWarps * 32, 0, stream>>>(a);
      } else {
        add_norm_dx_kernel<kPer, 1, DY>
            <<<row_blocks, kWarps * 32, 0, stream>>>(a);
      }
      return cudaGetLastError();
    });
    if (e != cudaSuccess) {
      return e;
    }
    if (vec) {
      add_norm_dweight_kernel<4, DY>
          <<<column_blocks, dim3(32, kColumnRows), 0, stream>>>(a, per);
    } else {
      add_norm_dweight_kernel<1, DY>
          <<<column_blocks, dim3(32, kColumnRows), 0, stream>>>(a, per);
    }
    return cudaGetLastError();
  });
  if (error != cudaSuccess) {
    return error;
  }
  add_norm_partials_kernel<<<
      static_cast<unsigned>((2 * a.columns + 31) / 32),
      dim3(32, 8),
      0,
      stream>>>(a, fused ? fused_blocks(a.rows) : chunks(a.rows));
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
