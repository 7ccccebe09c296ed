#include "bn_add_relu_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_dtype.cuh"
#include "nhwc_reduce.cuh"

namespace lamp::nn::detail {
namespace {

constexpr int kThreads = kReduceThreads;
constexpr int kPerVector = kReduceVector; // fp16/bf16 values in 16 bytes

template <typename T>
struct Vec {
  T v[kPerVector];
};

template <typename T>
__device__ inline Vec<T> load(const void* base, int64_t i) {
  const uint4 raw = reinterpret_cast<const uint4*>(base)[i];
  Vec<T> out;
  static_assert(sizeof(Vec<T>) == sizeof(uint4), "16 bytes");
  memcpy(&out, &raw, sizeof(raw));
  return out;
}

template <typename T>
__device__ inline void store(void* base, int64_t i, const Vec<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  reinterpret_cast<uint4*>(base)[i] = raw;
}

// Eight consecutive per-channel floats in two 16-byte loads. NOTE: only
// for vectors lamp allocates (fresh, so aligned) at a channel that is a
// multiple of 8.
__device__ inline void load8(const float* p, float (&out)[kPerVector]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

// relu as torch's: NaN stays NaN.
__device__ inline float relu(float x) {
  return (x > 0.f || x != x) ? x : 0.f;
}

template <typename T, bool kNormalisedZ>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(BnAddReluForwardArgs a) {
  const int64_t vectors = a.channels / kPerVector;
  const int64_t total = a.rows * vectors;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i % vectors) * kPerVector;
    const Vec<T> y = load<T>(a.y, i);
    const Vec<T> z = load<T>(a.z, i);
    float scale[kPerVector], shift[kPerVector];
    float z_scale[kPerVector], z_shift[kPerVector];
    load8(a.scale + c0, scale);
    load8(a.shift + c0, shift);
    if (kNormalisedZ) {
      load8(a.z_scale + c0, z_scale);
      load8(a.z_shift + c0, z_shift);
    }
    Vec<T> out;
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < kPerVector; ++k) {
      float shortcut = to_float(z.v[k]);
      if (kNormalisedZ) {
        shortcut = shortcut * z_scale[k] + z_shift[k];
      }
      const float o = relu(to_float(y.v[k]) * scale[k] + shift[k] + shortcut);
      out.v[k] = from_float<T>(o);
      // NOTE: the stored value decides, as torch's relu backward reads
      // the rounded output.
      bits |= static_cast<uint32_t>(to_float(out.v[k]) > 0.f) << k;
    }
    store<T>(a.out, i, out);
    a.mask[i] = static_cast<uint8_t>(bits);
  }
}

// First pass of the backward: per block and channel, sum(g),
// sum(g * (y - mean)) and, for a normalised shortcut, sum(g * (z - z_mean)).
template <typename T, bool kNormalisedZ>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(BnAddReluBackwardArgs a, ReduceLayout l) {
  constexpr int kSums = kNormalisedZ ? 3 : 2;
  const int64_t vectors = a.channels / kPerVector;
  const int lane = threadIdx.x % l.lanes;
  const int row0 = threadIdx.x / l.lanes;
  const int64_t vec = static_cast<int64_t>(blockIdx.y) * l.lanes + lane;
  const bool active = row0 < l.rows_per_pass && vec < vectors;
  float sum[kSums][kPerVector] = {};
  if (active) {
    float mean_y[kPerVector], mean_z[kPerVector];
#pragma unroll
    for (int k = 0; k < kPerVector; ++k) {
      mean_y[k] = a.mean[vec * kPerVector + k];
      mean_z[k] = kNormalisedZ ? a.z_mean[vec * kPerVector + k] : 0.f;
    }
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * l.rows_per_pass + row0;
         r < a.rows;
         r += static_cast<int64_t>(gridDim.x) * l.rows_per_pass) {
      const int64_t i = r * vectors + vec;
      const Vec<T> d = load<T>(a.dout, i);
      const Vec<T> y = load<T>(a.y, i);
      Vec<T> z;
      if (kNormalisedZ) {
        z = load<T>(a.z, i);
      }
      const uint32_t m = a.mask[i];
#pragma unroll
      for (int k = 0; k < kPerVector; ++k) {
        const float g = ((m >> k) & 1u) ? to_float(d.v[k]) : 0.f;
        sum[0][k] += g;
        sum[1][k] += g * (to_float(y.v[k]) - mean_y[k]);
        if (kNormalisedZ) {
          sum[kSums - 1][k] += g * (to_float(z.v[k]) - mean_z[k]);
        }
      }
    }
  }
  block_partials<kSums>(sum, l, a.channels, a.partials);
}

