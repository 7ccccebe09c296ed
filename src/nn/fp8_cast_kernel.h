#pragma once

// Internal: the FP8 casts of lamp::nn::linear's FP8 path in one pass each
// (fp8_cast_cuda.cpp is the caller). What the ATen reference
// (quantize_delayed / quantize_tensorwise in fp8_linear.cpp) does in about
// ten passes over the operand (abs, amax, to float, multiply, clamp, where,
// to FP8, then a transpose for the backward's GEMMs), these kernels do
// reading it once: the amax of |x|, and x * scale saturated and rounded to
// FP8 into a row-major copy, a transposed copy, or both. Bit for bit the
// reference's bytes, but for the GELU ops: their tanh is the hardware's
// faster form and the derivative is computed without cancellation, so a
// value lies within a rounding of ATen's (fp8_cast_kernel.cu). Plain CUDA,
// no LibTorch types.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp8_cast_op.h"

namespace lamp::nn::detail {

enum class Fp8CastInput { kFloat, kHalf, kBFloat16 };
enum class Fp8CastFormat { kE4M3, kE5M2 };

struct Fp8CastArgs {
  Fp8CastInput input_type = Fp8CastInput::kBFloat16;
  const void* x = nullptr; // rows x cols, row-major (cols contiguous)
  int64_t rows = 0, cols = 0; // each even
  Fp8CastFormat format = Fp8CastFormat::kE4M3;
  // What x is multiplied by before the cast (device, fp32).
  const float* scale = nullptr;
  // true (current scaling, torchao): inf saturates at the format's maximum
  // like any large value. false (delayed scaling): only finite values
  // saturate; inf and NaN stay non-finite (e4m3 has no inf: NaN).
  bool saturate_inf = false;
  uint8_t* out = nullptr; // rows x cols, row-major; or null
  uint8_t* out_t = nullptr; // cols x rows, row-major (x's transpose); or null
  // max(|x|) folded in with atomicMax on the float's bits (NaN wins, then
  // inf), as at::maximum(*amax, x.abs().amax()): the caller zeroes it where
  // it wants x's alone. Or null.
  float* amax = nullptr;
  // 1 / scale, rounded as ATen's reciprocal (one thread writes it). Or null.
  float* inverse_scale = nullptr;
  // [row tiles (rows / 64 rounded up), cols] fp32: each 64-row tile's column
  // sums of x (unscaled), for a bias gradient; launch_fp8_column_fold adds
  // them up. Only the 8-wide path writes them (fp8_cast_is_eight_wide).
  // Or null.
  float* column_partials = nullptr;
  // The op on x's values (only the 8-wide path takes one); `aux` is x's
  // shape, layout and type, for kGeluBackward.
  Fp8CastOp op = Fp8CastOp::kNone;
  const void* aux = nullptr;
  // A vector cast along by the first block: `ride_n` fp32 values of
  // `ride_src` into `ride_dst` as fp16 (`ride_half`) or bf16 (a layer's
  // bias for its GEMM's epilogue, with its weight: one launch less a
  // layer). Or null.
  const float* ride_src = nullptr;
  void* ride_dst = nullptr;
  int64_t ride_n = 0;
  bool ride_half = false;
};

// Whether launch_fp8_cast takes its 8-wide path for these arguments (rows
// and cols multiples of 8, x 16-byte aligned): the one that can write
// column_partials.
bool fp8_cast_is_eight_wide(const Fp8CastArgs& args);

// out[c] = the sum over tiles of partials[tile][c] in fp32, in a fixed
// order (the same bits every run).
cudaError_t launch_fp8_column_fold(
    const float* partials,
    int64_t tiles,
    int64_t cols,
    float* out,
    cudaStream_t stream);

// Enqueues the cast on `stream`: tiles of 64 x 64 elements, read and
// written 8 at a time where rows and cols are multiples of 8 and x (and
// aux) 16-byte aligned, else 2 at a time (then without an op).
cudaError_t launch_fp8_cast(const Fp8CastArgs& args, cudaStream_t stream);

// max(|op(x)|) of `n` elements of x (contiguous; `aux` likewise for
// kGeluBackward) folded into *amax, as above.
cudaError_t launch_fp8_amax(
    Fp8CastInput input_type,
    const void* x,
    int64_t n,
    float* amax,
    cudaStream_t stream,
    Fp8CastOp op = Fp8CastOp::kNone,
    const void* aux = nullptr);

} // namespace lamp::nn::detail
