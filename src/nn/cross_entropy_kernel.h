#pragma once

// Internal: the softmax cross-entropy of lamp::nn::linear_cross_entropy's
// logits, one chunk of rows at a time, with the logits' gradient written
// over them (Note [Cross-entropy without the logits] in
// linear_cross_entropy.cpp). Plain CUDA, no LibTorch types
// (cross_entropy_cuda.cpp is the caller).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class LogitsDtype { kFloat, kHalf, kBFloat16 };

struct SoftmaxXentArgs {
  LogitsDtype dtype = LogitsDtype::kFloat;
  // rows x classes logits at logits + r * stride (elements), overwritten
  // with softmax - one_hot(target) (rows whose target is ignore_index:
  // zeros).
  void* logits = nullptr;
  int64_t rows = 0, classes = 0, stride = 0;
  const int64_t* target = nullptr; // rows
  int64_t ignore_index = -100;
  // loss[r] = logsumexp(logits[r]) - logits[r, target[r]] (fp32), 0 for an
  // ignored row, NaN for a target outside [0, classes).
  float* loss = nullptr;
};

// Enqueues the kernel on `stream`: one thread block a row.
cudaError_t launch_softmax_xent_grad(
    const SoftmaxXentArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
