#pragma once

// Internal, for lamp's .cu files: deterministic per-channel sums over the
// rows of an NHWC (rows, channels) fp16/bf16 activation, in two kernels
// (no atomics, the same order every run):
//   1. a grid of ReduceLayout's blocks, each summing its rows into
//      registers (8 channels a thread, 16-byte loads) and writing one
//      partial per sum and channel (block_partials);
//   2. a fold adding the blocks' partials per channel in block order
//      (fold_partials), kFoldChannels channels by kFoldSlices slices a
//      block: one thread a channel over 512 partials was a chain of 512
//      loads (36-82 us a call on an H200,
//      docs/design/batchnorm-in-convolutions.md).
// Used by bn_add_relu_kernel.cu (the tail's backward) and
// channel_sums_kernel.cu (conv2d_stats' sums).

#include <algorithm>
#include <cstdint>

namespace lamp::nn::detail {

constexpr int kReduceThreads = 256;
constexpr int kReduceVector = 8; // fp16/bf16 values in 16 bytes
// Blocks of the first kernel: enough to fill an H200 (132 SMs) a few times
// (reduce_layout's default budget for gridDim.x * gridDim.y).
constexpr int64_t kReduceBlocks = 512;
constexpr int kFoldChannels = 32;
constexpr int kFoldSlices = 8;

// How the first kernel's threads cover a row of `channels / 8` vectors:
// `lanes` threads a row, `rows_per_pass` rows at once, and `chunks` blocks
// (gridDim.y) across a row wider than a block; `blocks` (gridDim.x) along
// the rows.
struct ReduceLayout {
  int lanes = 1;
  int rows_per_pass = 1;
  int chunks = 1;
  int64_t blocks = 1;
};

inline ReduceLayout reduce_layout(
    int64_t rows,
    int64_t channels,
    int64_t block_budget = kReduceBlocks) {
  const int64_t vectors = channels / kReduceVector;
  ReduceLayout l;
  // Lanes: the largest power of two (at most a block) dividing the row's
  // vectors, so that every thread of every block has a vector: GPT-2's 768
  // and 2304 columns (96 and 288 vectors) as 96 lanes (a quarter of the
  // block idle) or 256 + 32 (the second chunk seven-eighths idle) read
  // their bias gradients at ~half the memory's speed. Fewer than 8 lanes
  // (odd vector counts): a row a pass as before, up to a block wide.
  int pow2 = 1;
  while (pow2 < kReduceThreads && vectors % (2 * pow2) == 0) {
    pow2 *= 2;
  }
  l.lanes = pow2 >= 8
      ? pow2
      : static_cast<int>(std::min<int64_t>(vectors, kReduceThreads));
  l.rows_per_pass = kReduceThreads / l.lanes;
  l.chunks = static_cast<int>((vectors + l.lanes - 1) / l.lanes);
  const int64_t passes = (rows + l.rows_per_pass - 1) / l.rows_per_pass;
  l.blocks = std::max<int64_t>(
      1,
      std::min<int64_t>(passes, std::max<int64_t>(1, block_budget / l.chunks)));
  return l;
}

#ifdef __CUDACC__

// In the first kernel, after each thread summed its rows into `sums` (the
// 8 channels of its vector `blockIdx.y * lanes + threadIdx.x % lanes`, one
// array per sum; zeros for a thread without a vector): the block's
// rows_per_pass threads of a lane add up in row order, and the block writes
// partials[(blockIdx.x * kSums + s) * channels + channel]. Every thread of
// the block calls it (it synchronises).
template <int kSums>
__device__ inline void block_partials(
    const float (&sums)[kSums][kReduceVector],
    const ReduceLayout& l,
    int64_t channels,
    float* partials) {
  __shared__ float shared[kReduceThreads * kReduceVector];
  // The block's lanes * 8 channels, spread over all its threads (a few
  // lanes each adding rows_per_pass values 8 times over was ~4 us a block
  // at 32 rows a pass); each still adds its rows in row order.
  const int outputs = l.lanes * kReduceVector;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * outputs;
  for (int s = 0; s < kSums; ++s) {
#pragma unroll
    for (int k = 0; k < kReduceVector; ++k) {
      shared[threadIdx.x * kReduceVector + k] = sums[s][k];
    }
    __syncthreads();
    float* out = partials +
        (static_cast<int64_t>(blockIdx.x) * kSums + s) * channels + first;
    for (int o = threadIdx.x; o < outputs && first + o < channels;
         o += kReduceThreads) {
      float total = 0.f;
      for (int j = 0; j < l.rows_per_pass; ++j) {
        total += shared[j * outputs + o];
      }
      out[o] = total;
    }
    __syncthreads();
  }
}

// In the fold kernel (block dim3(kFoldChannels, kFoldSlices), grid
// ceil(channels / kFoldChannels)): channel c's sums over the `blocks`
// partials, slice y adding blocks y, y + 8, ... in order, then slice 0 the
// slices in order. Every thread calls it; returns the channel for the one
// thread that holds its totals in `out` (slice 0), -1 for the others.
template <int kSums>
__device__ inline int64_t fold_partials(
    const float* partials,
    int64_t channels,
    int64_t blocks,
    float (&out)[kSums]) {
  const int64_t c =
      static_cast<int64_t>(blockIdx.x) * kFoldChannels + threadIdx.x;
  float part[kSums] = {};
  if (c < channels) {
#pragma unroll 4
    for (int64_t b = threadIdx.y; b < blocks; b += kFoldSlices) {
#pragma unroll
      for (int s = 0; s < kSums; ++s) {
        part[s] += partials[(b * kSums + s) * channels + c];
      }
    }
  }
  __shared__ float shared[kSums][kFoldSlices][kFoldChannels];
#pragma unroll
  for (int s = 0; s < kSums; ++s) {
    shared[s][threadIdx.y][threadIdx.x] = part[s];
  }
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) {
    return -1;
  }
#pragma unroll
  for (int s = 0; s < kSums; ++s) {
    out[s] = 0.f;
    for (int y = 0; y < kFoldSlices; ++y) {
      out[s] += shared[s][y][threadIdx.x];
    }
  }
  return c;
}

// The fold kernel's launch shape for `channels`.
inline unsigned fold_grid(int64_t channels) {
  return static_cast<unsigned>((channels + kFoldChannels - 1) / kFoldChannels);
}
inline dim3 fold_block() {
  return dim3(kFoldChannels, kFoldSlices);
}

#endif // __CUDACC__

} // namespace lamp::nn::detail
