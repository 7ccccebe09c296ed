#pragma once

#include <lamp/export.h>
#include <lamp/fp8.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>

namespace lamp::nn {

/// Python's `torch.nn.functional.linear(input, weight, bias)` for an input
/// of any rank: ATen's `linear` op, as Python calls it. For a contiguous
/// input of rank 3 or more it folds the leading dimensions into one and runs
/// one GEMM with the bias added in the GEMM's epilogue (cuBLASLt on CUDA),
/// so results are Python's op for op, also in bf16 and fp16. One exception,
/// on CUDA with fp16/bf16 gradients: the bias's gradient is summed by lamp's
/// column-sum kernel (2-4x faster than ATen's reduction on GPT-2's shapes),
/// in fp32 and rounded once as ATen's, in another order (within one
/// rounding of ATen's, the same every run); the input's and weight's
/// gradients are ATen's GEMMs, bit for bit.
///
/// Why: LibTorch's `torch::nn::functional::linear` (and so
/// `torch::nn::Linear`) runs `matmul` and then a separate `output += bias`
/// for inputs of rank 3 and more: another kernel and a pass over the
/// output, and bf16/fp16 outputs rounded twice, so that its losses differ
/// from Python's from the first step. GPT-2 124M's bf16 step was 12 % slower
/// with it on an H200. Autocast applies as to Python's (`linear` runs in the
/// autocast dtype).
///
/// Example:
/// \code
///   auto y = lamp::nn::linear(x, fc->weight, fc->bias); // x: [B, T, C]
/// \endcode
LAMP_API torch::Tensor linear(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& bias = {});

/// `torch::nn::Linear` with Python's forward (`lamp::nn::linear`): the same
/// options (`torch::nn::LinearOptions`), parameter names (`weight`,
/// `bias`), shapes and initialisation (Kaiming-uniform weight, uniform
/// bias, as Python's `reset_parameters`), so state dicts and checkpoints
/// move between the two and between C++ and Python.
///
/// Example:
/// \code
///   lamp::nn::Linear fc(768, 3072);
///   auto y = fc(x); // x: [B, T, 768] -> [B, T, 3072], one GEMM
/// \endcode
class LAMP_API LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);

  /// Registers the parameters and initialises them (Cloneable's hook).
  void reset() override;
  /// Python's `reset_parameters()`: weight ~ Kaiming-uniform(a = sqrt(5)),
  /// bias ~ U(-1/sqrt(in_features), 1/sqrt(in_features)).
  void reset_parameters();
  /// "lamp::nn::Linear(in_features=..., out_features=..., bias=...)".
  void pretty_print(std::ostream& stream) const override;
  /// `lamp::nn::linear(input, weight, bias)`.
  torch::Tensor forward(const torch::Tensor& input);
  /// `forward` without the bias, for the caller to add (Megatron's
  /// skip_bias_add), e.g. with the residual in
  /// lamp::nn::bias_add_layer_norm; in an FP8 scope with this layer's
  /// scaling state, as `forward`.
  torch::Tensor forward_skip_bias(const torch::Tensor& input);

  /// The options it was built with.
  torch::nn::LinearOptions options;
  /// [out_features, in_features].
  torch::Tensor weight;
  /// [out_features], undefined when `options.bias()` is false.
  torch::Tensor bias;
  /// Delayed FP8 scaling's state (lamp/fp8.h, Fp8Scaling::kDelayed):
  /// registered as buffers on the first forward call in a delayed FP8
  /// scope, or by lamp::init_fp8_state; undefined before.
  /// [3, amax_history_len]: the amaxes of the input, the weight and the
  /// output gradient, newest in column 0.
  torch::Tensor fp8_amax_history;
  /// [3]: their scales.
  torch::Tensor fp8_scale;

  /// Registers the two buffers above for `recipe` if they are not there
  /// (zero histories, scales of 1, on the weight's device); a
  /// c10::ValueError if they are, for another amax_history_len.
  void init_fp8_state(const Fp8Recipe& recipe);
};

/// A `std::shared_ptr<LinearImpl>` holder, as LibTorch's module holders.
TORCH_MODULE(Linear);

} // namespace lamp::nn
