#include "cross_entropy_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>

namespace lamp::nn::detail {
namespace {

// Threads a block: a row each. NOTE: the kernel that keeps its row on chip
// (below) runs 1,024-thread blocks, two an SM (its shared memory), so an SM
// has as many threads in flight as with four blocks of 512.
constexpr int kThreads = 512;
constexpr int kOnChipThreads = 1024;

template <typename T>
__device__ float to_float(T v);
template <>
__device__ float to_float(float v) {
  return v;
}
template <>
__device__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float(float v) {
  return v;
}
template <>
__device__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

// A running softmax denominator: sum of exp(x - max) over what was seen.
struct MaxSum {
  float max;
  float sum;
};

__device__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) {
    return b;
  }
  if (b.max == -INFINITY) {
    return a;
  }
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// NOTE: a branch an element, and still at the memory's speed: a variant
// taking a 16-byte vector's max first, then one rescale and an exp each,
// measured the same on an H100 (1.629 against 1.632 ms a gpt2 step): the
// kernel is bound by its two reads and one write of the logits.
__device__ MaxSum add(MaxSum a, float x) {
  if (x == -INFINITY) {
    return a; // probability 0 (and exp(-inf - -inf) would be a NaN)
  }
  if (x <= a.max) {
    return {a.max, a.sum + expf(x - a.max)};
  }
  // NOTE: a NaN logit lands here too (x <= max is false): the max becomes
  // NaN and so does the row's loss, as in Python.
  return {x, a.sum * expf(a.max - x) + 1.f};
}

// The block's combined MaxSum, in every thread.
template <int Threads>
__device__ MaxSum block_combine(MaxSum v) {
  __shared__ float maxes[Threads / 32], sums[Threads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{
        __shfl_down_sync(0xffffffffu, v.max, offset),
        __shfl_down_sync(0xffffffffu, v.sum, offset)};
    v = combine(v, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    maxes[warp] = v.max;
    sums[warp] = v.sum;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < Threads / 32 ? MaxSum{maxes[lane], sums[lane]}
                            : MaxSum{-INFINITY, 0.f};
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum other{
          __shfl_down_sync(0xffffffffu, v.max, offset),
          __shfl_down_sync(0xffffffffu, v.sum, offset)};
      v = combine(v, other);
    }
    if (lane == 0) {
      maxes[0] = v.max;
      sums[0] = v.sum;
    }
  }
  __syncthreads();
  return {maxes[0], sums[0]};
}

// Elements a 16-byte vector holds.
template <typename T>
constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

// A vector of logits added into a running MaxSum.
template <typename T>
__device__ MaxSum add_pack(MaxSum ms, Pack<T> p) {
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) {
    ms = add(ms, to_float(p.v[k]));
  }
  return ms;
}

// softmax - one_hot(t) of the row's vector i (zeros for an ignored row).
// NOTE: exp(x - lse), not exp(x - max) / sum: one multiplication less, and
// the same within fp32 rounding.
template <typename T>
__device__ Pack<T> grad_pack(
    Pack<T> p,
    int64_t i,
    float lse,
    int64_t t,
    bool ignored) {
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) {
    const int64_t j = i * kPack<T> + k;
    const float g =
        ignored ? 0.f : expf(to_float(p.v[k]) - lse) - (j == t ? 1.f : 0.f);
    p.v[k] = from_float<T>(g);
  }
  return p;
}

// For the on-chip kernel (below): exp(x) as 2^(x log2 e), one FFMA and the
// SFU's ex2.approx (relative error ~2^-22, subnormal results flushed to 0),
// where expf's full-precision sequence is ~6 more instructions an element.
// NOTE: with the row read once, the kernel was bound by its instructions,
// not the memory (see the kernel's measurements).
constexpr float kLog2e = 1.4426950408889634f;

__device__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// add_pack with the vector's max taken first: one rescale of the running
// sum a vector (not one a new maximum) and no branch an element. -inf
// logits add ex2(-inf) = 0; a NaN logit makes the sum NaN (fmaxf skips it
// but its exp does not), and so the row's loss, as in Python. A +inf logit
// (a bf16 GEMM that overflowed) makes the loss NaN too, where Python's is
// +inf (its gradients NaN either way).
template <typename T>
__device__ MaxSum add_pack_approx(MaxSum ms, Pack<T> p) {
  float x[kPack<T>];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) {
    x[k] = to_float(p.v[k]);
    m = fmaxf(m, x[k]);
  }
  const float max = fmaxf(ms.max, m);
  if (max == -INFINITY) {
    return ms; // all -inf so far (and exp(-inf - -inf) would be a NaN)
  }
  const float scaled_max = max * kLog2e;
  float sum = ms.max == -INFINITY
      ? 0.f
      : ms.sum * exp2_approx(ms.max * kLog2e - scaled_max);
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) {
    sum += exp2_approx(fmaf(x[k], kLog2e, -scaled_max));
  }
  return {max, sum};
}

