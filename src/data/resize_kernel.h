#pragma once

// Internal: one CUDA kernel that makes a whole batch of lamp::data's loader
// from uint8 RGB images on the GPU: it crops, resizes (antialiased
// bilinear) and mirrors each image (nvJPEG's), or takes it as it is (the
// rows the CPU decoded), and writes the network's input: uint8 pixels, or
// normalised float, half or bfloat16 at any strides (NCHW or channels-last).
// Plain CUDA, no LibTorch types, so nvcc compiles it without LibTorch's
// headers; src/data/resize_batch.h is the tensor-level entry point.

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

// The element type of the output.
enum class ResizeOutputType : int32_t { kUInt8, kFloat, kHalf, kBFloat16 };

// Where and how the kernel writes image `row`'s pixel (y, x), channel c: at
// data + row * stride_n + c * stride_c + y * stride_y + x * stride_x
// (elements). uint8 output is the pixel; the others are
// (pixel / 255 - mean[c]) / std[c] computed as LibTorch's CUDA ops compute
// `x.div_(255).sub_(mean).div_(std)` in float32 (x * (1 / 255.f), then the
// subtraction, then a true division, none contracted), then converted.
struct ResizeOutput {
  void* data;
  ResizeOutputType type;
  int64_t stride_n;
  int64_t stride_c;
  int64_t stride_y;
  int64_t stride_x;
  float mean[3];
  float std[3];
};

// Writes `count` images of `out` (size x size each) from `jobs`, an array
// in device memory, on `stream`. The arithmetic is that of LibTorch's CUDA
// antialiased bilinear interpolation (_upsample_bilinear2d_aa) in float32,
// rounded half to even and clamped to [0, 255]; a job whose region, resized
// size and output are all size x size at offset 0 copies its pixels (the
// interpolation would give them unchanged).
cudaError_t launch_resize_batch(
    const ResizeJob* jobs,
    int count,
    int size,
    const ResizeOutput& out,
    cudaStream_t stream);

} // namespace lamp::data::detail
