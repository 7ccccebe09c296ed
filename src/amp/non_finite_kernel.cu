#include "non_finite_kernel.h"

namespace lamp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8; // 16-byte loads in flight per thread
constexpr int64_t kChunk = int64_t{16} * kThreads * kUnroll; // bytes a block

// A 32-bit word holds one fp32 or two fp16 elements; an element is inf or
// NaN exactly when its exponent bits are all ones, so the check needs no
// conversion: `low` is the exponent mask of the word's first element, `high`
// that of its second (0 for fp32).
struct Exponent {
  uint32_t low;
  uint32_t high;
  __device__ bool word(uint32_t w) const {
    return (w & low) == low || (high != 0 && (w & high) == high);
  }
  __device__ bool vector(const uint4& v) const {
    return word(v.x) || word(v.y) || word(v.z) || word(v.w);
  }
  __device__ bool element(uintptr_t address, int element_bytes) const {
    if (element_bytes == 4) {
      return word(*reinterpret_cast<const uint32_t*>(address));
    }
    const uint32_t v = *reinterpret_cast<const uint16_t*>(address);
    return (v & low) == low;
  }
};

// NOTE: one block a chunk of 32 KB of one tensor, on the 16-byte grid of
// the tensor's first element, so every thread issues its 8 loads before it
// looks at any (one tensor after another per thread would wait for a load
// per tensor: latency-bound, 0.6 TB/s). The elements before the first
// 16-byte boundary and after the last one (only where a tensor is not
// aligned or not a multiple of 16 bytes) are read one at a time. The first
// thread of a block that saw a non-finite value writes 1; blocks that race
// all write 1, as ATen's unscale kernel does.
__global__ void __launch_bounds__(kThreads) non_finite_check_kernel(
    NonFiniteList list,
    Exponent exponent,
    int element_bytes,
    float* found_inf) {
  const int block = static_cast<int>(blockIdx.x);
  static_assert(NonFiniteList::kMax <= 256, "the search below takes 8 steps");
  int t = 0; // the last tensor whose first block is <= block
  for (int step = 128; step > 0; step /= 2) {
    if (t + step < list.count && list.first_block[t + step] <= block) {
      t += step;
    }
  }
  const auto begin = reinterpret_cast<uintptr_t>(list.data[t]);
  const uintptr_t end = begin + list.bytes[t];
  const uintptr_t grid = (begin & ~uintptr_t{15}) +
      static_cast<uintptr_t>(block - list.first_block[t]) * kChunk;
  const uintptr_t lo = grid > begin ? grid : begin;
  const uintptr_t hi = grid + kChunk < end ? grid + kChunk : end;
  uintptr_t vector_lo = (lo + 15) & ~uintptr_t{15};
  uintptr_t vector_hi = hi & ~uintptr_t{15};
  if (vector_lo >= vector_hi) { // less than one aligned vector: elements
    vector_lo = hi;
    vector_hi = hi;
  }
  bool bad = false;
  const auto thread = static_cast<uintptr_t>(threadIdx.x);
  if (lo + thread * element_bytes < vector_lo) {
    bad |= exponent.element(lo + thread * element_bytes, element_bytes);
  }
  if (vector_hi + thread * element_bytes < hi) {
    bad |= exponent.element(vector_hi + thread * element_bytes, element_bytes);
  }
  const auto* v = reinterpret_cast<const uint4*>(vector_lo);
  const auto vectors = static_cast<int>((vector_hi - vector_lo) / 16);
  uint4 w[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = static_cast<int>(thread) + u * kThreads;
    w[u] = i < vectors ? __ldcs(v + i) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    bad |= exponent.vector(w[u]);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    *found_inf = 1.f;
  }
}

} // namespace

cudaError_t launch_non_finite_check(
    FloatFormat format,
    NonFiniteList& list,
    float* found_inf,
    cudaStream_t stream) {
  if (list.count == 0) {
    return cudaSuccess;
  }
  int64_t blocks = 0;
  for (int t = 0; t < list.count; ++t) {
    const auto begin = reinterpret_cast<uintptr_t>(list.data[t]);
    const auto span =
        static_cast<int64_t>(begin + list.bytes[t] - (begin & ~uintptr_t{15}));
    list.first_block[t] = static_cast<int32_t>(blocks);
    blocks += (span + kChunk - 1) / kChunk;
  }
  if (blocks > INT32_MAX) {
    return cudaErrorInvalidValue; // > 64 TB: the caller splits the list
  }
  const Exponent exponent = format == FloatFormat::kHalf
      ? Exponent{0x7c00u, 0x7c000000u}
      : Exponent{0x7f800000u, 0};
  const int element_bytes = format == FloatFormat::kHalf ? 2 : 4;
  non_finite_check_kernel<<<
      static_cast<unsigned>(blocks),
      kThreads,
      0,
      stream>>>(list, exponent, element_bytes, found_inf);
  return cudaGetLastError();
}

} // namespace lamp::detail
