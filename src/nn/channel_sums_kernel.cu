#include "channel_sums_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "cuda_dtype.cuh"
#include "nhwc_reduce.cuh"

namespace lamp::nn::detail {
namespace {

// How many rows a thread loads at once, and the first kernel's block budget
// (reduce_layout), by the number of sums. The column sums alone (a linear
// layer's bias gradient) read fastest 2 rows at a time from 768 blocks: on
// an H100 (a standalone sweep of unroll 2/4/8 and 512-2,112 blocks over
// GPT-2's and gpt2-xl's shapes, 2026-12-07) 16,384 x 2,304 bf16 took 40.9
// us against 45.1 with 4 rows from 512 blocks, 16,384 x 3,072 48.5 against
// 53.3, 8,192 x 4,800 41.7 against 50.2, 8,192 x 6,400 50.6 against 55.2
// (partials and fold; a plain read of the same bytes 36-46 us). With the
// squares too (conv2d_stats) as before: 4 rows, 512 blocks.
template <int kSums>
constexpr int kSumsUnroll = kSums == 1 ? 2 : 4;
template <int kSums>
constexpr int64_t kSumsBlockBudget = kSums == 1 ? 768 : kReduceBlocks;

template <int kSums>
ReduceLayout sums_layout(int64_t rows, int64_t channels) {
  return reduce_layout(rows, channels, kSumsBlockBudget<kSums>);
}

// Per block and channel: the sum of the block's rows and, with kSums = 2,
// of their squares. A thread's rows kUnroll at a time: their loads issued
// together, then added in row order (one load in flight a thread left the
// memory idle between them: GPT-2's bias gradients at ~60 % of its speed).
template <typename T, int kSums>
__global__ void __launch_bounds__(kReduceThreads)
    partial_sums_kernel(ChannelSumsArgs a, ReduceLayout l) {
  constexpr int kUnroll = kSumsUnroll<kSums>;
  const int64_t vectors = a.channels / kReduceVector;
  const int lane = threadIdx.x % l.lanes;
  const int row0 = threadIdx.x / l.lanes;
  const int64_t vec = static_cast<int64_t>(blockIdx.y) * l.lanes + lane;
  const bool active = row0 < l.rows_per_pass && vec < vectors;
  float sums[kSums][kReduceVector] = {};
  auto add = [&](const uint4& raw) {
    T v[kReduceVector];
    static_assert(sizeof(v) == sizeof(raw), "16 bytes");
    memcpy(v, &raw, sizeof(raw));
#pragma unroll
    for (int k = 0; k < kReduceVector; ++k) {
      const float f = to_float(v[k]);
      sums[0][k] += f;
      if constexpr (kSums == 2) {
        sums[kSums - 1][k] += f * f;
      }
    }
  };
  if (active) {
    const auto* x = reinterpret_cast<const uint4*>(a.x) + vec;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * l.rows_per_pass;
    int64_t r = static_cast<int64_t>(blockIdx.x) * l.rows_per_pass + row0;
    for (; r + (kUnroll - 1) * stride < a.rows; r += kUnroll * stride) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        raw[u] = x[(r + u * stride) * vectors];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        add(raw[u]);
      }
    }
    for (; r < a.rows; r += stride) {
      add(x[r * vectors]);
    }
  }
  block_partials<kSums>(sums, l, a.channels, a.partials);
}

// Per channel: the blocks' partials, added in block order.
template <typename T, int kSums>
__global__ void __launch_bounds__(kFoldChannels* kFoldSlices)
    fold_kernel(ChannelSumsArgs a, int64_t blocks) {
  float total[kSums];
  const int64_t c = fold_partials<kSums>(a.partials, a.channels, blocks, total);
  if (c < 0) {
    return;
  }
  if (a.sum != nullptr) {
    a.sum[c] = total[0];
  }
  if (a.sum_rounded != nullptr) {
    static_cast<T*>(a.sum_rounded)[c] = from_float<T>(total[0]);
  }
  if constexpr (kSums == 2) {
    a.sum_of_squares[c] = total[kSums - 1];
  }
}

template <typename T, int kSums>
cudaError_t launch_typed(const ChannelSumsArgs& a, cudaStream_t stream) {
  const ReduceLayout l = sums_layout<kSums>(a.rows, a.channels);
  partial_sums_kernel<T, kSums>
      <<<dim3(static_cast<unsigned>(l.blocks), static_cast<unsigned>(l.chunks)),
         kReduceThreads,
         0,
         stream>>>(a, l);
  fold_kernel<T, kSums>
      <<<fold_grid(a.channels), fold_block(), 0, stream>>>(a, l.blocks);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const ChannelSumsArgs& a, cudaStream_t stream) {
  return a.sum_of_squares != nullptr ? launch_typed<T, 2>(a, stream)
                                     : launch_typed<T, 1>(a, stream);
}

} // namespace

int64_t channel_sums_partial_floats(int64_t rows, int64_t channels) {
  // Enough for either number of sums (the caller may not know which).
  return std::max(
             sums_layout<1>(rows, channels).blocks,
             sums_layout<2>(rows, channels).blocks * 2) *
      channels;
}

cudaError_t launch_channel_sums(
    const ChannelSumsArgs& args,
    cudaStream_t stream) {
  if (args.channels == 0) {
    return cudaSuccess;
  }
  if (args.rows == 0) {
    // Nothing to read: the sums are 0.
    const size_t bytes = static_cast<size_t>(args.channels) * sizeof(float);
    cudaError_t e = cudaSuccess;
    if (args.sum != nullptr) {
      e = cudaMemsetAsync(args.sum, 0, bytes, stream);
    }
    if (e == cudaSuccess && args.sum_rounded != nullptr) {
      // fp16 and bf16 zeros are zero bits too.
      e = cudaMemsetAsync(args.sum_rounded, 0, bytes / 2, stream);
    }
    if (e == cudaSuccess && args.sum_of_squares != nullptr) {
      e = cudaMemsetAsync(args.sum_of_squares, 0, bytes, stream);
    }
    return e;
  }
  return args.dtype == ActDtype::kHalf
      ? launch_typed<__half>(args, stream)
      : launch_typed<__nv_bfloat16>(args, stream);
}

} // namespace lamp::nn::detail
