#pragma once

// Internal: the weight gradient of lamp::nn::embedding, summed from the
// output's gradient rows in the order ATen's CUDA embedding backward sums
// them (so the values are its bit for bit), either written into a zeroed
// gradient or added into one that holds the tied LM head's gradient
// already (Note [A tied embedding's gradient] in embedding.cpp). Plain
// CUDA, no LibTorch types (embedding_cuda.cpp is the caller).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class EmbeddingDtype { kFloat, kHalf, kBFloat16 };

struct EmbeddingBackwardArgs {
  EmbeddingDtype dtype = EmbeddingDtype::kFloat;
  // The n looked-up indices sorted (a stable sort), and where each sorted
  // one was: grad_out's row of that lookup.
  int64_t n = 0;
  const int64_t* sorted = nullptr;
  const int64_t* order = nullptr;
  // grad_out: n x dim, row-major. grad_weight: rows x dim, row-major; its
  // row of each index is set to (add: increased by) the sum of that
  // index's grad_out rows, in the dtype of both. Rows of padding_idx are
  // left as they are.
  int64_t dim = 0;
  const void* grad_out = nullptr;
  void* grad_weight = nullptr;
  int64_t padding_idx = -1;
  bool add = false;
};

// Enqueues the kernel on `stream`: a thread block per sorted index; the
// first of each run of equal indices sums the run.
cudaError_t launch_embedding_backward(
    const EmbeddingBackwardArgs& args,
    cudaStream_t stream);

} // namespace lamp::nn::detail
