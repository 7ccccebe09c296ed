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
// The backward (add_norm_dx_dweight_kernel): at least kBackwardWarpRows rows
// a warp, at most kMaxBlocks blocks (their partial sums of the weight's and
// bias's gradients are added in a fixed order); the weight's sums in
// registers for rows up to kMaxRegisterSumColumns wide, else in shared memory
// (add_norm_dx_dweight_wide_kernel, kWideWarps warps a block).
constexpr int64_t kBackwardWarpRows = 8;
constexpr int64_t kMaxBlocks = 1024;
constexpr int kMaxRegisterSumColumns = 1024;
constexpr int kWideWarps = 2;
// Note [Two warps a row]
// A lane of the one-warp kernels holds kPer columns of its row (and their
// residual, weight and gradient) in registers: at gpt2-xl's 1,600 columns,
// 52 floats a lane, 128 registers a thread forward and 195 backward, so few
// warps are in flight and the kernels moved ~2.0 TB/s on an H100. With two
// warps a row (add_norm_forward_kernel<..., 2>,
// add_norm_dx_dweight_split_kernel) a lane holds half the columns (70 and 96
// registers): forward at 1,600 columns 66.8 us against 77.2, backward 87.2
// against 100.5, at 1,024 forward 39.3 against 48.1 (8,192 rows, bf16, residual
// bias; the benchmark benchmarks/add_layer_norm, H100, 2026-12-07); the
// backward at 1,024 was slower with two warps (65.2 against 58.8), so it splits
// only rows its register kernel cannot take. The row's two halves meet in
// shared memory; both warps add the halves' sums in the same order, so the
// row's statistics are one value. gpt2-xl checkpointed, bs 8: 214.9 ms a
// step against 216.6 / 217.2.
// The forward splits rows wider than this (4-wide packs).
constexpr int kSplitForwardFrom = 768;

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

// p[0, V) += v[0, V) (shared memory, aligned to V floats).
template <int V>
__device__ __forceinline__ void add_pack(float* p, const float* v) {
  if constexpr (V == 4) {
    float4 s = *reinterpret_cast<float4*>(p);
    s.x += v[0];
    s.y += v[1];
    s.z += v[2];
    s.w += v[3];
    *reinterpret_cast<float4*>(p) = s;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      p[e] += v[e];
    }
  }
}

// V values at p + c in format f (a bias: any of the three types), as
// floats. NOTE: a switch on a format that is the same for the whole grid.
template <int V>
__device__ __forceinline__ void load_pack_as(
    const void* p,
    NormFormat f,
    int c,
    float* out) {
  switch (f) {
    case NormFormat::kFloat:
      load_pack<V>(static_cast<const float*>(p) + c, out);
      break;
    case NormFormat::kHalf:
      load_pack<V>(static_cast<const __half*>(p) + c, out);
      break;
    default:
      load_pack<V>(static_cast<const __nv_bfloat16*>(p) + c, out);
      break;
  }
}

__device__ __forceinline__ void store_as(
    void* p,
    NormFormat f,
    int c,
    float v) {
  switch (f) {
    case NormFormat::kFloat:
      static_cast<float*>(p)[c] = v;
      break;
    case NormFormat::kHalf:
      static_cast<__half*>(p)[c] = from_float<__half>(v);
      break;
    default:
      static_cast<__nv_bfloat16*>(p)[c] = from_float<__nv_bfloat16>(v);
      break;
  }
}

// The column sums the backward keeps: the weight's and bias's gradients,
// and with dr_bias the residual bias's.
__host__ __device__ inline int backward_sums(const AddNormBackward& a) {
  return a.dr_bias != nullptr ? 3 : 2;
}

