#pragma once

// Internal: the fused Adam/AdamW step on fp32 tensors in one launch per
// list, with the arithmetic of ATen 2.11's _fused_adam_/_fused_adamw_
// (bit for bit) and a grid that stays busy to the end (Note [One grid for
// Adam] in adam_kernel.cu); it also writes each stepped parameter's 16-bit
// copy where it has one (FusedOptimizer::keep_weight_casts). Plain CUDA, no
// LibTorch types; src/optim/fused_adam_cuda.cpp is its caller.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::detail {

// Up to kMax parameters with their gradient, moments and step count, all
// fp32 and dense, each list's tensor laid out as the parameter, and where
// `copy[i]` is not null the parameter's 16-bit copy (bf16, or fp16 with
// AdamHyper::copy_half), laid out as it too. Passed by value as the
// kernel's argument, so it stays below CUDA's 4 KB parameter limit; more
// parameters go in several lists, a launch each.
struct AdamList {
  static constexpr int kMax = 64;
  float* param[kMax];
  void* copy[kMax];
  float* grad[kMax];
  float* exp_avg[kMax];
  float* exp_avg_sq[kMax];
  const float* step[kMax];
  int64_t numel[kMax];
  // The first tile of each tensor (launch_adam sets them), and the total.
  int32_t first_tile[kMax];
  int32_t tiles = 0;
  int count = 0;
};

struct AdamHyper {
  double lr = 0; // used where lr_ptr is null
  const float* lr_ptr = nullptr; // the learning rate on the device
  double beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0;
  bool decoupled = false; // AdamW
  // GradScaler: gradients divided by *grad_scale (and written back
  // unscaled, as ATen does, unless not `store_grad`: the caller drops
  // them); the step skipped where *found_inf == 1.
  const float* grad_scale = nullptr;
  const float* found_inf = nullptr;
  bool store_grad = true;
  bool copy_half = false; // the copies are fp16 (else bf16)
};

// One Adam (AdamW with `decoupled`) step of every tensor of
// `lists[0..count)`, whose step counts already count this step.
cudaError_t launch_adam(
    AdamList* lists,
    int count,
    const AdamHyper& hyper,
    int num_sms,
    cudaStream_t stream);

} // namespace lamp::detail
