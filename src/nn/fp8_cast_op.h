#pragma once

// Internal: what an FP8 cast reads (fp8_linear.h's casts and the kernels of
// fp8_cast_kernel.h). No includes: both the LibTorch side and the plain
// CUDA side take it.

namespace lamp::nn::detail {

// x itself; GELU (tanh) of x, a transformer MLP's hidden activation from
// its pre-activation; or x times GELU's derivative at `aux` (the
// pre-activation), that activation's gradient. The op's result is rounded
// to x's type before it is scaled, as ATen's gelu / gelu_backward output
// it, and it is what amax and the column sums see. The reference runs
// ATen's ops; the CUDA kernels' ops are within a rounding of them
// (fp8_cast_kernel.cu).
enum class Fp8CastOp { kNone, kGelu, kGeluBackward };

} // namespace lamp::nn::detail
