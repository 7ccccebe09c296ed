#pragma once

// Internal: one cuBLASLt GEMM with an epilogue that ATen's ops do not
// reach: the GELU of the output with its input kept (forward), and the GELU
// derivative applied to the product (backward). lamp::nn::gelu_mlp's.

#include <ATen/core/Tensor.h>

namespace lamp::nn::detail {

/// What runs after the product, on the fp32 accumulator, before the one
/// rounding to `out`'s type.
enum class LtEpilogue {
  /// out = gelu_tanh(product + bias); aux = product + bias.
  kGeluAuxBias,
  /// out = product * gelu_tanh'(aux).
  kDGelu,
};

/// Row-major `out[M, N] = op(a)[M, K] · op(b)[K, N]` (op transposes when
/// the flag says so) with `epilogue`, through cuBLASLt on `out`'s device
/// and current stream, with ATen's cuBLASLt handle and workspace (so it
/// may be captured in a CUDA graph). Every tensor contiguous, of one type
/// (bf16 or fp16), `aux` [M, N], `bias` [N] (kGeluAuxBias). Returns false,
/// having launched nothing, when cuBLASLt has no algorithm for it (the
/// caller then uses ATen's ops); throws on a cuBLASLt error.
bool lt_matmul(
    const at::Tensor& out,
    const at::Tensor& a,
    bool transpose_a,
    const at::Tensor& b,
    bool transpose_b,
    LtEpilogue epilogue,
    const at::Tensor& aux,
    const at::Tensor& bias = {});

} // namespace lamp::nn::detail
