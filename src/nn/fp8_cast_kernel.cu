#include "fp8_cast_kernel.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_dtype.cuh"

namespace lamp::nn::detail {
namespace {

constexpr int kTile = 64; // a block's tile: kTile x kTile elements
constexpr int kThreadsX = 32; // each thread: two neighbouring columns
constexpr int kThreadsY = 8; // ... of kTile / kThreadsY rows

// Two neighbouring elements of x as floats (one 4- or 8-byte load).
template <typename T>
struct Pair;
template <>
struct Pair<float> {
  __device__ static float2 load(const float* p) {
    return *reinterpret_cast<const float2*>(p);
  }
};
template <>
struct Pair<__half> {
  __device__ static float2 load(const __half* p) {
    return __half22float2(*reinterpret_cast<const __half2*>(p));
  }
};
template <>
struct Pair<__nv_bfloat16> {
  __device__ static float2 load(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
};

// |v|'s bits: an unsigned order in which NaN > inf > any finite value, so
// that an integer max is amax's (NaN propagates, as ATen's amax).
__device__ inline unsigned abs_bits(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// e^(2u) and 1 / (1 + e^(2u)) with the hardware's approximate exp2 and
// reciprocal (a few units in the last place of each, the exp2's more as
// |u| grows: the product u * 2 log2(e) is rounded). tanh(u) = 1 - 2r, in 5
// instructions where tanhf takes 14: the GELU casts are bound by the
// instructions they issue (docs/design/fp8.md). e overflows to inf (r 0)
// or flushes to 0 (r 1) where tanhf is +-1; NaN stays NaN.
struct TanhParts {
  float e, r;
};
__device__ inline TanhParts tanh_parts(float u) {
  TanhParts p;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p.e) : "f"(u * 2.88539008f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(p.r) : "f"(1.0f + p.e));
  return p;
}

// GELU's tanh approximation and its derivative in fp32, with ATen's CUDA
// kernels' constants (sqrt(2 / pi) from the double product, rounded once).
// - The forward is ATen's formula and order of operations with tanh from
//   tanh_parts (within ~1e-6 of tanhf): rounded to x's type it is
//   at::gelu(x, "tanh") but where that moves a value across a rounding
//   boundary.
// - The derivative is rewritten so that nothing cancels: with t = 1 - 2r,
//   1 + t = 2er and 1 - t^2 = 4er^2, so gelu'(x) = er (1 + 2xr beta (1 +
//   3 kappa x^2)). ATen's 1 - t * t loses the small derivatives of x below
//   about -2 (down to a wrong sign or 0); this keeps them within a few
//   units of fp32 of the exact value.
// Fp8GeluMlpGpu.CastOpsAreWithinARoundingOfTheExactOps checks both.
constexpr float kGeluBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
constexpr float kGeluKappa = 0.044715f;

__device__ inline float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  return 0.5f * x * (1.0f + fmaf(-2.0f, tanh_parts(inner).r, 1.0f));
}

__device__ inline float gelu_tanh_backward(float dy, float x) {
  const float x_sq = x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * (x_sq * x));
  const auto [e, r] = tanh_parts(inner);
  // e / (1 + e): as 1 - r once e >= 1 (e may be inf, r 0).
  const float er = e < 1.0f ? e * r : 1.0f - r;
  const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
  return dy * (er * fmaf(2.0f * x * r, inner_derivative, 1.0f));
}

// op(v, aux) rounded to T, as a float (Fp8CastOp).
template <typename T, Fp8CastOp Op>
__device__ inline float apply_op(float v, float aux) {
  if constexpr (Op == Fp8CastOp::kGelu) {
    return to_float(from_float<T>(gelu_tanh(v)));
  } else if constexpr (Op == Fp8CastOp::kGeluBackward) {
    return to_float(from_float<T>(gelu_tanh_backward(v, aux)));
  } else {
    return v;
  }
}

// NOTE: c10's float -> Float8_e4m3fn / Float8_e5m2 conversions (what the
// reference's .to(fp8) does) round to nearest even, turn NaN into 0x7F and
// e5m2's out-of-range values into inf (0x7C), keeping the sign. The values
// reaching the hardware conversion here are finite and within the format's
// range (saturated before), where it rounds to nearest even too; the
// non-finite ones get c10's bytes directly.
template <Fp8CastFormat F>
__device__ inline uint8_t to_fp8(float s, bool saturate_inf) {
  constexpr float kMax = F == Fp8CastFormat::kE4M3 ? 448.0f : 57344.0f;
  const uint8_t sign = (__float_as_uint(s) >> 24) & 0x80u;
  if (isnan(s)) {
    return 0x7F | sign;
  }
  if (isinf(s) && !saturate_inf) {
    return (F == Fp8CastFormat::kE4M3 ? 0x7F : 0x7C) | sign;
  }
  // ATen's clamp(-max, max): inf saturates, -0 stays -0.
  s = fminf(fmaxf(s, -kMax), kMax);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(
      s, __NV_SATFINITE, F == Fp8CastFormat::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// The block's amax into *amax: a warp max, the warps' maxima through shared
// memory, then one atomic a block. NOTE: every thread of the block calls it
// (it synchronises). One atomic a warp made the casts' amax cost as much as
// the rest of the kernel: atomics on one address are serialised.
template <int kWarps>
__device__ inline void fold_amax(unsigned m, float* amax) {
  __shared__ unsigned warp_max[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  const int t = threadIdx.x + threadIdx.y * blockDim.x;
  if (t % 32 == 0) {
    warp_max[t / 32] = m;
  }
  __syncthreads();
  if (t == 0) {
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      m = max(m, warp_max[w]);
    }
    if (m != 0) {
      atomicMax(reinterpret_cast<unsigned*>(amax), m);
    }
  }
}

// Args::ride_*: the first block's threads cast the ride-along vector.
__device__ void cast_ride_along(const Fp8CastArgs& a, int thread, int threads) {
  if (a.ride_dst == nullptr || blockIdx.x != 0 || blockIdx.y != 0) {
    return;
  }
  for (int64_t i = thread; i < a.ride_n; i += threads) {
    if (a.ride_half) {
      static_cast<__half*>(a.ride_dst)[i] = __float2half_rn(a.ride_src[i]);
    } else {
      static_cast<__nv_bfloat16*>(a.ride_dst)[i] =
          __float2bfloat16_rn(a.ride_src[i]);
    }
  }
}

// One kTile x kTile tile of x: thread (tx, ty) reads columns 2 tx, 2 tx + 1
// of rows ty, ty + 8, ... (a warp reads 64 consecutive elements of a row),
// writes their bytes to `out` the same way, and through shared memory
// writes the transpose's rows (a warp writes 64 consecutive bytes of one).
template <typename T, Fp8CastFormat F>
__global__ void __launch_bounds__(kThreadsX* kThreadsY)
    fp8_cast_kernel(Fp8CastArgs a) {
  // NOTE: 4 bytes of padding a row: the transpose's reads of a column go to
  // different banks (two-way conflicts at most).
  __shared__ uint8_t tile[kTile][kTile + 4];
  const T* x = static_cast<const T*>(a.x);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const float scale = *a.scale;
  if (a.inverse_scale != nullptr && blockIdx.x == 0 && blockIdx.y == 0 &&
      tx == 0 && ty == 0) {
    *a.inverse_scale = __frcp_rn(scale);
  }
  cast_ride_along(a, ty * kThreadsX + tx, kThreadsX * kThreadsY);
  const int64_t c = col0 + 2 * tx;
  unsigned m = 0;
#pragma unroll
  for (int i = ty; i < kTile; i += kThreadsY) {
    const int64_t r = row0 + i;
    // NOTE: cols is even, so a pair is all in or all out.
    if (r < a.rows && c < a.cols) {
      const float2 v = Pair<T>::load(x + r * a.cols + c);
      m = max(m, max(abs_bits(v.x), abs_bits(v.y)));
      const uint8_t b0 = to_fp8<F>(v.x * scale, a.saturate_inf);
      const uint8_t b1 = to_fp8<F>(v.y * scale, a.saturate_inf);
      if (a.out != nullptr) {
        *reinterpret_cast<uint16_t*>(a.out + r * a.cols + c) =
            static_cast<uint16_t>(b0 | (b1 << 8));
      }
      tile[i][2 * tx] = b0;
      tile[i][2 * tx + 1] = b1;
    }
  }
  if (a.amax != nullptr) {
    fold_amax<kThreadsX * kThreadsY / 32>(m, a.amax);
  }
  if (a.out_t == nullptr) {
    return;
  }
  __syncthreads();
  // The transpose: its row j is x's column col0 + j; thread tx writes its
  // elements row0 + 2 tx, row0 + 2 tx + 1.
  const int64_t r = row0 + 2 * tx;
#pragma unroll
  for (int j = ty; j < kTile; j += kThreadsY) {
    const int64_t cj = col0 + j;
    if (cj < a.cols && r < a.rows) {
      // NOTE: rows is even too.
      *reinterpret_cast<uint16_t*>(a.out_t + cj * a.rows + r) =
          static_cast<uint16_t>(tile[2 * tx][j] | (tile[2 * tx + 1][j] << 8));
    }
  }
}

// Eight neighbouring elements of x as floats (16-byte loads).
template <typename T>
struct Eight;
template <>
struct Eight<float> {
  __device__ static void load(const float* p, float (&v)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};
template <typename H, typename H2, float2 (*ToFloat2)(H2)>
struct EightHalves {
  __device__ static void load(const H* p, float (&v)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const H2* h = reinterpret_cast<const H2*>(&raw);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = ToFloat2(h[q]);
      v[2 * q] = f.x;
      v[2 * q + 1] = f.y;
    }
  }
};
__device__ inline float2 half2_to_float2(__half2 h) {
  return __half22float2(h);
}
__device__ inline float2 bfloat162_to_float2(__nv_bfloat162 h) {
  return __bfloat1622float2(h);
}
template <>
struct Eight<__half> : EightHalves<__half, __half2, half2_to_float2> {};
template <>
struct Eight<__nv_bfloat16>
    : EightHalves<__nv_bfloat16, __nv_bfloat162, bfloat162_to_float2> {};

// Eight values * scale in FP8, packed little-endian into two words; their
// |x| folded into m. NOTE: when every scaled value is finite (the usual
// case) only the conversion runs, two values an instruction (its
// saturation is the reference's clamp: finite values past the format's
// largest become it, -0 stays -0); otherwise to_fp8's special cases,
// element by element. The GELU casts are bound by the instructions they
// issue, the others nearly (docs/design/fp8.md), so the test for the usual
// case is one multiply: rounding is monotonic, so the largest |x * scale|
// is the largest |x| times |scale|, finite exactly when every one is.
template <Fp8CastFormat F>
__device__ inline uint2 convert_eight(
    const float (&v)[8],
    float scale,
    bool saturate_inf,
    unsigned& m) {
  unsigned local = 0;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    local = max(local, abs_bits(v[q]));
  }
  m = max(m, local);
  uint32_t w[2] = {0, 0};
  if (local < 0x7f800000u &&
      abs_bits(__uint_as_float(local) * scale) < 0x7f800000u) {
#pragma unroll
    for (int q = 0; q < 8; q += 2) {
      const uint32_t pair = __nv_cvt_float2_to_fp8x2(
          make_float2(v[q] * scale, v[q + 1] * scale),
          __NV_SATFINITE,
          F == Fp8CastFormat::kE4M3 ? __NV_E4M3 : __NV_E5M2);
      w[q / 4] |= pair << (8 * (q % 4));
    }
  } else {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      w[q / 4] |= static_cast<uint32_t>(to_fp8<F>(v[q] * scale, saturate_inf))
          << (8 * (q % 4));
    }
  }
  return make_uint2(w[0], w[1]);
}

constexpr int kVecThreads = 256;
// A tile row in shared memory: 64 bytes and one word of padding (17 words),
// so that the transpose's column reads spread over the banks.
constexpr int kVecRowWords = kTile / 4 + 1;

// fp8_cast_kernel's tile eight elements at a time (rows and cols multiples
// of 8, x 16-byte aligned): thread t reads columns 8 (t % 8) ... + 7 of
// rows t / 8 and t / 8 + 32 (16- or 32-byte loads), writes their 8 bytes
// row-major, and then 8 bytes of the transpose: 8 rows of one column.
// NOTE: registers held to 6 blocks an SM (40 a thread), 5 with a GELU (48):
// the GELU backward would take 53 (4 blocks). None spills. Where an SM
// holds fewer than 1,536 threads (before sm_80; FP8 runs on sm_89 and
// newer) no bound.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define LAMP_FP8_CAST_MIN_BLOCKS(op) 1
#else
#define LAMP_FP8_CAST_MIN_BLOCKS(op) ((op) == Fp8CastOp::kNone ? 6 : 5)
#endif
template <typename T, Fp8CastFormat F, Fp8CastOp Op, bool kSums>
__global__ void __launch_bounds__(kVecThreads, LAMP_FP8_CAST_MIN_BLOCKS(Op))
    fp8_cast_vec_kernel(Fp8CastArgs a) {
  __shared__ uint32_t tile[kTile][kVecRowWords];
  const T* x = static_cast<const T*>(a.x);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int t = threadIdx.x;
  const float scale = *a.scale;
  if (a.inverse_scale != nullptr && blockIdx.x == 0 && blockIdx.y == 0 &&
      t == 0) {
    *a.inverse_scale = __frcp_rn(scale);
  }
  cast_ride_along(a, t, kVecThreads);
  const int group = t % 8;
  const int64_t c = col0 + 8 * group;
  unsigned m = 0;
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0}; // of this thread's two rows
  // NOTE: both rows' loads first, then the arithmetic: two loads in flight
  // a thread.
  float v[2][8];
  float aux[2][8];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int64_t r = row0 + t / 8 + 32 * k;
    if (r < a.rows && c < a.cols) {
      Eight<T>::load(x + r * a.cols + c, v[k]);
      if constexpr (Op == Fp8CastOp::kGeluBackward) {
        Eight<T>::load(static_cast<const T*>(a.aux) + r * a.cols + c, aux[k]);
      }
    }
  }
  if constexpr (Op != Fp8CastOp::kNone) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        v[k][q] = apply_op<T, Op>(
            v[k][q], Op == Fp8CastOp::kGeluBackward ? aux[k][q] : 0.0f);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = t / 8 + 32 * k;
    const int64_t r = row0 + i;
    if (r < a.rows && c < a.cols) {
      if constexpr (kSums) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          sums[q] += v[k][q];
        }
      }
      const uint2 b = convert_eight<F>(v[k], scale, a.saturate_inf, m);
      if (a.out != nullptr) {
        *reinterpret_cast<uint2*>(a.out + r * a.cols + c) = b;
      }
      tile[i][2 * group] = b.x;
      tile[i][2 * group + 1] = b.y;
    }
  }
  if (a.amax != nullptr) {
    fold_amax<kVecThreads / 32>(m, a.amax);
  }
  if constexpr (kSums) {
    // The tile's column sums: the 32 row groups' partial sums added in
    // order by one thread a column (the same bits every run).
    __shared__ float group_sums[32][kTile];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      group_sums[t / 8][8 * group + q] = sums[q];
    }
    __syncthreads();
    if (t < kTile && col0 + t < a.cols) {
      float total = 0;
      for (int g = 0; g < 32; ++g) {
        total += group_sums[g][t];
      }
      a.column_partials[static_cast<int64_t>(blockIdx.x) * a.cols + col0 + t] =
          total;
    }
  }
  if (a.out_t == nullptr) {
    return;
  }
  __syncthreads();
  // The transpose: 64 columns x 8 runs of 8 rows; run `run` of column j is
  // 8 bytes of the transpose's row col0 + j.
  const auto* bytes = reinterpret_cast<const uint8_t*>(tile);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int idx = t + kVecThreads * k;
    const int run = idx % 8, j = idx / 8;
    const int64_t cj = col0 + j, r = row0 + 8 * run;
    if (cj < a.cols && r < a.rows) {
      uint32_t w[2] = {0, 0};
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        w[q / 4] |=
            static_cast<uint32_t>(bytes[(8 * run + q) * (4 * kVecRowWords) + j])
            << (8 * (q % 4));
      }
      *reinterpret_cast<uint2*>(a.out_t + cj * a.rows + r) =
          make_uint2(w[0], w[1]);
    }
  }
}

