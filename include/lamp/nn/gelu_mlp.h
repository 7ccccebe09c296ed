#pragma once

#include <lamp/export.h>
#include <lamp/nn/linear.h>

#include <torch/arg.h>
#include <torch/types.h>

namespace lamp::nn {

/// Options of gelu_mlp.
struct LAMP_API GeluMlpOptions {
  /// In a lamp::checkpoint recompute (lamp::is_recomputing()), where the
  /// GELU epilogues apply (below): skip the second GEMM and return an
  /// uninitialised tensor of the output's shape and type, whose gradient
  /// still reaches the input and all four parameters as before (that
  /// backward pass reads the saved hidden activations, not the output).
  /// Right only when the output is one of the checkpointed function's
  /// outputs and nothing inside the function reads it or saves it: the
  /// recompute's backward pass then needs it as a root only, as a GPT
  /// block's MLP output returned for the next block's residual add
  /// (examples/gpt_amp/gpt.h). Saves a quarter of a block's forward
  /// GEMMs in the recompute. Default false; elsewhere it changes nothing.
  /// Python has no twin (torch.utils.checkpoint recomputes everything).
  TORCH_ARG(bool, skip_output_in_recompute) = false;
  /// Leave the second layer's bias out of the output, for the caller to add
  /// (Megatron's skip_bias_add): a GPT block adds it with the residual in
  /// lamp::nn::bias_add_layer_norm, which sums its gradient in the pass that
  /// writes the output's. Default false. With the tensor overload, an
  /// undefined `proj_bias` does the same.
  TORCH_ARG(bool, skip_proj_bias) = false;
};

/// A transformer's MLP, `linear(gelu(linear(x, fc_weight, fc_bias),
/// "tanh"), proj_weight, proj_bias)`: Python's
/// `F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)`, as in
/// GPT-2's blocks, for an input of any rank.
///
/// On CUDA, in bf16 or fp16 (also under autocast), with gradients: the
/// first layer's bias and GELU run in its GEMM's epilogue (cuBLASLt's
/// GELU_AUX_BIAS, which also keeps GELU's input for the backward pass), and
/// the GELU's derivative in the epilogue of the GEMM that computes the
/// hidden layer's gradient (DGELU): no GELU kernel forward or backward and
/// no pass over the 4x-wide hidden activations of its own. Saved for the
/// backward pass: what the three ops save (GELU's input and output). The
/// GELU is computed on the fp32 accumulator and rounded once, so outputs
/// differ from the three ops' by about one rounding of the type; the other
/// GEMMs are ATen's. In an FP8 scope (lamp/fp8.h) both GEMMs are FP8 ones,
/// current scaling, with the GELU inside the FP8 casts between them (the
/// hidden activation cast from the pre-activation, its gradient with GELU's
/// derivative): the values of lamp::nn::linear, at::gelu and
/// lamp::nn::linear in that scope, without their GELU passes -- bit for bit
/// on the CPU; on a GPU within a rounding of the GELU's values, whose tanh
/// is the hardware's faster form and whose derivative is computed without
/// ATen's cancellation (an FP8 byte one step apart now and then).
/// Without gradients (no grad mode, or no operand requiring one) the same
/// GEMMs with the same epilogue, so an evaluation's (or a checkpoint's
/// forward call's) values are the training forward's bit for bit.
/// Otherwise (CPU, fp32 or float64, widths not a multiple of 8, double
/// backward) it is the three ops.
///
/// Example:
/// \code
///   // x: [B, T, 768]; c_fc: 768 -> 3072, c_proj: 3072 -> 768
///   auto y = lamp::nn::gelu_mlp(
///       x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias);
/// \endcode
LAMP_API torch::Tensor gelu_mlp(
    const torch::Tensor& input,
    const torch::Tensor& fc_weight,
    const torch::Tensor& fc_bias,
    const torch::Tensor& proj_weight,
    const torch::Tensor& proj_bias,
    const GeluMlpOptions& options = {});

/// `gelu_mlp` with two `lamp::nn::Linear` layers (both with a bias). In an
/// FP8 scope (lamp/fp8.h) with each layer's scaling as its forward would
/// use it (under delayed scaling its own state, updated as its forward
/// updates it): the values of `proj(gelu(fc(x)))` (as above: bit for bit
/// on the CPU, within the GELU's rounding on a GPU), the GELU inside the
/// casts; otherwise `gelu_mlp` of their parameters.
///
/// Example:
/// \code
///   auto y = lamp::nn::gelu_mlp(x, c_fc, c_proj);
/// \endcode
LAMP_API torch::Tensor gelu_mlp(
    const torch::Tensor& input,
    Linear& fc,
    Linear& proj,
    const GeluMlpOptions& options = {});

} // namespace lamp::nn