// Per channel: the blocks' partials (fold_partials), then dweight, dbias
// and the coefficients of dx = A * g + B * (x - mean) + C.
template <bool kNormalisedZ>
__global__ void __launch_bounds__(kFoldChannels* kFoldSlices)
    coefficients_kernel(BnAddReluBackwardArgs a, int64_t blocks) {
  constexpr int kSums = kNormalisedZ ? 3 : 2;
  float sums[kSums];
  const int64_t c = fold_partials<kSums>(a.partials, a.channels, blocks, sums);
  if (c < 0) {
    return;
  }
  const float m = static_cast<float>(a.rows);
  const auto branch = [&](float sum_g,
                          float sum_gx,
                          float invstd,
                          float weight,
                          float* dweight,
                          float* dbias,
                          float* coef) {
    const float dw = sum_gx * invstd; // sum(g * xhat)
    dweight[c] = dw;
    dbias[c] = sum_g;
    const float a_ = weight * invstd;
    coef[0 * a.channels + c] = a_;
    coef[1 * a.channels + c] = -a_ * invstd * dw / m;
    coef[2 * a.channels + c] = -a_ * sum_g / m;
  };
  branch(
      sums[0],
      sums[1],
      a.invstd[c],
      a.weight[c],
      a.dweight,
      a.dbias,
      a.coefficients);
  if (kNormalisedZ) {
    branch(
        sums[0],
        sums[2],
        a.z_invstd[c],
        a.z_weight[c],
        a.z_dweight,
        a.z_dbias,
        a.coefficients + 3 * a.channels);
  }
}

template <typename T, bool kNormalisedZ>
__global__ void __launch_bounds__(kThreads) dx_kernel(BnAddReluBackwardArgs a) {
  const int64_t vectors = a.channels / kPerVector;
  const int64_t total = a.rows * vectors;
  const float* coef = a.coefficients;
  const int64_t ch = a.channels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i % vectors) * kPerVector;
    const Vec<T> d = load<T>(a.dout, i);
    const Vec<T> y = load<T>(a.y, i);
    Vec<T> z;
    if (kNormalisedZ) {
      z = load<T>(a.z, i);
    }
    const uint32_t m = a.mask[i];
    float ca[kPerVector], cb[kPerVector], cc[kPerVector], mean[kPerVector];
    load8(coef + c0, ca);
    load8(coef + ch + c0, cb);
    load8(coef + 2 * ch + c0, cc);
    load8(a.mean + c0, mean);
    float za[kPerVector], zb[kPerVector], zc[kPerVector], z_mean[kPerVector];
    if (kNormalisedZ) {
      load8(coef + 3 * ch + c0, za);
      load8(coef + 4 * ch + c0, zb);
      load8(coef + 5 * ch + c0, zc);
      load8(a.z_mean + c0, z_mean);
    }
    Vec<T> dy, dz;
#pragma unroll
    for (int k = 0; k < kPerVector; ++k) {
      const bool on = (m >> k) & 1u;
      const float g = on ? to_float(d.v[k]) : 0.f;
      dy.v[k] = from_float<T>(
          ca[k] * g + cb[k] * (to_float(y.v[k]) - mean[k]) + cc[k]);
      if (kNormalisedZ) {
        dz.v[k] = from_float<T>(
            za[k] * g + zb[k] * (to_float(z.v[k]) - z_mean[k]) + zc[k]);
      } else {
        dz.v[k] = on ? d.v[k] : from_float<T>(0.f);
      }
    }
    store<T>(a.dy, i, dy);
    store<T>(a.dz, i, dz);
  }
}

unsigned elementwise_blocks(int64_t rows, int64_t channels) {
  const int64_t total = rows * (channels / kPerVector);
  // A grid-stride loop: a few waves of resident blocks, not one block per
  // 256 vectors.
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16)));
}

template <typename T>
cudaError_t forward_typed(const BnAddReluForwardArgs& a, cudaStream_t stream) {
  const unsigned blocks = elementwise_blocks(a.rows, a.channels);
  if (a.z_scale != nullptr) {
    forward_kernel<T, true><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    forward_kernel<T, false><<<blocks, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T, bool kNormalisedZ>
cudaError_t backward_typed(
    const BnAddReluBackwardArgs& a,
    cudaStream_t stream) {
  const ReduceLayout l = reduce_layout(a.rows, a.channels);
  reduce_kernel<T, kNormalisedZ>
      <<<dim3(static_cast<unsigned>(l.blocks), static_cast<unsigned>(l.chunks)),
         kThreads,
         0,
         stream>>>(a, l);
  coefficients_kernel<kNormalisedZ>
      <<<fold_grid(a.channels), fold_block(), 0, stream>>>(a, l.blocks);
  dx_kernel<T, kNormalisedZ>
      <<<elementwise_blocks(a.rows, a.channels), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

} // namespace

cudaError_t launch_bn_add_relu_forward(
    const BnAddReluForwardArgs& args,
    cudaStream_t stream) {
  if (args.rows == 0 || args.channels == 0) {
    return cudaSuccess;
  }
  return args.dtype == ActDtype::kHalf
      ? forward_typed<__half>(args, stream)
      : forward_typed<__nv_bfloat16>(args, stream);
}

int64_t bn_add_relu_partial_floats(int64_t rows, int64_t channels) {
  return reduce_layout(rows, channels).blocks * 3 * channels;
}

cudaError_t launch_bn_add_relu_backward(
    const BnAddReluBackwardArgs& args,
    cudaStream_t stream) {
  if (args.rows == 0 || args.channels == 0) {
    return cudaSuccess;
  }
  const bool normalised = args.z != nullptr;
  if (args.dtype == ActDtype::kHalf) {
    return normalised ? backward_typed<__half, true>(args, stream)
                      : backward_typed<__half, false>(args, stream);
  }
  return normalised ? backward_typed<__nv_bfloat16, true>(args, stream)
                    : backward_typed<__nv_bfloat16, false>(args, stream);
}

} // namespace lamp::nn::detail
