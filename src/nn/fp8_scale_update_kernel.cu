#include "fp8_scale_update_kernel.h"

#include <cmath>

namespace lamp::nn::detail {
namespace {

constexpr int kPerLane = kFp8UpdateMaxHistory / 32;

// Warp w updates row w of `history`: reads the whole row first (its amax
// and, for the roll, each column's right neighbour), then writes the rolled
// row with column 0 zeroed; lane 0 writes the scale.
__device__ void update_layer(
    const Fp8ScaleUpdateArgs& a,
    float* history,
    float* scale) {
  const int row = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* h = history + static_cast<int64_t>(row) * a.len;
  const float newest = h[0];
  float largest = -INFINITY;
  bool nan = false;
  float next[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + 32 * k;
    if (j < a.len) {
      const float v = h[j];
      nan = nan || isnan(v);
      largest = fmaxf(largest, v);
      next[k] = h[(j + 1) % a.len];
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  }
  nan = __any_sync(0xffffffffu, nan);
  __syncwarp();
  // Transformer Engine's _update_amax_history: roll by -1, zero column 0.
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + 32 * k;
    if (j < a.len) {
      h[j] = j == 0 ? 0.0f : next[k];
    }
  }
  if (lane == 0) {
    // ATen's amax: NaN if any is.
    const float amax = a.most_recent ? newest : (nan ? NAN : largest);
    // fp8 max / amax, then ATen's division by 2^margin (a multiply by its
    // reciprocal); kept where amax is not positive and finite.
    const float fp8_max = row == 2 ? 57344.0f : 448.0f;
    if (amax > 0 && isfinite(amax)) {
      scale[row] = __fmul_rn(__fdiv_rn(fp8_max, amax), a.margin_scale);
    }
  }
}

__global__ void __launch_bounds__(96)
    fp8_scale_update_kernel(Fp8ScaleUpdateArgs a) {
  update_layer(a, a.history, a.scale);
}

// Block i updates layer i of the launch.
struct UpdateBatch {
  Fp8ScaleUpdateArgs shared;
  float* history[kFp8UpdatesPerLaunch];
  float* scale[kFp8UpdatesPerLaunch];
};

__global__ void __launch_bounds__(96)
    fp8_scale_updates_kernel(const __grid_constant__ UpdateBatch b) {
  update_layer(b.shared, b.history[blockIdx.x], b.scale[blockIdx.x]);
}

} // namespace

cudaError_t launch_fp8_scale_update(
    const Fp8ScaleUpdateArgs& args,
    cudaStream_t stream) {
  if (args.len < 1 || args.len > kFp8UpdateMaxHistory) {
    return cudaErrorInvalidValue;
  }
  fp8_scale_update_kernel<<<1, 96, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_fp8_scale_updates(
    const Fp8ScaleUpdateArgs& shared,
    float* const* histories,
    float* const* scales,
    int n,
    cudaStream_t stream) {
  if (shared.len < 1 || shared.len > kFp8UpdateMaxHistory || n < 0) {
    return cudaErrorInvalidValue;
  }
  for (int first = 0; first < n; first += kFp8UpdatesPerLaunch) {
    UpdateBatch b{};
    b.shared = shared;
    const int count =
        n - first < kFp8UpdatesPerLaunch ? n - first : kFp8UpdatesPerLaunch;
    for (int i = 0; i < count; ++i) {
      b.history[i] = histories[first + i];
      b.scale[i] = scales[first + i];
    }
    fp8_scale_updates_kernel<<<count, 96, 0, stream>>>(b);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

} // namespace lamp::nn::detail