constexpr int kAmaxThreads = 256;

template <typename T, Fp8CastOp Op>
__global__ void __launch_bounds__(kAmaxThreads)
    fp8_amax_kernel(const T* x, const T* aux, int64_t n, float* amax) {
  unsigned m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n;
       i += stride) {
    const float a = Op == Fp8CastOp::kGeluBackward ? to_float(aux[i]) : 0.0f;
    m = max(m, abs_bits(apply_op<T, Op>(to_float(x[i]), a)));
  }
  fold_amax<kAmaxThreads / 32>(m, amax);
}

template <typename T, Fp8CastFormat F, bool kSums>
void launch_vec_sums(
    const dim3& grid,
    const Fp8CastArgs& a,
    cudaStream_t stream) {
  switch (a.op) {
    case Fp8CastOp::kNone:
      fp8_cast_vec_kernel<T, F, Fp8CastOp::kNone, kSums>
          <<<grid, kVecThreads, 0, stream>>>(a);
      break;
    case Fp8CastOp::kGelu:
      fp8_cast_vec_kernel<T, F, Fp8CastOp::kGelu, kSums>
          <<<grid, kVecThreads, 0, stream>>>(a);
      break;
    case Fp8CastOp::kGeluBackward:
      fp8_cast_vec_kernel<T, F, Fp8CastOp::kGeluBackward, kSums>
          <<<grid, kVecThreads, 0, stream>>>(a);
      break;
  }
}