// Row kernels: lane `lane` holds packs k = 0, 1, ... of V columns starting
// at (lane + 32 k) V, kPer / V of them (kPer floats); packs past the row's
// end hold zeros. V = 4 needs columns % 4 == 0 and aligned rows.
//
// NOTE: the element types are template arguments, and each operand is
// loaded in a loop of its own: all of a row's loads are in flight before
// the first is used (a switch on the type per element kept one in flight).
//
// kSplit 2 (Note [Two warps a row]): two warps a row (kWarps / 2 rows a
// block); warp `part` of a row holds the pack rounds part, part + 2, ...,
// so a lane holds half the columns (gpt2-xl's 1,600: 28 floats, not 52),
// and the row's two sums meet in shared memory.
template <int kPer, int V, typename R, typename Y, int kSplit = 1>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_forward_kernel(AddNormForward a) {
  constexpr int kPacks = kPer / V;
  __shared__ float partial[kSplit == 2 ? kWarps : 1];
  const int warp = threadIdx.x / 32;
  const int part = warp % kSplit;
  const int64_t row = int64_t{blockIdx.x} * (kWarps / kSplit) + warp / kSplit;
  const int lane = threadIdx.x % 32;
  const bool live = row < a.rows;
  if constexpr (kSplit == 1) {
    if (!live) {
      return;
    }
  } // NOTE: else no early return: both warps of a row meet at barriers.
  const int64_t base = live ? row * a.columns : 0;
  auto column = [&](int k) { return (lane + 32 * (part + kSplit * k)) * V; };
  // The row's sum of `x` (a lane's share): the warp's, and with kSplit 2
  // both warps', added in the same order in both.
  auto row_sum = [&](float x) {
    x = warp_sum(x);
    if constexpr (kSplit == 2) {
      if (lane == 0) {
        partial[warp] = x;
      }
      __syncthreads();
      x = partial[warp & ~1] + partial[warp | 1];
      __syncthreads(); // `partial` is written again by the next call
    }
    return x;
  };
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = column(k);
    if (live && c < a.columns) {
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
      const int c = column(k);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        rv[k * V + e] = 0.f;
      }
      if (live && c < a.columns) {
        load_pack<V>(r + c, rv + k * V);
        if (a.r_bias != nullptr) {
          float rb[V];
          load_pack_as<V>(a.r_bias, a.r_bias_format, c, rb);
#pragma unroll
          for (int e = 0; e < V; ++e) {
            rv[k * V + e] += rb[e];
          }
        }
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
  const float mean = row_sum(sum) / a.columns;
  float var = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (column(k) < a.columns) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[k * V + e] - mean;
        var += d * d;
      }
    }
  }
  // NOTE: two passes over registers (mean, then squares about it): the
  // biased variance, as LayerNorm's.
  const float rstd = rsqrtf(row_sum(var) / a.columns + a.eps);
  if (!live) {
    return;
  }
  Y* y = static_cast<Y*>(a.y) + base;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = column(k);
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
  if (lane == 0 && part == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

// One row of the input gradient, by its warp; the residual's gradient (the
// same values) in the residual's type when dr is set (then DY's type).
// It also adds the row's dy * xhat and dy to the lane's columns' sums (the
// weight's and bias's gradients): kRegisters, in dw[i] and db[i] (i as
// g's); kShared, in the warp's dw[c] and db[c] in shared memory (c the
// column); and with dr_bias, dr's values as stored to the warp's drs[c] in
// shared memory (either way: no registers to spare).
enum class Sums { kRegisters, kShared };

// Two warps meet: bar.sync on named barrier `id` (1, 2, ...: 0 is
// __syncthreads') of 64 threads.
__device__ __forceinline__ void pair_barrier(int id) {
  asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory");
}

// kSplit 2 (Note [Two warps a row]): the row's two warps each take
// every other pack round (`part`: this warp's), and their sums meet in
// red[parity][warp][2] (shared, [2][kWarps][2] floats; parity alternates
// by row, so one barrier a row).
template <int kPer, int V, typename DY, Sums kSums, int kSplit = 1>
__device__ __forceinline__ void dx_row(
    const AddNormBackward& a,
    int64_t row,
    int lane,
    float* dw,
    float* db,
    float* drs,
    int part = 0,
    float* red = nullptr,
    int parity = 0) {
  constexpr int kPacks = kPer / V;
  auto column = [&](int k) { return (lane + 32 * (part + kSplit * k)) * V; };
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
    const int c = column(k);
    if (c < a.columns) {
      load_pack<V>(a.sum + base + c, xhat + k * V);
    }
  }
  // NOTE: dy is kept as it is until the sums have it: the weight a
  // register a column (kRegisters), or read again then, from L1 (kShared:
  // no registers to spare at 1,600 columns).
  constexpr bool kKeepW = kSums == Sums::kRegisters;
  float w[kKeepW ? kPer : V];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = column(k);
    if (c < a.columns) {
      load_pack<V>(dy + c, g + k * V);
      if constexpr (kKeepW) {
        load_pack<V>(a.weight + c, w + k * V);
      }
    }
  }
  const float mean = a.mean[row];
  const float rstd = a.rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int c = column(k);
    const bool inside = c < a.columns;
    float pw[V], pb[V]; // kShared: the pack's dy * xhat and dy
    if constexpr (kSums == Sums::kShared) {
      if (inside) {
        load_pack<V>(a.weight + c, w);
      }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int i = k * V + e;
      xhat[i] = inside ? (xhat[i] - mean) * rstd : 0.f;
      // NOTE: dy (0 past the row's end) times xhat, before the weight
      // scales dy.
      if constexpr (kSums == Sums::kRegisters) {
        dw[i] += g[i] * xhat[i];
        db[i] += g[i];
        g[i] = inside ? g[i] * w[i] : 0.f;
      } else {
        pw[e] = g[i] * xhat[i];
        pb[e] = g[i];
        g[i] = inside ? g[i] * w[e] : 0.f;
      }
      sum_g += g[i];
      sum_gx += g[i] * xhat[i];
    }
    if constexpr (kSums == Sums::kShared) {
      // NOTE: a pack at a time (16-byte accesses, no bank conflicts).
      if (inside) {
        add_pack<V>(dw + c, pw);
        add_pack<V>(db + c, pb);
      }
    }
  }
  sum_g = warp_sum(sum_g);
  sum_gx = warp_sum(sum_gx);
  if constexpr (kSplit == 2) {
    // NOTE: both warps add part 0's sums to part 1's, in that order: the
    // row's two halves see the same bits.
    const int warp = threadIdx.x / 32;
    float* slot = red + parity * kWarps * 2;
    if (lane == 0) {
      slot[warp * 2] = sum_g;
      slot[warp * 2 + 1] = sum_gx;
    }
    pair_barrier(1 + warp / 2);
    const int w0 = warp & ~1;
    sum_g = slot[w0 * 2] + slot[w0 * 2 + 2];
    sum_gx = slot[w0 * 2 + 1] + slot[w0 * 2 + 3];
  }
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
      const int c = column(k);
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
    const int c = column(k);
    if (c < a.columns) {
      store_pack<V>(a.dx + base + c, d + k * V);
      if (dr != nullptr) {
        store_pack<V>(dr + c, d + k * V);
        if (a.dr_bias != nullptr) {
          float rounded[V];
#pragma unroll
          for (int e = 0; e < V; ++e) {
            rounded[e] = to_float(from_float<DY>(d[k * V + e]));
          }
          add_pack<V>(drs + c, rounded);
        }
      }
    }
  }
}

