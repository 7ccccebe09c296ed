#pragma once

#include <lamp/export.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace lamp::nn {

namespace detail {
struct BatchNormActAccess;
} // namespace detail

/// Options for `BatchNormAct2d`: those of `torch::nn::BatchNorm2dOptions`
/// (same names, same defaults) plus `relu`.
///
/// Example:
/// \code
///   lamp::nn::BatchNormAct2d bn(
///       lamp::nn::BatchNormAct2dOptions(256).momentum(std::nullopt));
/// \endcode
struct LAMP_API BatchNormAct2dOptions {
  /* implicit */ BatchNormAct2dOptions(int64_t num_features);

  /// The number of channels C of the (N, C, H, W) input.
  TORCH_ARG(int64_t, num_features);
  /// Added to the variance for numerical stability. Default: 1e-5.
  TORCH_ARG(double, eps) = 1e-5;
  /// Weight of the current batch in the running statistics; `std::nullopt`
  /// keeps a cumulative average (1 / num_batches_tracked), which reads
  /// `num_batches_tracked` on the host every training step, as
  /// `torch::nn::BatchNorm2d` does (so it cannot be captured in a CUDA
  /// graph). Default: 0.1.
  TORCH_ARG(std::optional<double>, momentum) = 0.1;
  /// Learnable per-channel `weight` (ones) and `bias` (zeros). Default: true.
  TORCH_ARG(bool, affine) = true;
  /// Keep `running_mean`, `running_var` and `num_batches_tracked` and use
  /// them in evaluation mode; without them batch statistics are used in
  /// evaluation mode too. Default: true.
  TORCH_ARG(bool, track_running_stats) = true;
  /// Apply a ReLU after the normalization (and the residual add).
  /// Default: true.
  TORCH_ARG(bool, relu) = true;
};

/// BatchNorm2d, then an optional residual add, then an optional ReLU:
/// `y = relu(batch_norm(x) + residual)`, the tail of every ResNet block.
///
/// It has the parameters and buffers of `torch::nn::BatchNorm2d` under the
/// same names (`weight`, `bias`, `running_mean`, `running_var`,
/// `num_batches_tracked`), so state dicts of torchvision models load, and
/// the same training and evaluation semantics: batch statistics in training
/// (and whenever `track_running_stats` is false), running statistics
/// updated with the unbiased batch variance, `num_batches_tracked` counted
/// up in training.
///
/// On CUDA, in training, with a channels-last fp16 or bf16 input, fp32
/// parameters and a channel count divisible by 4, the whole computation is
/// one cuDNN kernel forward and one backward
/// (`cudnnBatchNormalizationForwardTrainingEx` / `BackwardEx` with the
/// BN_ADD_ACTIVATION, BN_ACTIVATION or BN ops), which also gives the
/// residual's gradient. Everything else (CPU, NCHW, fp32 inputs, shapes
/// cuDNN rejects, evaluation with running statistics, lamp built without
/// cuDNN) runs the unfused `torch::batch_norm`, add and relu, with the same
/// results. It works inside `lamp::AutocastGuard` (batch norm runs in the
/// input's dtype there, as `torch::nn::BatchNorm2d` does), with
/// `GradScaler`, DDP and `GraphedStep`.
///
/// Example:
/// \code
///   lamp::nn::BatchNormAct2d bn3(256);
///   auto out = bn3(conv3(h), identity); // relu(bn3(conv3(h)) + identity)
/// \endcode
class LAMP_API BatchNormAct2dImpl
    : public torch::nn::Cloneable<BatchNormAct2dImpl> {
 public:
  explicit BatchNormAct2dImpl(BatchNormAct2dOptions options);

  void reset() override;
  /// Zeros `running_mean` and `num_batches_tracked`, fills `running_var`
  /// with ones.
  void reset_running_stats();
  /// `reset_running_stats()`, `weight` to ones and `bias` to zeros.
  void reset_parameters();

  /// `relu(batch_norm(input) + residual)` for a 4-D (N, C, H, W) `input`;
  /// `residual` (undefined: none) must have the input's sizes. Without
  /// `relu` in the options: `batch_norm(input) + residual`.
  torch::Tensor forward(
      const torch::Tensor& input,
      const torch::Tensor& residual = {});

  /// Prints `lamp::nn::BatchNormAct2d(64, eps=1e-05, momentum=0.1, ...)`.
  void pretty_print(std::ostream& stream) const override;

  /// The options this module was built with.
  BatchNormAct2dOptions options;
  /// Per-channel scale; undefined without `affine`.
  torch::Tensor weight;
  /// Per-channel shift; undefined without `affine`.
  torch::Tensor bias;
  /// Running mean; undefined without `track_running_stats`.
  torch::Tensor running_mean;
  /// Running (unbiased) variance; undefined without `track_running_stats`.
  torch::Tensor running_var;
  /// Training forward calls so far (int64 scalar); undefined without
  /// `track_running_stats`.
  torch::Tensor num_batches_tracked;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})

 private:
  friend class BatchCountGuard;
  friend struct detail::BatchNormActAccess;
  /// In training with running statistics: counts this call (in
  /// `num_batches_tracked`, or the guard's count) and returns the momentum
  /// it takes; otherwise the options' momentum (0 for None).
  double count_call(const char* who);
  /// Where a `BatchCountGuard` counts this module's training forwards
  /// instead of adding to `num_batches_tracked` (null: no guard). A copy
  /// (`clone()`) starts without one: it is not in the guard's list.
  struct DeferredCount {
    int64_t* calls = nullptr;
    DeferredCount() = default;
    DeferredCount(const DeferredCount& /*other*/) {}
    DeferredCount& operator=(const DeferredCount& /*other*/) {
      return *this;
    }
  };
  DeferredCount deferred_count_;
};

/// A `ModuleHolder` of `BatchNormAct2dImpl`, as `torch::nn::BatchNorm2d`.
TORCH_MODULE(BatchNormAct2d);

/// The function behind `BatchNormAct2d`, with `torch::batch_norm`'s
/// arguments: `relu(batch_norm(input) + residual)` (no ReLU when `relu` is
/// false, no add when `residual` is undefined). `training`: batch
/// statistics, and `running_mean` / `running_var` (either undefined, or
/// both) are updated with weight `momentum`; otherwise the running
/// statistics are used. `weight` and `bias` may be undefined (no affine).
///
/// Example:
/// \code
///   auto y = lamp::nn::batch_norm_act(
///       x, identity, bn->weight, bn->bias, bn->running_mean,
///       bn->running_var, /*training=*/true, 0.1, 1e-5, /*relu=*/true);
/// \endcode
LAMP_API torch::Tensor batch_norm_act(
    const torch::Tensor& input,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& running_mean,
    const torch::Tensor& running_var,
    bool training,
    double momentum,
    double eps,
    bool relu);

/// Which implementation ran a `batch_norm_act` call.
enum class BatchNormActPath {
  /// No call yet on this thread.
  kNone,
  /// `torch::batch_norm`, add and relu (CPU, NCHW, fp32, evaluation, ...).
  kComposite,
  /// cuDNN's fused NHWC kernel, and its fused backward.
  kCudnnFused,
};

} // namespace lamp::nn