// grad_pack with exp2_approx, and the target's position in the vector
// found once (32-bit compares an element instead of 64-bit ones).
template <typename T>
__device__ Pack<T> grad_pack_approx(
    Pack<T> p,
    int64_t i,
    float lse,
    int64_t t,
    bool ignored) {
  const int64_t d = t - i * kPack<T>;
  const int target_k = d >= 0 && d < kPack<T> ? static_cast<int>(d) : -1;
  const float scaled_lse = lse * kLog2e;
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) {
    const float g = ignored
        ? 0.f
        : exp2_approx(fmaf(to_float(p.v[k]), kLog2e, -scaled_lse)) -
            (k == target_k ? 1.f : 0.f);
    p.v[k] = from_float<T>(g);
  }
  return p;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_xent_grad_kernel(
    T* logits,
    int64_t classes,
    int64_t stride,
    const int64_t* target,
    int64_t ignore_index,
    float* loss) {
  const int64_t r = blockIdx.x;
  T* row = logits + r * stride;
  const int64_t t = target[r];
  const bool ignored = t == ignore_index;
  // NOTE: 16-byte vectors where the row allows (GPT-2's 50,304 classes do
  // in every dtype), else one element at a time.
  const bool vectors =
      reinterpret_cast<uintptr_t>(row) % 16 == 0 && classes % kPack<T> == 0;
  const int64_t packs = vectors ? classes / kPack<T> : 0;
  auto* packed = reinterpret_cast<Pack<T>*>(row);

  MaxSum ms{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
    ms = add_pack(ms, packed[i]);
  }
  for (int64_t j = packs * kPack<T> + threadIdx.x; j < classes; j += kThreads) {
    ms = add(ms, to_float(row[j]));
  }
  ms = block_combine<kThreads>(ms);
  const float lse = ms.max + logf(ms.sum);
  const bool in_range = t >= 0 && t < classes;
  if (threadIdx.x == 0) {
    loss[r] = ignored ? 0.f : in_range ? lse - to_float(row[t]) : NAN;
  }
  // NOTE: thread 0 read the target's logit just above; no thread may write
  // over the row before that.
  __syncthreads();
  for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
    packed[i] = grad_pack(packed[i], i, lse, t, ignored);
  }
  for (int64_t j = packs * kPack<T> + threadIdx.x; j < classes; j += kThreads) {
    const float g =
        ignored ? 0.f : expf(to_float(row[j]) - lse) - (j == t ? 1.f : 0.f);
    row[j] = from_float<T>(g);
  }
}

