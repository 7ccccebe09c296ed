#include "resize_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lamp::data::detail {
namespace {

// The span and weights of one output coordinate along one axis, as
// LibTorch's _compute_weights_span / _compute_weights (UpSample.cuh) compute
// them, so that the results equal torch.nn.functional.interpolate(...,
// mode="bilinear", antialias=True) on the GPU.
struct Axis {
  float center;
  float invscale;
  float total;
  int min;
  int size;

  __device__ Axis(int i, int input_size, int output_size) {
    const float scale =
        static_cast<float>(input_size) / static_cast<float>(output_size);
    const float support = scale >= 1.0f ? scale : 1.0f;
    center = scale * (static_cast<float>(i) + 0.5f);
    min = max(static_cast<int>(center - support + 0.5f), 0);
    size = min_int(static_cast<int>(center + support + 0.5f), input_size) - min;
    invscale = scale >= 1.0f ? 1.0f / scale : 1.0f;
    total = 0.0f;
    for (int j = 0; j < size; ++j) {
      total += raw(j);
    }
  }

  __device__ static int min_int(int a, int b) {
    return a < b ? a : b;
  }

  // The triangle filter at tap j, before normalisation.
  __device__ float raw(int j) const {
    const float xmin_m_center = static_cast<float>(min) - center;
    float x = (static_cast<float>(j) + xmin_m_center + 0.5f) * invscale;
    x = x < 0 ? -x : x;
    return x < 1.0f ? 1.0f - x : 0.0f;
  }

  // NOTE: LibTorch stores the weights and then divides them by the total;
  // recomputing raw(j) gives the same float, without an array whose length
  // would bound the downscaling factor.
  __device__ float weight(int j) const {
    const float w = raw(j);
    return total != 0.0f ? w / total : w;
  }
};

template <typename T>
__device__ T convert(float x);
template <>
__device__ float convert<float>(float x) {
  return x;
}
template <>
__device__ __half convert<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 convert<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__device__ void store(
    const ResizeOutput& out,
    int64_t base,
    const uint8_t (&pixel)[3]) {
  T* data = static_cast<T*>(out.data);
  for (int c = 0; c < 3; ++c) {
    // NOTE: __fmul_rn etc. are never contracted into an FMA, so each step
    // rounds as LibTorch's separate kernels do.
    const float scaled = __fmul_rn(static_cast<float>(pixel[c]), 1.0f / 255.0f);
    const float value = __fdiv_rn(__fsub_rn(scaled, out.mean[c]), out.std[c]);
    data[base + c * out.stride_c] = convert<T>(value);
  }
}

template <>
__device__ void store<uint8_t>(
    const ResizeOutput& out,
    int64_t base,
    const uint8_t (&pixel)[3]) {
  uint8_t* data = static_cast<uint8_t*>(out.data);
  for (int c = 0; c < 3; ++c) {
    data[base + c * out.stride_c] = pixel[c];
  }
}

__device__ bool is_copy(const ResizeJob& job, int size) {
  return job.region_height == size && job.region_width == size &&
      job.resized_height == size && job.resized_width == size &&
      job.out_top == 0 && job.out_left == 0;
}

template <typename T>
__global__ void resize_batch_kernel(
    const ResizeJob* jobs,
    int size,
    ResizeOutput out) {
  const ResizeJob job = jobs[blockIdx.y];
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= size * size) {
    return;
  }
  const int y = pixel / size;
  const int x = pixel % size;
  const int ry = job.out_top + y;
  const int rx = job.out_left + (job.flip ? size - 1 - x : x);
  uint8_t result[3];
  if (is_copy(job, size)) {
    const uint8_t* src = job.src + (job.region_top + ry) * job.src_pitch +
        (job.region_left + rx) * 3;
    for (int c = 0; c < 3; ++c) {
      result[c] = src[c];
    }
  } else {
    const Axis ax(rx, job.region_width, job.resized_width);
    const Axis ay(ry, job.region_height, job.resized_height);
    const uint8_t* src = job.src + (job.region_top + ay.min) * job.src_pitch +
        (job.region_left + ax.min) * 3;
    // As LibTorch: each source row of the span interpolated along x, then
    // those values along y, accumulating in float32 in the same order.
    float sum[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < ay.size; ++j) {
      const uint8_t* row = src + j * job.src_pitch;
      float along_x[3];
      const float w0 = ax.weight(0);
      for (int c = 0; c < 3; ++c) {
        along_x[c] = static_cast<float>(row[c]) * w0;
      }
      for (int i = 1; i < ax.size; ++i) {
        const float w = ax.weight(i);
        for (int c = 0; c < 3; ++c) {
          along_x[c] += static_cast<float>(row[i * 3 + c]) * w;
        }
      }
      const float wy = ay.weight(j);
      for (int c = 0; c < 3; ++c) {
        sum[c] = j == 0 ? along_x[c] * wy : sum[c] + along_x[c] * wy;
      }
    }
    for (int c = 0; c < 3; ++c) {
      // round_() (half to even), clamp_(0, 255), then uint8.
      result[c] =
          static_cast<uint8_t>(fminf(fmaxf(rintf(sum[c]), 0.0f), 255.0f));
    }
  }
  const int64_t base = static_cast<int64_t>(job.row) * out.stride_n +
      static_cast<int64_t>(y) * out.stride_y +
      static_cast<int64_t>(x) * out.stride_x;
  store<T>(out, base, result);
}

} // namespace

cudaError_t launch_resize_batch(
    const ResizeJob* jobs,
    int count,
    int size,
    const ResizeOutput& out,
    cudaStream_t stream) {
  if (count == 0) {
    return cudaSuccess;
  }
  constexpr int kThreads = 256;
  const dim3 grid((size * size + kThreads - 1) / kThreads, count);
  switch (out.type) {
    case ResizeOutputType::kUInt8:
      resize_batch_kernel<uint8_t>
          <<<grid, kThreads, 0, stream>>>(jobs, size, out);
      break;
    case ResizeOutputType::kFloat:
      resize_batch_kernel<float>
          <<<grid, kThreads, 0, stream>>>(jobs, size, out);
      break;
    case ResizeOutputType::kHalf:
      resize_batch_kernel<__half>
          <<<grid, kThreads, 0, stream>>>(jobs, size, out);
      break;
    case ResizeOutputType::kBFloat16:
      resize_batch_kernel<__nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(jobs, size, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

} // namespace lamp::data::detail
