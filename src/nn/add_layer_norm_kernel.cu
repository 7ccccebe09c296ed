#include "add_layer_norm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace lamp::nn::detail {
namespace {

// One warp a row, kWarps rows a block; a lane holds the row's columns
// lane, lane + 32, ... in registers (kPer of them).
constexpr int kWarps = 4;
// Warps of the backward (each takes rows w, w + W, ...): enough to fill the
// GPU, few enough that the blocks' partial column sums are small.
constexpr int64_t kBackwardWarps = 1024;

__device__ __forceinline__ float load(const void* p, int64_t i, NormFormat f) {
  switch (f) {
    case NormFormat::kFloat:
      return static_cast<const float*>(p)[i];
    case NormFormat::kHalf:
      return __half2float(static_cast<const __half*>(p)[i]);
    case NormFormat::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return 0.f;
  }
}

__device__ __forceinline__ void store(
    void* p,
    int64_t i,
    NormFormat f,
    float v) {
  switch (f) {
    case NormFormat::kFloat:
      static_cast<float*>(p)[i] = v;
      break;
    case NormFormat::kHalf:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case NormFormat::kBFloat16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      break;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <int kPer>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_forward_kernel(AddNormForward a) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) {
    return;
  }
  const int64_t base = row * a.columns;
  float v[kPer];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    v[i] = 0.f;
    if (j < a.columns) {
      v[i] = a.x[base + j];
      if (a.r != nullptr) {
        v[i] += load(a.r, base + j, a.r_format);
      }
      sum += v[i];
    }
  }
  const float mean = warp_sum(sum) / a.columns;
  float var = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < a.columns) {
      const float d = v[i] - mean;
      var += d * d;
    }
  }
  // NOTE: two passes over registers (mean, then squares about it): the
  // biased variance, as LayerNorm's.
  const float rstd = rsqrtf(warp_sum(var) / a.columns + a.eps);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < a.columns) {
      if (a.sum != nullptr) {
        a.sum[base + j] = v[i];
      }
      float y = (v[i] - mean) * rstd * a.weight[j];
      if (a.bias != nullptr) {
        y += a.bias[j];
      }
      store(a.y, base + j, a.y_format, y);
    }
  }
  if (lane == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

// Each warp: its rows' input gradients; each block: its rows' share of the
// weight's and bias's gradients (column sums), in partials[block], the
// warps' sums added in warp order (deterministic).
template <int kPer>
__global__ void __launch_bounds__(kWarps * 32)
    add_norm_backward_kernel(AddNormBackward a, int64_t warps) {
  __shared__ float block_sums[2 * kMaxNormColumns];
  const int in_block = threadIdx.x / 32;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + in_block;
  const int lane = threadIdx.x % 32;
  float dw[kPer], db[kPer], w[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    dw[i] = 0.f;
    db[i] = 0.f;
    w[i] = j < a.columns ? a.weight[j] : 0.f;
  }
  const float inv_columns = 1.f / a.columns;
  // NOTE: no early return: every warp takes part in the block's sums.
  for (int64_t row = warp; warp < warps && row < a.rows; row += warps) {
    const int64_t base = row * a.columns;
    const float mean = a.mean[row];
    const float rstd = a.rstd[row];
    float xhat[kPer], g[kPer];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      xhat[i] = 0.f;
      g[i] = 0.f;
      if (j < a.columns) {
        const float dy = load(a.dy, base + j, a.dy_format);
        xhat[i] = (a.sum[base + j] - mean) * rstd;
        g[i] = dy * w[i];
        dw[i] += dy * xhat[i];
        db[i] += dy;
        sum_g += g[i];
        sum_gx += g[i] * xhat[i];
      }
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j < a.columns) {
        float d = rstd * (g[i] - (sum_g + xhat[i] * sum_gx) * inv_columns);
        if (a.dsum != nullptr) {
          d += a.dsum[base + j];
        }
        a.dx[base + j] = d;
        if (a.dr != nullptr) {
          store(a.dr, base + j, a.dr_format, d);
        }
      }
    }
  }
  for (int k = 0; k < kWarps; ++k) {
    if (in_block == k) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int j = lane + 32 * i;
        if (j < a.columns) {
          block_sums[j] = (k == 0 ? 0.f : block_sums[j]) + dw[i];
          block_sums[a.columns + j] =
              (k == 0 ? 0.f : block_sums[a.columns + j]) + db[i];
        }
      }
    }
    __syncthreads();
  }
  float* out = a.partials + int64_t{blockIdx.x} * 2 * a.columns;
  for (int j = threadIdx.x; j < 2 * a.columns; j += kWarps * 32) {
    out[j] = block_sums[j];
  }
}

// Column sums of the blocks' partials: 32 columns a block, 8 threads down
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

int64_t backward_warps(int64_t rows) {
  return rows < kBackwardWarps ? rows : kBackwardWarps;
}

// Calls f.template operator()<kPer>() for the smallest kPer that holds
// `columns` (<= kMaxNormColumns).
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
  return f(std::integral_constant<int, 64>{});
}

} // namespace

static int64_t backward_blocks(int64_t rows) {
  return (backward_warps(rows) + kWarps - 1) / kWarps;
}

int64_t add_norm_backward_partials(int64_t rows, int columns) {
  return backward_blocks(rows) * 2 * columns;
}

cudaError_t launch_add_norm_forward(
    const AddNormForward& a,
    cudaStream_t stream) {
  if (a.rows == 0) {
    return cudaSuccess;
  }
  if (a.columns <= 0 || a.columns > kMaxNormColumns) {
    return cudaErrorInvalidValue;
  }
  const auto blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  return with_per_lane(a.columns, [&](auto per) {
    add_norm_forward_kernel<decltype(per)::value>
        <<<blocks, kWarps * 32, 0, stream>>>(a);
    return cudaGetLastError();
  });
}

cudaError_t launch_add_norm_backward(
    const AddNormBackward& a,
    cudaStream_t stream) {
  if (a.rows == 0) {
    return cudaSuccess;
  }
  if (a.columns <= 0 || a.columns > kMaxNormColumns) {
    return cudaErrorInvalidValue;
  }
  const int64_t warps = backward_warps(a.rows);
  const int64_t blocks = backward_blocks(a.rows);
  const cudaError_t error = with_per_lane(a.columns, [&](auto per) {
    add_norm_backward_kernel<decltype(per)::value>
        <<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(a, warps);
    return cudaGetLastError();
  });
  if (error != cudaSuccess) {
    return error;
  }
  add_norm_partials_kernel<<<
      static_cast<unsigned>((2 * a.columns + 31) / 32),
      dim3(32, 8),
      0,
      stream>>>(a, blocks);
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
