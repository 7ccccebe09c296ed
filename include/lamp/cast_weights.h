#pragma once

#include <c10/core/DeviceType.h>
#include <torch/arg.h>

#include <memory>

#include <lamp/export.h>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace lamp {

/// Options of CastWeightsGuard.
struct LAMP_API CastWeightsOptions {
  /// Where lamp's linear layers (`lamp::nn::linear` and `lamp::nn::Linear`
  /// with or without a bias, `lamp::nn::gelu_mlp`) read a weight this
  /// guard cast, on CUDA with gradients: their GEMM writes the weight's
  /// gradient in fp32, for the fp32 parameter, instead of rounding it to
  /// the 16-bit type for the cast's backward to cast back. The gradient is
  /// the same product of the same 16-bit operands, accumulated in fp32 as
  /// before, without that rounding: more precise than autocast's, and not
  /// its bits. Why: the rounded gradient's write, read and cast are one
  /// more pass over every weight a step (on an H100, 2.0 ms of a
  /// checkpointed gpt2-xl step, 0.27 ms of a gpt2 step). Biases, other
  /// modules' weights and the FP8 layers are as without it. Python's twins:
  /// Megatron-LM's `gradient_accumulation_fusion`, Transformer Engine's
  /// `main_grad`. Default false (autocast's gradients, bit for bit).
  TORCH_ARG(bool, fp32_weight_grads) = false;
};

/// Casts the weights and biases of a model's convolutions and linear layers
/// to the autocast dtype in one kernel, and their gradients back to fp32 in
/// one, for the life of the guard.
///
/// Under autocast each fp32 weight is cast where its op first uses it, one
/// kernel a weight, and its gradient is cast back in another: ResNet-50 runs
/// 110 such small kernels a step (0.3 ms of an H200's 10 ms at batch 64).
/// The guard makes one list of the fp32 parameters of every `Conv1d`,
/// `Conv2d`, `Conv3d`, `ConvTranspose1d/2d/3d`, `Linear` and
/// `lamp::nn::Linear` in `model`
/// (submodules included) on `device_type`, casts them all with one
/// `_foreach_copy_` (a custom autograd function whose backward casts every
/// gradient with another) and points the modules' `weight` and `bias`
/// members at the casts until the guard ends; autocast leaves a tensor that
/// already has its dtype alone. The values are the same bits autocast's own
/// casts give, and so are the gradients. Registered parameters, the
/// optimizer's references and the state dict never change: only the
/// members that `forward` reads do, and the destructor puts them back, also
/// when an exception unwinds through it.
///
/// Where a fused optimizer keeps the weights' casts
/// (`lamp::optim::FusedOptimizer::keep_weight_casts`), the guard takes its
/// copy of each such parameter instead of casting it: the same bits, no
/// cast kernel.
///
/// Make the guard inside an enabled `AutocastGuard` (it reads the device's
/// autocast dtype; with autocast off it does nothing) and end it before the
/// optimizer step, as in the example. Other modules' weights are cast by
/// autocast as before.
///
/// With `DistributedDataParallel`: every gradient of the cast parameters
/// becomes ready when the last one does (the end of backward), so bucketed
/// all-reduces no longer overlap the backward; and a parameter that the
/// forward did not use gets no gradient but looks used, so do not combine
/// it with `find_unused_parameters`.
///
/// Example:
/// \code
///   {
///     lamp::AutocastGuard autocast(torch::kCUDA);
///     lamp::CastWeightsGuard cast(*model);
///     loss = torch::cross_entropy_loss(model->forward(images), labels);
///   }
///   scaler.scale(loss).backward();
/// \endcode
class LAMP_API CastWeightsGuard {
 public:
  /// \param model the module whose (and whose submodules') convolution and
  ///   linear parameters to cast; it must outlive the guard.
  /// \param device_type the autocast device: parameters elsewhere are left
  ///   alone; default CUDA.
  /// \param options see CastWeightsOptions.
  explicit CastWeightsGuard(
      torch::nn::Module& model,
      c10::DeviceType device_type = c10::DeviceType::CUDA,
      CastWeightsOptions options = {});
  ~CastWeightsGuard();

  CastWeightsGuard(const CastWeightsGuard&) = delete;
  CastWeightsGuard& operator=(const CastWeightsGuard&) = delete;
  CastWeightsGuard(CastWeightsGuard&&) = delete;
  CastWeightsGuard& operator=(CastWeightsGuard&&) = delete;

  /// How many parameters the guard cast (0 when autocast is off).
  size_t size() const;
  /// How many of them it took from an optimizer's kept copies instead of
  /// casting (`lamp::optim::FusedOptimizer::keep_weight_casts`).
  size_t kept() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp
