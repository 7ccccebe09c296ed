#include "clip_grad_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

namespace lamp::detail {
namespace {

constexpr int kThreads = 512;
// NOTE: at most this many blocks share the tensors (a block loops over a
// chunk of 16-byte vectors), so that the second kernel can afford to sum
// every first-kernel block's partial in every block: 8 KB of L2 reads a
// block, and no counter or memset to find "the last block" (a graphed step
// pays ~2 us a node).
constexpr int64_t kTargetBlocks = 2048;
constexpr int64_t kMinChunk = int64_t{16} * kThreads * 4; // bytes

// Where one thread block works: [lo, hi) of tensor t and its
// 16-byte-aligned middle [vector_lo, vector_hi).
struct Span {
  int t;
  uintptr_t lo, hi, vector_lo, vector_hi;
};

__device__ Span span_of(const ClipList& list, int64_t chunk) {
  const int block = static_cast<int>(blockIdx.x);
  static_assert(ClipList::kMax <= 256, "the search below takes 8 steps");
  int t = 0; // the last tensor whose first block is <= block
  for (int step = 128; step > 0; step /= 2) {
    if (t + step < list.count && list.first_block[t + step] <= block) {
      t += step;
    }
  }
  Span s;
  s.t = t;
  const auto begin = reinterpret_cast<uintptr_t>(list.data[t]);
  const uintptr_t end = begin + list.bytes[t];
  const uintptr_t grid = (begin & ~uintptr_t{15}) +
      static_cast<uintptr_t>(block - list.first_block[t]) * chunk;
  s.lo = grid > begin ? grid : begin;
  s.hi = grid + chunk < end ? grid + chunk : end;
  s.vector_lo = (s.lo + 15) & ~uintptr_t{15};
  s.vector_hi = s.hi & ~uintptr_t{15};
  if (s.vector_lo >= s.vector_hi) { // less than one aligned vector
    s.vector_lo = s.hi;
    s.vector_hi = s.hi;
  }
  return s;
}

__device__ float load(uintptr_t address, ClipFormat f) {
  switch (f) {
    case ClipFormat::kFloat:
      return *reinterpret_cast<const float*>(address);
    case ClipFormat::kHalf:
      return __half2float(*reinterpret_cast<const __half*>(address));
    default:
      return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(address));
  }
}

__device__ void store(uintptr_t address, ClipFormat f, float v) {
  switch (f) {
    case ClipFormat::kFloat:
      *reinterpret_cast<float*>(address) = v;
      break;
    case ClipFormat::kHalf:
      *reinterpret_cast<__half*>(address) = __float2half_rn(v);
      break;
    default:
      *reinterpret_cast<__nv_bfloat16*>(address) = __float2bfloat16_rn(v);
  }
}

// The elements of one 16-byte vector as floats: 4 (fp32) or 8.
template <ClipFormat F>
struct Vector {
  static constexpr int kN = F == ClipFormat::kFloat ? 4 : 8;
  float v[kN];
};

template <ClipFormat F>
__device__ Vector<F> unpack(const uint4& w) {
  Vector<F> out;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (F == ClipFormat::kFloat) {
      out.v[i] = __uint_as_float(words[i]);
    } else {
      const auto lo = static_cast<unsigned short>(words[i] & 0xffffu);
      const auto hi = static_cast<unsigned short>(words[i] >> 16);
      if constexpr (F == ClipFormat::kHalf) {
        out.v[2 * i] = __half2float(__ushort_as_half(lo));
        out.v[2 * i + 1] = __half2float(__ushort_as_half(hi));
      } else {
        out.v[2 * i] = __bfloat162float(__ushort_as_bfloat16(lo));
        out.v[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
      }
    }
  }
  return out;
}

template <ClipFormat F>
__device__ uint4 pack(const Vector<F>& x) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (F == ClipFormat::kFloat) {
      words[i] = __float_as_uint(x.v[i]);
    } else if constexpr (F == ClipFormat::kHalf) {
      words[i] = __half_as_ushort(__float2half_rn(x.v[2 * i])) |
          (uint32_t{__half_as_ushort(__float2half_rn(x.v[2 * i + 1]))} << 16);
    } else {
      words[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x.v[2 * i])) |
          (uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(x.v[2 * i + 1]))}
           << 16);
    }
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Visits this thread's share of the block's span in a fixed order: the
// elements of the unaligned head, those of the unaligned tail, then the
// 16-byte vectors of the middle; `element(address)` for each element alone,
// `vector(pointer)` for each vector. Every kernel walks a span this way, so
// the sums of squares of sum_squares() and unscale_sum_squares() are added
// in the same order (bitwise the same partials).
template <ClipFormat F, class Element, class Vec>
__device__ void visit(const Span& s, Element element, Vec vector) {
  constexpr uintptr_t kBytes = F == ClipFormat::kFloat ? 4 : 2;
  const auto thread = static_cast<uintptr_t>(threadIdx.x);
  for (uintptr_t a = s.lo + thread * kBytes; a < s.vector_lo;
       a += kThreads * kBytes) {
    element(a);
  }
  for (uintptr_t a = s.vector_hi + thread * kBytes; a < s.hi;
       a += kThreads * kBytes) {
    element(a);
  }
  for (uintptr_t a = s.vector_lo + thread * 16; a < s.vector_hi;
       a += kThreads * 16) {
    vector(reinterpret_cast<uint4*>(a));
  }
}

// This thread's sum of squares over the block's span.
template <ClipFormat F>
__device__ float sum_squares(const Span& s) {
  float sum = 0.f;
  visit<F>(
      s,
      [&](uintptr_t a) {
        const float x = load(a, F);
        sum += x * x;
      },
      [&](const uint4* p) {
        const auto x = unpack<F>(__ldcg(p));
#pragma unroll
        for (int i = 0; i < Vector<F>::kN; ++i) {
          sum += x.v[i] * x.v[i];
        }
      });
  return sum;
}

// GradScaler's unscale of one element, as ATen's
// _amp_foreach_non_finite_check_and_unscale_ does it (the check on the
// input; a multiplication unless inv_scale is exactly 1), rounded to the
// tensor's format: the value that sum_squares() would read afterwards.
template <ClipFormat F>
__device__ float unscale_one(float x, float inv_scale, bool& bad) {
  bad |= !isfinite(x);
  const float y = inv_scale == 1.f ? x : x * inv_scale;
  if constexpr (F == ClipFormat::kHalf) {
    return __half2float(__float2half_rn(y));
  } else {
    return y;
  }
}

// unscale_one() over the block's span, in place, and this thread's sum of
// squares of the results in sum_squares()'s order (so the block's partial is
// bitwise the one sum_squares_kernel would write next).
template <ClipFormat F>
__device__ float unscale_sum_squares(const Span& s, float inv, bool& bad) {
  float sum = 0.f;
  visit<F>(
      s,
      [&](uintptr_t a) {
        const float x = unscale_one<F>(load(a, F), inv, bad);
        store(a, F, x);
        sum += x * x;
      },
      [&](uint4* p) {
        auto x = unpack<F>(__ldcg(p));
#pragma unroll
        for (int i = 0; i < Vector<F>::kN; ++i) {
          x.v[i] = unscale_one<F>(x.v[i], inv, bad);
        }
        *p = pack<F>(x);
#pragma unroll
        for (int i = 0; i < Vector<F>::kN; ++i) {
          sum += x.v[i] * x.v[i];
        }
      });
  return sum;
}

// Multiplies the block's span by `coef`.
template <ClipFormat F>
__device__ void scale(const Span& s, float coef) {
  visit<F>(
      s,
      [&](uintptr_t a) { store(a, F, load(a, F) * coef); },
      [&](uint4* p) {
        auto x = unpack<F>(__ldcg(p));
#pragma unroll
        for (int i = 0; i < Vector<F>::kN; ++i) {
          x.v[i] *= coef;
        }
        *p = pack<F>(x);
      });
}

// The block's sum of `value` over its threads, in a fixed order.
__device__ float block_sum(float value) {
  __shared__ float warps[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warps[warp] = value;
  }
  __syncthreads();
  value = lane < kThreads / 32 ? warps[lane] : 0.f;
  if (warp == 0) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_down_sync(0xffffffffu, value, offset);
    }
  }
  __syncthreads(); // `warps` may be used again
  return value; // thread 0's is the sum
}

// The total norm of all `blocks` partials (every block adds them, in the
// same order) and Python's coefficient for it, (total_norm +
// 1e-6).reciprocal() * max_norm clamped to 1 (a NaN stays NaN, as
// at::clamp keeps it): thread 0's are the results.
__device__ float norm_and_coef(
    const float* partials,
    int blocks,
    float max_norm,
    float& norm) {
  float sum = 0.f;
  for (int i = threadIdx.x; i < blocks; i += kThreads) {
    sum += __ldcg(partials + i);
  }
  sum = block_sum(sum);
  norm = sqrtf(sum);
  const float coef = (1.f / (norm + 1e-6f)) * max_norm;
  return coef > 1.f ? 1.f : coef;
}

// First kernel: each block's sum of squares, in partials[block].
__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(ClipList list, int64_t chunk, float* partials) {
  const Span s = span_of(list, chunk);
  // NOTE: a block's span is in one tensor, so the branch is uniform.
  float sum;
  switch (list.format[s.t]) {
    case ClipFormat::kFloat:
      sum = sum_squares<ClipFormat::kFloat>(s);
      break;
    case ClipFormat::kHalf:
      sum = sum_squares<ClipFormat::kHalf>(s);
      break;
    default:
      sum = sum_squares<ClipFormat::kBFloat16>(s);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sum;
  }
}