// NOTE: the column sums are a template argument: a cast that writes none
// (the inputs', the weights') adds nothing up.
template <typename T, Fp8CastFormat F>
void launch_vec(const dim3& grid, const Fp8CastArgs& a, cudaStream_t stream) {
  if (a.column_partials != nullptr) {
    launch_vec_sums<T, F, true>(grid, a, stream);
  } else {
    launch_vec_sums<T, F, false>(grid, a, stream);
  }
}

template <typename T>
cudaError_t launch_typed(const Fp8CastArgs& a, cudaStream_t stream) {
  const dim3 block(kThreadsX, kThreadsY);
  // NOTE: row tiles in x (up to 2^31 - 1 of them), column tiles in y.
  const dim3 grid(
      static_cast<unsigned>((a.rows + kTile - 1) / kTile),
      static_cast<unsigned>((a.cols + kTile - 1) / kTile));
  if (fp8_cast_is_eight_wide(a)) {
    if (a.format == Fp8CastFormat::kE4M3) {
      launch_vec<T, Fp8CastFormat::kE4M3>(grid, a, stream);
    } else {
      launch_vec<T, Fp8CastFormat::kE5M2>(grid, a, stream);
    }
    return cudaGetLastError();
  }
  if (a.format == Fp8CastFormat::kE4M3) {
    fp8_cast_kernel<T, Fp8CastFormat::kE4M3><<<grid, block, 0, stream>>>(a);
  } else {
    fp8_cast_kernel<T, Fp8CastFormat::kE5M2><<<grid, block, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T>
void launch_amax(
    unsigned grid,
    const void* x,
    const void* aux,
    int64_t n,
    float* amax,
    Fp8CastOp op,
    cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* at = static_cast<const T*>(aux);
  switch (op) {
    case Fp8CastOp::kNone:
      fp8_amax_kernel<T, Fp8CastOp::kNone>
          <<<grid, kAmaxThreads, 0, stream>>>(xt, at, n, amax);
      break;
    case Fp8CastOp::kGelu:
      fp8_amax_kernel<T, Fp8CastOp::kGelu>
          <<<grid, kAmaxThreads, 0, stream>>>(xt, at, n, amax);
      break;
    case Fp8CastOp::kGeluBackward:
      fp8_amax_kernel<T, Fp8CastOp::kGeluBackward>
          <<<grid, kAmaxThreads, 0, stream>>>(xt, at, n, amax);
      break;
  }
}

constexpr int kFoldColumns = 32; // a block's columns: one a lane
constexpr int kFoldGroups = 8; // ... and its warps, each every 8th tile

// out[c] = the sum of partials[tile][c] over the tiles: warp g adds tiles
// g, g + 8, ... in order, then one thread adds the 8 warps' sums in order
// (the same bits every run). NOTE: a thread a column walking every tile
// (25 blocks for GPT-2 XL's 6,400 columns, 128 dependent loads each) took
// ~16 us a call, 3 ms of a gpt2-xl step.
__global__ void __launch_bounds__(kFoldColumns* kFoldGroups)
    fp8_column_fold_kernel(
        const float* partials,
        int64_t tiles,
        int64_t cols,
        float* out) {
  __shared__ float group_sums[kFoldGroups][kFoldColumns];
  const int lane = threadIdx.x % kFoldColumns;
  const int g = threadIdx.x / kFoldColumns;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFoldColumns + lane;
  float total = 0;
  if (c < cols) {
    for (int64_t i = g; i < tiles; i += kFoldGroups) {
      total += partials[i * cols + c];
    }
  }
  group_sums[g][lane] = total;
  __syncthreads();
  if (g == 0 && c < cols) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kFoldGroups; ++k) {
      sum += group_sums[k][lane];
    }
    out[c] = sum;
  }
}

} // namespace