// The input gradient and the weight's and bias's partial sums in one read
// (rows of at most kMaxRegisterSumColumns): block b takes `warp_rows` rows a
// warp, rows b kWarps warp_rows + kWarps i + warp; each lane keeps its
// columns' sums in registers over its rows, the block adds its warps' in
// warp order and writes them to partials[b][0, C) (weight), [C, 2C)
// (bias) and [2C, 3C) (residual bias, with dr_bias);
// add_norm_partials_kernel adds the blocks' rows in order (deterministic).
// NOTE: the sums had a kernel of their own (an earlier version of this one
// ran 256 blocks over all rows: a sixth of the memory's speed), which read
// dy and the sum a second time (6 of the backward's 22 bytes an element):
// here a gpt2 step (768 columns) took 34.24 ms instead of 34.79, a
// gpt2-medium one (1,024) 86.68 instead of 87.87, gpt2-xl (1,600, the wide
// kernel) 190.45 instead of 192.44 (H100).
template <int kPer, int V, typename DY>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_dx_dweight_kernel(AddNormBackward a, int warp_rows) {
  // [weight | bias | residual bias] a warp, kPer * 32 floats each; the
  // residual bias's filled in the rows' loop, the others after it.
  __shared__ __align__(16) float sums[kWarps][3 * kPer * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float dw[kPer], db[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    dw[i] = 0.f;
    db[i] = 0.f;
  }
  float* drs = sums[warp] + 2 * kPer * 32;
  if (a.dr_bias != nullptr) {
    for (int c = lane; c < kPer * 32; c += 32) {
      drs[c] = 0.f;
    }
    __syncwarp();
  }
  const int64_t first = int64_t{blockIdx.x} * kWarps * warp_rows + warp;
  for (int i = 0; i < warp_rows; ++i) {
    const int64_t row = first + int64_t{kWarps} * i;
    if (row >= a.rows) {
      break;
    }
    dx_row<kPer, V, DY, Sums::kRegisters>(a, row, lane, dw, db, drs);
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
  const int n = backward_sums(a);
  float* out = a.partials + int64_t{blockIdx.x} * n * a.columns;
  for (int j = threadIdx.x; j < n * a.columns; j += kWarps * 32) {
    const int c = (j / a.columns) * kPer * 32 + j % a.columns;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      total += sums[w][c];
    }
    out[j] = total;
  }
}

// add_norm_dx_dweight_kernel with two warps a row (Note [Two warps a row];
// rows of at most 2 x 32 x kPer columns): block b's pair p
// (warps 2p, 2p + 1) takes rows b 2 pair_rows + p + 2 i (i < pair_rows:
// half the rows a block of the one-warp kernels takes, so the same blocks
// and partials); the pair's column sums in sums[p] (each warp adds to its
// own columns, as the wide kernel's kShared), the block adds its two
// pairs' in pair order.
template <int kPer, int V, typename DY>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_dx_dweight_split_kernel(AddNormBackward a, int pair_rows) {
  constexpr int kColumns = 2 * kPer * 32;
  // [pair][weight | bias | residual bias][column]
  __shared__ __align__(16) float sums[2][3][kColumns];
  __shared__ float red[2 * kWarps * 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / 2, part = warp % 2;
  for (int c = threadIdx.x % 64; c < 3 * kColumns; c += 64) {
    sums[pair][0][c] = 0.f; // all three, contiguous
  }
  pair_barrier(1 + pair);
  const int64_t first = int64_t{blockIdx.x} * 2 * pair_rows + pair;
  for (int i = 0; i < pair_rows; ++i) {
    const int64_t row = first + 2 * int64_t{i};
    if (row >= a.rows) {
      break; // both warps of the pair: the same rows
    }
    dx_row<kPer, V, DY, Sums::kShared, 2>(
        a,
        row,
        lane,
        sums[pair][0],
        sums[pair][1],
        sums[pair][2],
        part,
        red,
        i % 2);
  }
  __syncthreads();
  const int n = backward_sums(a);
  float* out = a.partials + int64_t{blockIdx.x} * n * a.columns;
  for (int j = threadIdx.x; j < n * a.columns; j += kWarps * 32) {
    const int which = j / a.columns, c = j % a.columns;
    out[j] = sums[0][which][c] + sums[1][which][c];
  }
}

// add_norm_dx_dweight_kernel for wider rows (up to kMaxNormColumns): the
// sums in shared memory (dynamic: backward_sums(a) C floats a warp),
// kWideWarps warps a block (rows b kWideWarps warp_rows + kWideWarps i +
// warp). NOTE: in registers they would spill (152 a thread at 1,600
// columns without them).
template <int kPer, int V, typename DY>
__global__ void __launch_bounds__(kWideWarps * 32)
    add_norm_dx_dweight_wide_kernel(AddNormBackward a, int warp_rows) {
  extern __shared__ __align__(16) float wide_sums[];
  const int n = backward_sums(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* dw = wide_sums + warp * n * a.columns;
  float* db = dw + a.columns;
  float* drs = db + a.columns;
  for (int j = lane; j < n * a.columns; j += 32) {
    dw[j] = 0.f;
  }
  __syncwarp();
  const int64_t first = int64_t{blockIdx.x} * kWideWarps * warp_rows + warp;
  for (int i = 0; i < warp_rows; ++i) {
    const int64_t row = first + int64_t{kWideWarps} * i;
    if (row >= a.rows) {
      break;
    }
    dx_row<kPer, V, DY, Sums::kShared>(a, row, lane, dw, db, drs);
    // NOTE: a lane's shared sums are its own columns: no other lane
    // reads them before the block's barrier.
  }
  __syncthreads();
  float* out = a.partials + int64_t{blockIdx.x} * n * a.columns;
  for (int j = threadIdx.x; j < n * a.columns; j += kWideWarps * 32) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWideWarps; ++w) {
      total += wide_sums[w * n * a.columns + j];
    }
    out[j] = total;
  }
}

// Column sums of the blocks' partials: 32 columns a block, kFoldSlices
// threads down each, combined in a fixed order (deterministic).
// NOTE: 32 slices, not 8: a thread's chain of dependent loads is parts / 32
// long (512 blocks' partials at gpt2's 16,384 rows: 16 loads, not 64).
constexpr int kFoldSlices = 32;

__global__ void __launch_bounds__(32 * kFoldSlices)
    add_norm_partials_kernel(AddNormBackward a, int64_t parts) {
  __shared__ float sums[kFoldSlices][33];
  const int n = backward_sums(a);
  const int j = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.f;
  if (j < n * a.columns) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < parts; p += kFoldSlices) {
      sum += a.partials[p * n * a.columns + j];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < n * a.columns) {
    float total = 0.f;
    for (int k = 0; k < kFoldSlices; ++k) {
      total += sums[k][threadIdx.x];
    }
    if (j < a.columns) {
      a.dweight[j] = total;
    } else if (j < 2 * a.columns) {
      if (a.dbias != nullptr) {
        a.dbias[j - a.columns] = total;
      }
    } else {
      store_as(a.dr_bias, a.dr_bias_format, j - 2 * a.columns, total);
    }
  }
}