// The first kernel fused with GradScaler's unscale: the tensors unscaled
// in place, found_inf set as ATen sets it, partials as sum_squares_kernel
// would write them for the unscaled tensors.
__global__ void __launch_bounds__(kThreads) unscale_sum_squares_kernel(
    ClipList list,
    int64_t chunk,
    const float* inv_scale,
    float* found_inf,
    float* partials) {
  const Span s = span_of(list, chunk);
  const float inv = __ldg(inv_scale);
  bool bad = false;
  float sum;
  switch (list.format[s.t]) {
    case ClipFormat::kFloat:
      sum = unscale_sum_squares<ClipFormat::kFloat>(s, inv, bad);
      break;
    case ClipFormat::kHalf:
      sum = unscale_sum_squares<ClipFormat::kHalf>(s, inv, bad);
      break;
    default:
      // NOTE: launch_unscale_sum_squares takes no bf16 (ATen's unscale
      // refuses it, and so does Python's GradScaler).
      sum = 0.f;
  }
  if (bad) {
    *found_inf = 1.f; // any thread; all write the same value
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sum;
  }
}

// Second kernel: every block sums all partials (every list's: the same sum
// in every block), block 0 writes the norm (unless `norm_out` is null: the
// first list's launch writes it), and each block scales its span.
__global__ void __launch_bounds__(kThreads) scale_kernel(
    ClipList list,
    int64_t chunk,
    const float* partials,
    int blocks,
    float max_norm,
    void* norm_out,
    ClipFormat norm_format) {
  __shared__ float coef_shared;
  float norm;
  const float total_coef = norm_and_coef(partials, blocks, max_norm, norm);
  if (threadIdx.x == 0) {
    coef_shared = total_coef;
    if (blockIdx.x == 0 && norm_out != nullptr) {
      store(reinterpret_cast<uintptr_t>(norm_out), norm_format, norm);
    }
  }
  __syncthreads();
  const float coef = coef_shared;
  const Span s = span_of(list, chunk);
  switch (list.format[s.t]) {
    case ClipFormat::kFloat:
      scale<ClipFormat::kFloat>(s, coef);
      break;
    case ClipFormat::kHalf:
      scale<ClipFormat::kHalf>(s, coef);
      break;
    default:
      scale<ClipFormat::kBFloat16>(s, coef);
  }
}

// launch_clip_norm_divisor's second kernel, one block: scale_kernel's
// norm and coefficient (the same sum in the same order), the coefficient
// written as the divisor a fused optimizer's step takes.
__global__ void __launch_bounds__(kThreads) norm_divisor_kernel(
    const float* partials,
    int blocks,
    float max_norm,
    void* norm_out,
    ClipFormat norm_format,
    float* divisor) {
  float norm;
  const float coef = norm_and_coef(partials, blocks, max_norm, norm);
  if (threadIdx.x == 0) {
    // 1 when not clipping (the step divides by 1: the gradient unchanged);
    // a NaN norm gives NaN, an inf norm inf (inf gradients / inf = NaN,
    // finite ones 0: the clip's inf * 0 and x * 0).
    *divisor = 1.f / coef;
    store(reinterpret_cast<uintptr_t>(norm_out), norm_format, norm);
  }
}

int64_t span_bytes(const ClipList& list, int t) {
  const auto begin = reinterpret_cast<uintptr_t>(list.data[t]);
  return static_cast<int64_t>(begin + list.bytes[t] - (begin & ~uintptr_t{15}));
}

// One chunk size (bytes a block) for all the lists, so that a tensor's
// blocks and their partials do not depend on which list it is in.
int64_t chunk_of(const ClipList* lists, int count) {
  int64_t total = 0;
  for (int l = 0; l < count; ++l) {
    for (int t = 0; t < lists[l].count; ++t) {
      total += span_bytes(lists[l], t);
    }
  }
  int64_t chunk = (total + kTargetBlocks - 1) / kTargetBlocks;
  chunk = (chunk + kMinChunk - 1) / kMinChunk * kMinChunk;
  return chunk < kMinChunk ? kMinChunk : chunk;
}

// Sets each list's first_block; returns the chunk, each list's first
// partial in `offsets` (count + 1 entries: the last is the total).
int64_t lay_out(ClipList* lists, int count, int64_t* offsets) {
  const int64_t chunk = chunk_of(lists, count);
  int64_t all = 0;
  for (int l = 0; l < count; ++l) {
    offsets[l] = all;
    int64_t blocks = 0;
    for (int t = 0; t < lists[l].count; ++t) {
      lists[l].first_block[t] = static_cast<int32_t>(blocks);
      blocks += (span_bytes(lists[l], t) + chunk - 1) / chunk;
    }
    all += blocks;
  }
  offsets[count] = all;
  return chunk;
}