bool fp8_cast_is_eight_wide(const Fp8CastArgs& args) {
  return args.rows % 8 == 0 && args.cols % 8 == 0 &&
      reinterpret_cast<uintptr_t>(args.x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(args.aux) % 16 == 0;
}

cudaError_t launch_fp8_column_fold(
    const float* partials,
    int64_t tiles,
    int64_t cols,
    float* out,
    cudaStream_t stream) {
  if (cols <= 0) {
    return cudaSuccess;
  }
  const auto blocks =
      static_cast<unsigned>((cols + kFoldColumns - 1) / kFoldColumns);
  fp8_column_fold_kernel<<<blocks, kFoldColumns * kFoldGroups, 0, stream>>>(
      partials, tiles, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_fp8_cast(const Fp8CastArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.cols <= 0) {
    return cudaSuccess;
  }
  if (args.rows % 2 != 0 || args.cols % 2 != 0 ||
      (args.cols + kTile - 1) / kTile > 65535) {
    return cudaErrorInvalidValue;
  }
  if ((args.column_partials != nullptr || args.op != Fp8CastOp::kNone) &&
      !fp8_cast_is_eight_wide(args)) {
    return cudaErrorInvalidValue;
  }
  if ((args.op == Fp8CastOp::kGeluBackward) != (args.aux != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if ((args.ride_dst != nullptr) != (args.ride_src != nullptr) ||
      args.ride_n < 0) {
    return cudaErrorInvalidValue;
  }
  switch (args.input_type) {
    case Fp8CastInput::kFloat:
      return launch_typed<float>(args, stream);
    case Fp8CastInput::kHalf:
      return launch_typed<__half>(args, stream);
    case Fp8CastInput::kBFloat16:
      return launch_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_fp8_amax(
    Fp8CastInput input_type,
    const void* x,
    int64_t n,
    float* amax,
    cudaStream_t stream,
    Fp8CastOp op,
    const void* aux) {
  if (n <= 0) {
    return cudaSuccess;
  }
  if ((op == Fp8CastOp::kGeluBackward) != (aux != nullptr)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = kAmaxThreads;
  // Enough blocks to fill the GPU; each thread then strides.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 1024);
  const auto grid = static_cast<unsigned>(blocks);
  switch (input_type) {
    case Fp8CastInput::kFloat:
      launch_amax<float>(grid, x, aux, n, amax, op, stream);
      break;
    case Fp8CastInput::kHalf:
      launch_amax<__half>(grid, x, aux, n, amax, op, stream);
      break;
    case Fp8CastInput::kBFloat16:
      launch_amax<__nv_bfloat16>(grid, x, aux, n, amax, op, stream);
      break;
  }
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
