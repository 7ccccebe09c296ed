#include "adam_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

// Note [One grid for Adam]
// ATen's fused Adam gives each 65,536-element chunk of a tensor a thread
// block and launches at most 320 blocks (and 36 tensors) at a time: a
// gpt2-xl step (1.56 G parameters, 43.6 GB read and written) is ~75
// launches of ~2.4 waves each on an H100, every launch draining its last
// wave before the next starts: 19.3 ms, 2.3 TB/s. Here one launch covers a
// list of up to AdamList::kMax tensors cut into tiles of kTile elements; a
// grid of a few blocks per SM takes the tiles in turn (a block's tiles are
// blockIdx.x, + gridDim.x, ...), so every SM streams until the list ends.
// The per-element arithmetic is ATen 2.11's adam_math for fp32 (opmath
// float; the fma forms of its moment updates; its bias corrections from
// the step count), written in the same order so that nvcc contracts it
// the same way: the same bits as _fused_adam_/_fused_adamw_, which
// FusedAdamGpu.* check.

namespace lamp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 8 * 1024; // elements: 8 float4s a thread

struct Coefficients {
  float lr, beta1, beta2, weight_decay, eps, bias_correction1,
      bias_correction2_sqrt;
};

// ATen's adam_math for one element.
template <bool kDecoupled, bool kScaled>
__device__ __forceinline__ void adam_element(
    float& param,
    float& grad,
    float& exp_avg,
    float& exp_avg_sq,
    const Coefficients& c,
    float grad_scale) {
  if (kScaled) {
    grad /= grad_scale;
  }
  float g = grad; // grad_to_store is `grad` from here on
  if (c.weight_decay != 0) {
    if (kDecoupled) {
      param -= c.lr * c.weight_decay * param;
    } else {
      g += param * c.weight_decay;
    }
  }
  exp_avg = std::fma(c.beta1, exp_avg, std::fma(-c.beta1, g, g));
  exp_avg_sq = std::fma(c.beta2, exp_avg_sq, std::fma(-c.beta2, g * g, g * g));
  const float step_size = c.lr / c.bias_correction1;
  const float denom = (std::sqrt(exp_avg_sq) / c.bias_correction2_sqrt) + c.eps;
  param -= step_size * exp_avg / denom;
}

template <bool kDecoupled, bool kScaled>
__device__ __forceinline__ void adam_vector(
    float4& p,
    float4& g,
    float4& m,
    float4& v,
    const Coefficients& c,
    float scale) {
  adam_element<kDecoupled, kScaled>(p.x, g.x, m.x, v.x, c, scale);
  adam_element<kDecoupled, kScaled>(p.y, g.y, m.y, v.y, c, scale);
  adam_element<kDecoupled, kScaled>(p.z, g.z, m.z, v.z, c, scale);
  adam_element<kDecoupled, kScaled>(p.w, g.w, m.w, v.w, c, scale);
}

// Four values rounded to 16 bits, as one 8-byte store.
__device__ __forceinline__ void store_copy4(
    void* copy,
    int64_t e,
    const float4& p,
    bool half) {
  uint2 packed;
  if (half) {
    const __half2 a = __floats2half2_rn(p.x, p.y);
    const __half2 b = __floats2half2_rn(p.z, p.w);
    packed.x = *reinterpret_cast<const uint32_t*>(&a);
    packed.y = *reinterpret_cast<const uint32_t*>(&b);
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(p.x, p.y);
    const __nv_bfloat162 b = __floats2bfloat162_rn(p.z, p.w);
    packed.x = *reinterpret_cast<const uint32_t*>(&a);
    packed.y = *reinterpret_cast<const uint32_t*>(&b);
  }
  *reinterpret_cast<uint2*>(static_cast<uint16_t*>(copy) + e) = packed;
}

__device__ __forceinline__ void store_copy1(
    void* copy,
    int64_t e,
    float p,
    bool half) {
  if (half) {
    static_cast<__half*>(copy)[e] = __float2half_rn(p);
  } else {
    static_cast<__nv_bfloat16*>(copy)[e] = __float2bfloat16_rn(p);
  }
}

