#pragma once

// Internal: one CUDA kernel that crops, resizes (antialiased bilinear) and
// mirrors a whole batch of uint8 RGB images, for the nvJPEG path of
// lamp::data's loader. Plain CUDA, no LibTorch types, so nvcc compiles it
// without LibTorch's headers; src/data/resize_batch.h is the tensor-level
// entry point.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::data::detail {

// One image of the batch. Output pixel (y, x) of row `row` is pixel
// (out_top + y, out_left + x') of the `region` of `src` resized to
// resized_height x resized_width, with x' = flip ? size - 1 - x : x.
struct ResizeJob {
  const uint8_t* src; // uint8 [height, width, 3], rows `src_pitch` bytes apart
  int64_t src_pitch;
  int32_t region_top;
  int32_t region_left;
  int32_t region_height;
  int32_t region_width;
  int32_t resized_height;
  int32_t resized_width;
  int32_t out_top;
  int32_t out_left;
  int32_t flip;
  int32_t row;
};

// Writes `count` rows of `out` (uint8 [rows, size, size, 3]) from `jobs`, an
// array in device memory, on `stream`. The arithmetic is that of LibTorch's
// CUDA antialiased bilinear interpolation (_upsample_bilinear2d_aa) in
// float32, rounded half to even and clamped to [0, 255].
cudaError_t launch_resize_batch(
    const ResizeJob* jobs,
    int count,
    int size,
    uint8_t* out,
    cudaStream_t stream);

} // namespace lamp::data::detail
