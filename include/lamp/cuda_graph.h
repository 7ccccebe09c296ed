#pragma once

// A whole training step (forward under autocast, scaled backward, DDP's
// allreduce, the fused optimizer step, the loss-scale update) captured once
// in a CUDA graph and replayed: one launch a step instead of hundreds.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <lamp/export.h>

namespace lamp {

/// Options of `GraphedStep`.
struct LAMP_API GraphedStepOptions {
  /// Steps run eagerly (on a side stream) before the capture, so that lazy
  /// state exists when the step is captured: optimizer moments and step
  /// counters, the loss scale, cuBLAS/cuDNN workspaces, DDP buckets. These
  /// are real training steps. Must be >= 1. Default: 3 (PyTorch's recipe).
  TORCH_ARG(int64_t, warmup_steps) = 3;
  /// Turn the captured graph's memset nodes (cuDNN issues one in most of
  /// its BatchNorm and convolution calls) into kernel nodes that write the
  /// same bytes before the graph is instantiated: in a graph a memset node
  /// leaves the GPU idle for several microseconds around it, a kernel node
  /// for half a microsecond (ResNet-50 at batch 64 has 146 a step). Default:
  /// true.
  TORCH_ARG(bool, memset_kernels) = true;
};

/// Captures a training step in a CUDA graph and replays it.
///
/// `step` receives the static input tensors and returns the loss. Each call
/// of `operator()(batch)` copies `batch` into the static inputs and runs
/// exactly one training step: the first `warmup_steps` calls run `step`
/// eagerly on a side stream, the next one captures it and replays the graph,
/// every later one only replays. The returned loss is a device tensor that
/// the next call overwrites (reading it, e.g. `.item()`, is a host sync and
/// the caller's choice); the scaler's `get_scale_async()` and
/// `get_found_inf_async()` stay valid the same way.
///
/// What a captured step must be (each violation is a `c10::Error` that says
/// what to change):
/// - every optimizer a `lamp::optim::FusedOptimizer` (FusedAdam, FusedAdamW,
///   FusedSGD): torch::optim optimizers keep step counts on the host and,
///   under GradScaler, read found_inf on the host;
/// - free of host syncs (`.item()`, `.cpu()`, printing tensors,
///   `find_unused_parameters`, LibTorch's `torch::nn::utils::
///   clip_grad_norm_`: clip with `lamp::clip_grad_norm_` instead);
/// - of fixed shapes: every batch must have the static inputs' shapes and
///   dtypes (pad or drop a last partial batch, or use one GraphedStep per
///   shape);
/// - with fixed hyperparameters other than the learning rate: GraphedStep
///   switches the optimizers to device-resident learning rates
///   (`FusedOptimizer::use_device_lr`) and updates them before every replay,
///   so lr schedules work; betas, eps, weight decay and momentum are baked
///   into the graph: a call after changing one of them throws, naming it
///   (call `reset()` after the change: the next call captures again).
///   Step LR schedulers outside the step function.
///
/// Works with `GradScaler` (overflow skips the step on the device and the
/// scale backs off, inside the graph), BatchNorm, channels-last and
/// `DistributedDataParallel` (its NCCL allreduce is captured too; every
/// rank must capture and replay the same step).
///
/// Example:
/// \code
///   lamp::GradScaler scaler;
///   lamp::optim::FusedAdam optimizer(model->parameters());
///   lamp::GraphedStep step(
///       [&](const std::vector<torch::Tensor>& in) {
///         optimizer.zero_grad();
///         torch::Tensor loss;
///         {
///           lamp::AutocastGuard autocast(torch::kCUDA);
///           loss = torch::cross_entropy_loss(model->forward(in[0]), in[1]);
///         }
///         scaler.scale(loss).backward();
///         scaler.step(optimizer);
///         scaler.update();
///         return loss;
///       },
///       {x_example, y_example}, // shapes, dtypes, device of a batch
///       {&optimizer});
///   for (auto& [x, y] : batches) {
///     auto loss = step({x, y}); // device tensor, no sync
///   }
/// \endcode
class LAMP_API GraphedStep {
 public:
  using Function =
      std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

  /// `example_inputs` give the static inputs' shapes, dtypes, memory
  /// formats and (CUDA) device; their values are copied too.
  GraphedStep(
      Function step,
      const std::vector<torch::Tensor>& example_inputs,
      std::vector<torch::optim::Optimizer*> optimizers,
      GraphedStepOptions options = {});
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;
  GraphedStep(GraphedStep&&) noexcept;
  GraphedStep& operator=(GraphedStep&&) noexcept;

  /// Copies `batch` into the static inputs and runs one training step;
  /// returns the loss (a device tensor, overwritten by the next call).
  torch::Tensor operator()(const std::vector<torch::Tensor>& batch);

  /// Drops the graph: the next call captures the step again (no warm-up).
  void reset();
  /// Whether the step has been captured (calls now replay it).
  bool is_captured() const;
  /// The tensors `step` reads its batch from.
  const std::vector<torch::Tensor>& static_inputs() const;
  /// How many memset nodes of the captured graph became kernel nodes
  /// (`GraphedStepOptions::memset_kernels`); 0 before the capture.
  size_t memset_kernels() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp
