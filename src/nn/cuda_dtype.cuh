#pragma once

// Internal, for lamp's .cu files: conversions between the storage types of
// fp32/fp16/bf16 tensors and the float the kernels compute in.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lamp::nn::detail {

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
// NOTE: round to nearest even, as c10::Half and c10::BFloat16 from float.
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

} // namespace lamp::nn::detail