// Warps a block of the backward.
int backward_block_warps(int columns) {
  return columns <= kMaxRegisterSumColumns ? kWarps : kWideWarps;
}

// Rows a warp of the backward: kBackwardWarpRows, or more so that there are
// at most kMaxBlocks blocks.
int64_t backward_warp_rows(int64_t rows, int columns) {
  const int64_t warps = backward_block_warps(columns) * kMaxBlocks;
  return std::max(kBackwardWarpRows, (rows + warps - 1) / warps);
}

int64_t backward_blocks(int64_t rows, int columns) {
  const int64_t per_block =
      backward_block_warps(columns) * backward_warp_rows(rows, columns);
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

// Calls f(std::integral_constant<int, kPer>{}) for the smallest kPer of
// the two-warp kernels (2 x 32 lanes x kPer columns) that holds `columns`.
template <typename F>
cudaError_t with_split_per_lane(int columns, const F& f) {
  if (columns <= 2 * 32 * 16) {
    return f(std::integral_constant<int, 16>{});
  }
  if (columns <= 2 * 32 * 20) {
    return f(std::integral_constant<int, 20>{});
  }
  if (columns <= 2 * 32 * 28) {
    return f(std::integral_constant<int, 28>{});
  }
  return f(std::integral_constant<int, 32>{});
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

int64_t add_norm_backward_partials(int64_t rows, int columns, bool bias_sums) {
  return backward_blocks(rows, columns) * (bias_sums ? 3 : 2) * columns;
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
  if (a.r_bias != nullptr && a.r == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool vec = a.columns % 4 == 0 &&
      aligned({a.x, a.r, a.r_bias, a.weight, a.bias, a.sum, a.y});
  // Rows wider than kSplitForwardFrom (4-wide packs): two warps a row
  // (Note [Two warps a row]).
  if (vec && a.columns > kSplitForwardFrom) {
    const auto split_blocks =
        static_cast<unsigned>((a.rows + kWarps / 2 - 1) / (kWarps / 2));
    return with_type(a.y_format, [&](auto y) {
      using Y = typename decltype(y)::type;
      return with_split_per_lane(a.columns, [&](auto per) {
        constexpr int kPer = decltype(per)::value;
        if (r_float) {
          add_norm_forward_kernel<kPer, 4, float, Y, 2>
              <<<split_blocks, kWarps * 32, 0, stream>>>(a);
        } else {
          add_norm_forward_kernel<kPer, 4, Y, Y, 2>
              <<<split_blocks, kWarps * 32, 0, stream>>>(a);
        }
        return cudaGetLastError();
      });
    });
  }
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
      (a.dr != nullptr && a.dr_format != a.dy_format) ||
      (a.dr_bias != nullptr && a.dr == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const bool vec = a.columns % 4 == 0 &&
      aligned({a.sum, a.weight, a.dy, a.dsum, a.dx, a.dr});
  const auto blocks = static_cast<unsigned>(backward_blocks(a.rows, a.columns));
  const auto warp_rows =
      static_cast<int>(backward_warp_rows(a.rows, a.columns));
  // Rows of 1,025-1,792 columns (4-wide packs) two warps a row (Note [Two
  // warps a row]). A pair takes the rows of half a block of the one-warp
  // kernels (the same blocks and partials).
  if (vec && a.columns > kMaxRegisterSumColumns && a.columns <= 2 * 32 * 28) {
    const int pair_rows = backward_block_warps(a.columns) * warp_rows / 2;
    const cudaError_t error = with_type(a.dy_format, [&](auto dy) {
      using DY = typename decltype(dy)::type;
      return with_split_per_lane(a.columns, [&](auto per) {
        constexpr int kPer = decltype(per)::value;
        if constexpr (kPer <= 28) { // its shared sums: at most 43 KB
          add_norm_dx_dweight_split_kernel<kPer, 4, DY>
              <<<blocks, kWarps * 32, 0, stream>>>(a, pair_rows);
          return cudaGetLastError();
        } else {
          return cudaErrorInvalidValue; // not taken: columns <= 1,792
        }
      });
    });
    if (error != cudaSuccess) {
      return error;
    }
  } else {
    const cudaError_t error = with_type(a.dy_format, [&](auto dy) {
      using DY = typename decltype(dy)::type;
      return with_per_lane(a.columns, [&](auto p) {
        constexpr int kPer = decltype(p)::value;
        // NOTE: the register kernel is not instantiated past
        // kMaxRegisterSumColumns (its shared sums would not fit).
        if constexpr (kPer * 32 <= kMaxRegisterSumColumns) {
          if (vec) {
            add_norm_dx_dweight_kernel<kPer, 4, DY>
                <<<blocks, kWarps * 32, 0, stream>>>(a, warp_rows);
          } else {
            add_norm_dx_dweight_kernel<kPer, 1, DY>
                <<<blocks, kWarps * 32, 0, stream>>>(a, warp_rows);
          }
        } else {
          // At most 2 warps x 3 x 2,048 floats: 48 KiB, no opt-in needed.
          const size_t shared = sizeof(float) * kWideWarps * backward_sums(a) *
              static_cast<size_t>(a.columns);
          if (vec) {
            add_norm_dx_dweight_wide_kernel<kPer, 4, DY>
                <<<blocks, kWideWarps * 32, shared, stream>>>(a, warp_rows);
          } else {
            add_norm_dx_dweight_wide_kernel<kPer, 1, DY>
                <<<blocks, kWideWarps * 32, shared, stream>>>(a, warp_rows);
          }
        }
        return cudaGetLastError();
      });
    });
    if (error != cudaSuccess) {
      return error;
    }
  }
  add_norm_partials_kernel<<<
      static_cast<unsigned>((backward_sums(a) * a.columns + 31) / 32),
      dim3(32, kFoldSlices),
      0,
      stream>>>(a, backward_blocks(a.rows, a.columns));
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