// Whether the lists can be launched: at least one, none empty.
bool valid(const ClipList* lists, int count) {
  if (count <= 0) {
    return false;
  }
  for (int l = 0; l < count; ++l) {
    if (lists[l].count <= 0) {
      return false;
    }
  }
  return true;
}

// Runs `launch(list, grid, offset)` for each list, then checks the launches.
template <typename Launch>
cudaError_t each_list(ClipList* lists, int count, const Launch& launch) {
  std::vector<int64_t> offsets(count + 1);
  const int64_t chunk = lay_out(lists, count, offsets.data());
  for (int l = 0; l < count; ++l) {
    launch(
        lists[l],
        static_cast<unsigned>(offsets[l + 1] - offsets[l]),
        chunk,
        offsets[l],
        offsets[count]);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
      return error;
    }
  }
  return cudaSuccess;
}

// The first kernel over every list: each block's sum of squares in
// partials (the lists' blocks one after another).
cudaError_t launch_sum_squares(
    ClipList* lists,
    int count,
    float* partials,
    cudaStream_t stream) {
  return each_list(
      lists,
      count,
      [&](ClipList& list,
          unsigned grid,
          int64_t chunk,
          int64_t offset,
          int64_t) {
        sum_squares_kernel<<<grid, kThreads, 0, stream>>>(
            list, chunk, partials + offset);
      });
}

} // namespace

int64_t clip_grad_norm_blocks(const ClipList* lists, int count) {
  const int64_t chunk = chunk_of(lists, count);
  int64_t blocks = 0;
  for (int l = 0; l < count; ++l) {
    for (int t = 0; t < lists[l].count; ++t) {
      blocks += (span_bytes(lists[l], t) + chunk - 1) / chunk;
    }
  }
  return blocks;
}

cudaError_t launch_clip_grad_norm(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    float* partials,
    cudaStream_t stream) {
  if (!valid(lists, count)) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t error = launch_sum_squares(lists, count, partials, stream);
  if (error != cudaSuccess) {
    return error;
  }
  return launch_clip_scale(
      lists, count, max_norm, norm, norm_format, partials, stream);
}

cudaError_t launch_unscale_sum_squares(
    ClipList* lists,
    int count,
    const float* inv_scale,
    float* found_inf,
    float* partials,
    cudaStream_t stream) {
  if (!valid(lists, count)) {
    return cudaErrorInvalidValue;
  }
  for (int l = 0; l < count; ++l) {
    for (int t = 0; t < lists[l].count; ++t) {
      if (lists[l].format[t] == ClipFormat::kBFloat16) {
        return cudaErrorInvalidValue;
      }
    }
  }
  return each_list(
      lists,
      count,
      [&](ClipList& list,
          unsigned grid,
          int64_t chunk,
          int64_t offset,
          int64_t) {
        unscale_sum_squares_kernel<<<grid, kThreads, 0, stream>>>(
            list, chunk, inv_scale, found_inf, partials + offset);
      });
}

cudaError_t launch_clip_scale(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    const float* partials,
    cudaStream_t stream) {
  if (!valid(lists, count)) {
    return cudaErrorInvalidValue;
  }
  // NOTE: max_norm is rounded to fp32 as Python's `tensor * float` rounds
  // it for an fp32 tensor.
  bool first = true;
  return each_list(
      lists,
      count,
      [&](ClipList& list,
          unsigned grid,
          int64_t chunk,
          int64_t,
          int64_t blocks) {
        scale_kernel<<<grid, kThreads, 0, stream>>>(
            list,
            chunk,
            partials,
            static_cast<int>(blocks),
            static_cast<float>(max_norm),
            first ? norm : nullptr,
            norm_format);
        first = false;
      });
}

cudaError_t launch_clip_norm_divisor(
    ClipList* lists,
    int count,
    double max_norm,
    void* norm,
    ClipFormat norm_format,
    float* divisor,
    float* partials,
    const float* kept_partials,
    cudaStream_t stream) {
  if (!valid(lists, count)) {
    return cudaErrorInvalidValue;
  }
  const float* sums = kept_partials;
  if (sums == nullptr) {
    const cudaError_t error =
        launch_sum_squares(lists, count, partials, stream);
    if (error != cudaSuccess) {
      return error;
    }
    sums = partials;
  }
  norm_divisor_kernel<<<1, kThreads, 0, stream>>>(
      sums,
      static_cast<int>(clip_grad_norm_blocks(lists, count)),
      static_cast<float>(max_norm),
      norm,
      norm_format,
      divisor);
  return cudaGetLastError();
}

} // namespace lamp::detail
