#include "embedding_kernel.h"

#include <algorithm>

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
constexpr int kBatch = 2 * kRowsPerPartial;

// The end of the run of `key` that starts at `i`: the first index after
// it whose sorted value differs (a binary search: runs may be long).
__device__ int64_t
run_end(const int64_t* sorted, int64_t n, int64_t i, int64_t key) {
  int64_t lo = i + 1, hi = n;
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

template <typename T, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(EmbeddingBackwardArgs a) {
  const auto* g = static_cast<const T*>(a.grad_out);
  auto* w = static_cast<T*>(a.grad_weight);
  for (int64_t i = blockIdx.x; i < a.n; i += gridDim.x) {
    const int64_t key = a.sorted[i];
    // Only the first of a run sums it.
    if ((i > 0 && a.sorted[i - 1] == key) || key == a.padding_idx) {
      continue;
    }
    const int64_t end = run_end(a.sorted, a.n, i, key);
    for (int64_t c = threadIdx.x; c < a.dim; c += blockDim.x) {
      float sum = 0.f;
      for (int64_t p = i; p < end; p += kBatch) {
        const int m = static_cast<int>(end - p < kBatch ? end - p : kBatch);
        float v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          if (k < m) {
            v[k] = to_float(g[a.order[p + k] * a.dim + c]);
          }
        }
#pragma unroll
        for (int j = 0; j < kBatch; j += kRowsPerPartial) {
          if (j < m) {
            float partial = 0.f;
#pragma unroll
            for (int k = j; k < j + kRowsPerPartial; ++k) {
              if (k < m) {
                partial += v[k];
              }
            }
            sum += partial;
          }
        }
      }
      T* out = w + key * a.dim + c;
      if (kAdd) {
        // NOTE: as autograd's sum of two gradients: the embedding's
        // rounded to the dtype first, then added.
        *out = from_float<T>(to_float(*out) + to_float(from_float<T>(sum)));
      } else {
        *out = from_float<T>(sum);
      }
    }
  }
}

template <typename T>
void launch_typed(
    const EmbeddingBackwardArgs& a,
    int blocks,
    int threads,
    cudaStream_t stream) {
  if (a.add) {
    embedding_backward_kernel<T, true><<<blocks, threads, 0, stream>>>(a);
  } else {
    embedding_backward_kernel<T, false><<<blocks, threads, 0, stream>>>(a);
  }
}

} // namespace

cudaError_t launch_embedding_backward(
    const EmbeddingBackwardArgs& a,
    cudaStream_t stream) {
  if (a.n == 0 || a.dim == 0) {
    return cudaSuccess;
  }
  // NOTE: a block per index (most return at once: only a run's first
  // sums), threads over the columns, a warp's worth at least.
  const int threads =
      static_cast<int>(std::min<int64_t>(kThreads, (a.dim + 31) / 32 * 32));
  const int blocks = static_cast<int>(std::min<int64_t>(a.n, 1 << 20));
  switch (a.dtype) {
    case EmbeddingDtype::kFloat:
      launch_typed<float>(a, blocks, threads, stream);
      break;
    case EmbeddingDtype::kHalf:
      launch_typed<__half>(a, blocks, threads, stream);
      break;
    case EmbeddingDtype::kBFloat16:
      launch_typed<__nv_bfloat16>(a, blocks, threads, stream);
      break;
  }
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
