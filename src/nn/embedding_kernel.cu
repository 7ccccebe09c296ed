#include "embedding_kernel.h"

#include <algorithm>
#include <cstdint>

#include "cuda_dtype.cuh"

namespace lamp::nn::detail {
namespace {

// NOTE: ATen's CUDA embedding backward (EmbeddingBackwardKernel.cu) sums
// each run of equal sorted indices in partial sums of 10 rows, each from
// 0 in order, then adds the partials in order from 0, in float, and rounds
// once to the gradient's dtype. The same order here gives its values bit
// for bit; one block sums a whole run, so no scratch and no second kernel.
constexpr int kRowsPerPartial = 10;
constexpr int kThreads = 256;
// NOTE: rows loaded before any is added (whole partials, so the batches
// keep ATen's partials). Text repeats a few tokens hundreds of times in a
// batch (",", "the"): one block sums each such run, and loading 20 rows at
// a time keeps that many loads in flight where the loop a row at a time
// kept the few the compiler unrolled. Two partials, not more: 48 registers
// a thread keep the 5 blocks an SM of the one-row loop (40 rows took 80).
// With 16-byte packs (V > 1) one partial: 10 rows of 16 bytes are already
// twice the bytes in flight, and 20 took 139 (fp32) to 233 registers.
template <int V>
constexpr int kBatch = V > 1 ? kRowsPerPartial : 2 * kRowsPerPartial;

// The end of the run of `key` that starts at `i`: the first index after
// it whose sorted value differs. NOTE: galloping (i + 1, i + 2, i + 4, ...,
// then a binary search of the last gap): most runs are a row or two long,
// and a binary search over the whole rest made every block wait on ~14
// dependent loads (GPT-2's random-token backward ran at ~0.7 TB/s).
__device__ int64_t
run_end(const int64_t* sorted, int64_t n, int64_t i, int64_t key) {
  int64_t known = i; // sorted[known] == key
  int64_t hi = n; // past the run
  for (int64_t step = 1; known + step < n; step *= 2) {
    if (sorted[known + step] != key) {
      hi = known + step;
      break;
    }
    known += step;
  }
  int64_t lo = known + 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] == key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// V elements of T (16 bytes when V > 1).
template <typename T, int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

// A thread sums V adjacent columns (one 16-byte load a row where the rows
// allow it, else V = 1); each column's sum is in ATen's order.
template <typename T, int V, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(EmbeddingBackwardArgs a) {
  using P = Pack<T, V>;
  const auto* g = static_cast<const P*>(a.grad_out);
  auto* w = static_cast<P*>(a.grad_weight);
  const int64_t packs = a.dim / V;
  for (int64_t i = blockIdx.x; i < a.n; i += gridDim.x) {
    const int64_t key = a.sorted[i];
    // Only the first of a run sums it.
    if ((i > 0 && a.sorted[i - 1] == key) || key == a.padding_idx) {
      continue;
    }
    const int64_t end = run_end(a.sorted, a.n, i, key);
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      float sum[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        sum[e] = 0.f;
      }
      constexpr int kRows = kBatch<V>;
      for (int64_t p = i; p < end; p += kRows) {
        const int m = static_cast<int>(end - p < kRows ? end - p : kRows);
        P v[kRows];
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          if (k < m) {
            v[k] = g[a.order[p + k] * packs + c];
          }
        }
#pragma unroll
        for (int j = 0; j < kRows; j += kRowsPerPartial) {
          if (j < m) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
              float partial = 0.f;
#pragma unroll
              for (int k = j; k < j + kRowsPerPartial; ++k) {
                if (k < m) {
                  partial += to_float(v[k].v[e]);
                }
              }
              sum[e] += partial;
            }
          }
        }
      }
      P* out = w + key * packs + c;
      P r = kAdd ? *out : P{};
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (kAdd) {
          // NOTE: as autograd's sum of two gradients: the embedding's
          // rounded to the dtype first, then added.
          r.v[e] =
              from_float<T>(to_float(r.v[e]) + to_float(from_float<T>(sum[e])));
        } else {
          r.v[e] = from_float<T>(sum[e]);
        }
      }
      *out = r;
    }
  }
}

template <typename T, int V>
void launch_packed(const EmbeddingBackwardArgs& a, cudaStream_t stream) {
  // NOTE: a block per index (most return at once: only a run's first
  // sums), threads over the column packs, a warp's worth at least.
  const int64_t packs = a.dim / V;
  const int threads =
      static_cast<int>(std::min<int64_t>(kThreads, (packs + 31) / 32 * 32));
  const int blocks = static_cast<int>(std::min<int64_t>(a.n, 1 << 20));
  if (a.add) {
    embedding_backward_kernel<T, V, true><<<blocks, threads, 0, stream>>>(a);
  } else {
    embedding_backward_kernel<T, V, false><<<blocks, threads, 0, stream>>>(a);
  }
}

template <typename T>
void launch_typed(const EmbeddingBackwardArgs& a, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<uintptr_t>(a.grad_out) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(a.grad_weight) % 16 == 0 &&
      a.dim % kVector == 0;
  if (aligned) {
    launch_packed<T, kVector>(a, stream);
  } else {
    launch_packed<T, 1>(a, stream);
  }
}

} // namespace

cudaError_t launch_embedding_backward(
    const EmbeddingBackwardArgs& a,
    cudaStream_t stream) {
  if (a.n == 0 || a.dim == 0) {
    return cudaSuccess;
  }
  switch (a.dtype) {
    case EmbeddingDtype::kFloat:
      launch_typed<float>(a, stream);
      break;
    case EmbeddingDtype::kHalf:
      launch_typed<__half>(a, stream);
      break;
    case EmbeddingDtype::kBFloat16:
      launch_typed<__nv_bfloat16>(a, stream);
      break;
  }
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
