#include "resize_kernel.h"

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

__global__ void resize_batch_kernel(
    const ResizeJob* jobs,
    int size,
    uint8_t* out) {
  const ResizeJob job = jobs[blockIdx.y];
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= size * size) {
    return;
  }
  const int y = pixel / size;
  const int x = pixel % size;
  const int ry = job.out_top + y;
  const int rx = job.out_left + (job.flip ? size - 1 - x : x);
  const Axis ax(rx, job.region_width, job.resized_width);
  const Axis ay(ry, job.region_height, job.resized_height);
  const uint8_t* src = job.src + (job.region_top + ay.min) * job.src_pitch +
      (job.region_left + ax.min) * 3;
  // As LibTorch: each source row of the span interpolated along x, then
  // those values along y, accumulating in float32 in the same order.
  float result[3] = {0.0f, 0.0f, 0.0f};
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
      result[c] = j == 0 ? along_x[c] * wy : result[c] + along_x[c] * wy;
    }
  }
  uint8_t* o =
      out + ((static_cast<int64_t>(job.row) * size + y) * size + x) * 3;
  for (int c = 0; c < 3; ++c) {
    // round_() (half to even), clamp_(0, 255), then uint8.
    o[c] = static_cast<uint8_t>(fminf(fmaxf(rintf(result[c]), 0.0f), 255.0f));
  }
}

} // namespace

cudaError_t launch_resize_batch(
    const ResizeJob* jobs,
    int count,
    int size,
    uint8_t* out,
    cudaStream_t stream) {
  if (count == 0) {
    return cudaSuccess;
  }
  constexpr int kThreads = 256;
  const dim3 grid((size * size + kThreads - 1) / kThreads, count);
  resize_batch_kernel<<<grid, kThreads, 0, stream>>>(jobs, size, out);
  return cudaGetLastError();
}

} // namespace lamp::data::detail