template <bool kDecoupled, bool kScaled>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(const AdamList list, const AdamHyper hyper) {
  if (hyper.found_inf != nullptr && *hyper.found_inf == 1) {
    return;
  }
  const float scale = kScaled ? *hyper.grad_scale : 1.0f;
  Coefficients c;
  c.lr = hyper.lr_ptr != nullptr ? *hyper.lr_ptr : static_cast<float>(hyper.lr);
  c.beta1 = static_cast<float>(hyper.beta1);
  c.beta2 = static_cast<float>(hyper.beta2);
  c.weight_decay = static_cast<float>(hyper.weight_decay);
  c.eps = static_cast<float>(hyper.eps);
  int t = -1;
  for (int tile = blockIdx.x; tile < list.tiles; tile += gridDim.x) {
    // The tensor of this tile (the same for the whole block): tiles only
    // grow, so walk on from the last one.
    const int before = t;
    while (t + 1 < list.count && list.first_tile[t + 1] <= tile) {
      ++t;
    }
    if (t != before) {
      const float step = *list.step[t];
      c.bias_correction1 = 1 - std::pow(c.beta1, step);
      const float bias_correction2 = 1 - std::pow(c.beta2, step);
      c.bias_correction2_sqrt = std::sqrt(bias_correction2);
    }
    const int64_t lo = int64_t{tile - list.first_tile[t]} * kTile;
    const int64_t hi = lo + kTile < list.numel[t] ? lo + kTile : list.numel[t];
    float* const p = list.param[t];
    float* const g = list.grad[t];
    float* const m = list.exp_avg[t];
    float* const v = list.exp_avg_sq[t];
    void* const copy = list.copy[t];
    const bool half = hyper.copy_half;
    const bool store_grad = kScaled && hyper.store_grad;
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
          reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) &
         15) == 0 &&
        (reinterpret_cast<uintptr_t>(copy) & 7) == 0;
    int64_t i = lo;
    if (aligned) {
      const int64_t vectors = (hi - lo) / 4;
      // Two vectors of each list in flight a thread: all eight loads issue
      // before the first store (which might alias them, as far as nvcc
      // knows).
      for (int64_t k = threadIdx.x; k < vectors; k += 2 * kThreads) {
        const bool second = k + kThreads < vectors;
        const int64_t e0 = lo + 4 * k;
        const int64_t e1 = second ? e0 + 4 * kThreads : e0;
        float4 p0 = *reinterpret_cast<const float4*>(p + e0);
        float4 g0 = *reinterpret_cast<const float4*>(g + e0);
        float4 m0 = *reinterpret_cast<const float4*>(m + e0);
        float4 v0 = *reinterpret_cast<const float4*>(v + e0);
        float4 p1 = *reinterpret_cast<const float4*>(p + e1);
        float4 g1 = *reinterpret_cast<const float4*>(g + e1);
        float4 m1 = *reinterpret_cast<const float4*>(m + e1);
        float4 v1 = *reinterpret_cast<const float4*>(v + e1);
        adam_vector<kDecoupled, kScaled>(p0, g0, m0, v0, c, scale);
        adam_vector<kDecoupled, kScaled>(p1, g1, m1, v1, c, scale);
        *reinterpret_cast<float4*>(p + e0) = p0;
        if (copy != nullptr) {
          store_copy4(copy, e0, p0, half);
        }
        *reinterpret_cast<float4*>(m + e0) = m0;
        *reinterpret_cast<float4*>(v + e0) = v0;
        if (store_grad) {
          *reinterpret_cast<float4*>(g + e0) = g0;
        }
        if (second) {
          *reinterpret_cast<float4*>(p + e1) = p1;
          if (copy != nullptr) {
            store_copy4(copy, e1, p1, half);
          }
          *reinterpret_cast<float4*>(m + e1) = m1;
          *reinterpret_cast<float4*>(v + e1) = v1;
          if (store_grad) {
            *reinterpret_cast<float4*>(g + e1) = g1;
          }
        }
      }
      i = lo + 4 * vectors;
    }
    for (int64_t e = i + threadIdx.x; e < hi; e += kThreads) {
      float pe = p[e], ge = g[e], me = m[e], ve = v[e];
      adam_element<kDecoupled, kScaled>(pe, ge, me, ve, c, scale);
      p[e] = pe;
      if (copy != nullptr) {
        store_copy1(copy, e, pe, half);
      }
      if (store_grad) {
        g[e] = ge;
      }
      m[e] = me;
      v[e] = ve;
    }
  }
}

template <bool kDecoupled, bool kScaled>
void launch_one(
    const AdamList& list,
    const AdamHyper& hyper,
    int num_sms,
    cudaStream_t stream) {
  // As many blocks as fit on the GPU at once (no second wave to drain).
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, adam_kernel<kDecoupled, kScaled>, kThreads, 0) != cudaSuccess) {
      cudaGetLastError(); // not sticky; fall back to 2 a SM
      n = 2;
    }
    return std::max(n, 1);
  }();
  const int blocks =
      std::max(1, std::min(list.tiles, std::max(num_sms, 1) * per_sm));
  adam_kernel<kDecoupled, kScaled>
      <<<blocks, kThreads, 0, stream>>>(list, hyper);
}

} // namespace

cudaError_t launch_adam(
    AdamList* lists,
    int count,
    const AdamHyper& hyper,
    int num_sms,
    cudaStream_t stream) {
  for (int l = 0; l < count; ++l) {
    AdamList& list = lists[l];
    list.tiles = 0;
    for (int t = 0; t < list.count; ++t) {
      list.first_tile[t] = list.tiles;
      list.tiles += static_cast<int32_t>((list.numel[t] + kTile - 1) / kTile);
    }
    if (list.tiles == 0) {
      continue;
    }
    const bool scaled = hyper.grad_scale != nullptr;
    if (hyper.decoupled) {
      scaled ? launch_one<true, true>(list, hyper, num_sms, stream)
             : launch_one<true, false>(list, hyper, num_sms, stream);
    } else {
      scaled ? launch_one<false, true>(list, hyper, num_sms, stream)
             : launch_one<false, false>(list, hyper, num_sms, stream);
    }
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
      return error;
    }
  }
  return cudaSuccess;
}

} // namespace lamp::detail
