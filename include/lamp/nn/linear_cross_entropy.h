#pragma once

#include <lamp/export.h>

#include <torch/arg.h>
#include <torch/nn/options/loss.h>
#include <torch/types.h>

#include <cstdint>

namespace lamp::nn {

/// Options of `linear_cross_entropy`; defaults are Python's
/// `F.cross_entropy`'s.
struct LAMP_API LinearCrossEntropyOptions {
  /// Targets equal to this count for nothing (no loss, no gradient), as
  /// Python's `ignore_index`. Default: -100.
  TORCH_ARG(int64_t, ignore_index) = -100;
  /// `torch::kMean` (over the targets that count) or `torch::kSum`;
  /// `torch::kNone` is refused (`c10::ValueError`): compute
  /// `torch::cross_entropy_loss(lamp::nn::linear(...), ...)` for per-row
  /// losses. Default: `torch::kMean`.
  TORCH_ARG(torch::nn::CrossEntropyLossOptions::reduction_t, reduction) =
      torch::kMean;
  /// Rows of logits computed at a time; 0 picks as few equal chunks as
  /// keep each within 1 GiB (GPT-2 at batch 16 x 1,024: two chunks of
  /// 8,192 rows of 50,304 classes in bf16, 824 MB each). Default: 0.
  TORCH_ARG(int64_t, chunk_size) = 0;
};

/// Python's `F.cross_entropy(F.linear(input, weight), target)` (a language
/// model's head and its loss) without ever holding the whole logits: rows
/// are taken a chunk at a time, their logits computed (one GEMM), their
/// loss and the logits' gradient computed in place (on CUDA one kernel that
/// reads the chunk twice and writes it once), and that gradient multiplied
/// into the input's and the weight's gradients (two GEMMs, the weight's
/// accumulated in fp32) before the next chunk. The gradients are kept for
/// backward, which only scales them. Liger-Kernel's fused linear
/// cross-entropy and llm.c's fused classifier work the same way.
///
/// Why: GPT-2's logits at batch 16 x 1,024 are 16,384 x 50,304: 1.6 GB in
/// bf16 and 3.3 GB once cross-entropy upcasts them to fp32, as Python does
/// under autocast; its log-softmax, gradient and casts are half a dozen
/// passes over them. Chunked, at most 1 GiB exists at a time.
///
/// `input` is (..., C), `weight` (V, C), `target` (...) of int64 class
/// indices in [0, V) or `ignore_index`. Under `AutocastGuard` the GEMMs run
/// in the autocast dtype (as Python's `linear`) and the softmax in fp32 (as
/// Python's `cross_entropy`); the loss is fp32. Gradients come back in the
/// input's and the weight's dtypes, equal to Python's within rounding (the
/// logits' gradient is rounded to the GEMM dtype unscaled, the weight's
/// summed in fp32 and returned in the weight's dtype: an fp32 weight under
/// autocast gets an fp32 gradient never rounded to bf16, where Python's is
/// a bf16 one cast back). Any device: on CUDA lamp's kernel, elsewhere ATen's
/// ops. A target out of range is a `c10::IndexError` on the CPU and a NaN
/// loss on CUDA (checking it there would be a host sync). No bias; no
/// double backward.
///
/// Example (GPT-2's head tied to the token embedding):
/// \code
///   auto loss = lamp::nn::linear_cross_entropy(
///       ln_f(x), wte->weight, targets);  // x: [B, T, C], targets: [B, T]
/// \endcode
LAMP_API torch::Tensor linear_cross_entropy(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& target,
    const LinearCrossEntropyOptions& options = {});

} // namespace lamp::nn