// The same for a row of 16-byte vectors that fits in shared memory, read
// from memory once: each thread copies its vectors straight into shared
// memory (cp.async on sm_80 and later: all of them in flight at once, no
// registers held while they come), adds them up from there, and writes the
// gradient of the same vectors back, so the second pass reads shared memory
// instead of the logits again. Why the two-pass kernel's second read need
// not hit L2: four 512-thread blocks an SM, 132 SMs and 100 KB rows (GPT-2's
// 50,304 bf16 classes) are ~53 MB of rows in flight, more than an H100's
// 50 MB. Measured (H100, gpt2 bf16, eager traces in one call, 2026-12-07;
// the kernel's GPU time a step): one read, register loads and expf
// (ef3772d) 1.69 ms; cp.async 1.62; ex2.approx (add_pack_approx,
// grad_pack_approx) with register loads 1.22, with cp.async **1.10** (3.3 GB
// read and written: ~3 TB/s, the memory's speed). Graphed gpt2 steps,
// alternated in that call: 32.75 / 33.00 / 33.09 ms with ef3772d's kernel,
// 32.30 / 32.28 / 32.63 with this one. (ef3772d's kernel had made the
// graphed step 0.17 ms faster than the two-pass one.)
// NOTE: 32 registers a thread (ptxas -v, sm_90), so two blocks fit an SM's
// 64K registers; no minimum-blocks bound, which sm_75 and sm_86 (fewer
// threads an SM) would ignore with a warning.
template <typename T>
__global__ void __launch_bounds__(kOnChipThreads) softmax_xent_grad_on_chip(
    T* logits,
    int64_t packs,
    int64_t stride,
    const int64_t* target,
    int64_t ignore_index,
    float* loss) {
  extern __shared__ __align__(16) unsigned char kept_bytes[];
  auto* kept = reinterpret_cast<Pack<T>*>(kept_bytes);
  const int64_t r = blockIdx.x;
  T* row = logits + r * stride;
  auto* packed = reinterpret_cast<Pack<T>*>(row);
  const int64_t classes = packs * kPack<T>;
  const int64_t t = target[r];
  const bool ignored = t == ignore_index;

  // NOTE: a thread waits only for its own copies (wait_prior(0)) and reads
  // only the vectors it copied, so no barrier is needed before the sums.
  for (int64_t i = threadIdx.x; i < packs; i += kOnChipThreads) {
    __pipeline_memcpy_async(&kept[i], &packed[i], sizeof(Pack<T>));
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  MaxSum ms{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < packs; i += kOnChipThreads) {
    ms = add_pack_approx(ms, kept[i]);
  }
  ms = block_combine<kOnChipThreads>(ms);
  const float lse = ms.max + logf(ms.sum);
  const bool in_range = t >= 0 && t < classes;
  if (threadIdx.x == 0) {
    // NOTE: block_combine's barriers come after every thread's wait: the
    // target's vector, copied by any thread, is in shared memory by now.
    loss[r] = ignored ? 0.f
        : in_range    ? lse - to_float(kept[t / kPack<T>].v[t % kPack<T>])
                      : NAN;
  }
  // NOTE: no barrier before the writes: a thread reads back only the
  // vectors it stored itself, and the target's logit comes from shared
  // memory, which no thread writes again.
  for (int64_t i = threadIdx.x; i < packs; i += kOnChipThreads) {
    packed[i] = grad_pack_approx(kept[i], i, lse, t, ignored);
  }
}

// Bytes of shared memory a row may take for two on-chip blocks to fit on an
// SM of the current device (0: none fits, or the device cannot be asked).
// NOTE: asked once a device and kept: the launch is on the step's hot path
// (and inside CUDA graph captures, where a device query is still allowed).
int64_t on_chip_row_limit() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> limits[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) {
    return 0;
  }
  int64_t limit = limits[device].load(std::memory_order_relaxed);
  if (limit != 0) {
    return limit - 1; // stored plus one: 0 means "not asked yet"
  }
  int per_sm = 0, per_block = 0, reserved = 0, threads = 0;
  if (cudaDeviceGetAttribute(
          &threads, cudaDevAttrMaxThreadsPerMultiProcessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(
          &per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(
          &per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(
          &reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) !=
          cudaSuccess) {
    return 0;
  }
  // block_combine's 256 bytes of static shared memory, and a margin.
  constexpr int64_t kStatic = 1024;
  limit = threads < 2 * kOnChipThreads
      ? 0
      : std::max<int64_t>(
            0,
            std::min<int64_t>(
                per_block - kStatic, per_sm / 2 - reserved - kStatic));
  limits[device].store(limit + 1, std::memory_order_relaxed);
  return limit;
}

template <typename T>
cudaError_t launch(const SoftmaxXentArgs& a, cudaStream_t stream) {
  const bool vectors = reinterpret_cast<uintptr_t>(a.logits) % 16 == 0 &&
      a.stride % kPack<T> == 0 && a.classes % kPack<T> == 0;
  const int64_t bytes = a.classes * static_cast<int64_t>(sizeof(T));
  if (vectors && bytes <= on_chip_row_limit()) {
    auto* kernel = softmax_xent_grad_on_chip<T>;
    // NOTE: idempotent, and cheap next to the launch; above 48 KB a kernel
    // must be allowed its dynamic shared memory.
    cudaError_t err = cudaFuncSetAttribute(
        kernel,
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(bytes));
    if (err != cudaSuccess) {
      return err;
    }
    kernel<<<
        static_cast<unsigned>(a.rows),
        kOnChipThreads,
        static_cast<size_t>(bytes),
        stream>>>(
        static_cast<T*>(a.logits),
        a.classes / kPack<T>,
        a.stride,
        a.target,
        a.ignore_index,
        a.loss);
    return cudaGetLastError();
  }
  softmax_xent_grad_kernel<T>
      <<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(
          static_cast<T*>(a.logits),
          a.classes,
          a.stride,
          a.target,
          a.ignore_index,
          a.loss);
  return cudaGetLastError();
}

} // namespace

cudaError_t launch_softmax_xent_grad(
    const SoftmaxXentArgs& a,
    cudaStream_t stream) {
  if (a.rows == 0) {
    return cudaSuccess;
  }
  switch (a.dtype) {
    case LogitsDtype::kFloat:
      return launch<float>(a, stream);
    case LogitsDtype::kHalf:
      return launch<__half>(a, stream);
    default:
      return launch<__nv_bfloat16>(a, stream);
  }
}

} // namespace lamp::nn::detail
