#pragma once

#include <lamp/export.h>

#include <cstddef>
#include <memory>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace lamp::nn {

/// Counts the training batches of every `BatchNormAct2d` in a model with one
/// kernel when the guard ends, instead of one `num_batches_tracked += 1`
/// kernel in each module's forward.
///
/// `torch::nn::BatchNorm2d` (and `BatchNormAct2d` outside a guard) adds 1 to
/// its int64 `num_batches_tracked` in every training forward: a one-element
/// kernel each, 53 a step in ResNet-50, ~0.1 ms of an H200's 10 ms step at
/// batch 64 with their launch gaps. Inside the guard each module only counts
/// its forward calls on the host; the destructor adds every module's count
/// with one `_foreach_add_` (one per distinct count). A module whose forward
/// did not run is not counted, one whose forward ran twice is counted twice:
/// when the guard has ended, `num_batches_tracked` holds what it would hold
/// without the guard, also when an exception unwinds through it. Inside a
/// CUDA graph capture (`GraphedStep`) the one kernel is captured and every
/// replay counts.
///
/// Modules with `momentum = None` (a cumulative average) read
/// `num_batches_tracked` in their forward and keep counting there; modules
/// not in training mode, or without `track_running_stats`, count nothing, as
/// without the guard. Until the guard ends, the counts it holds are not yet
/// in `num_batches_tracked`: read or save them after it.
///
/// Note [BatchCountGuard and threads]: the guard points each module at a
/// counter it owns until it ends. Run the model's forward on the guard's
/// thread, and make one guard per model at a time (a second guard on the
/// same modules leaves them to the first). Clones of a module made during
/// the guard count for themselves.
///
/// Example:
/// \code
///   {
///     lamp::AutocastGuard autocast(torch::kCUDA);
///     lamp::nn::BatchCountGuard count_batches(*model);
///     loss = torch::cross_entropy_loss(model->forward(images), labels);
///   } // every BatchNormAct2d's num_batches_tracked += 1, in one kernel
/// \endcode
class LAMP_API BatchCountGuard {
 public:
  /// \param model the module whose (and whose submodules') `BatchNormAct2d`
  ///   modules to count; owned by a `std::shared_ptr` (as every
  ///   `ModuleHolder`'s is) and alive until the guard ends.
  explicit BatchCountGuard(torch::nn::Module& model);
  ~BatchCountGuard();

  BatchCountGuard(const BatchCountGuard&) = delete;
  BatchCountGuard& operator=(const BatchCountGuard&) = delete;
  BatchCountGuard(BatchCountGuard&&) = delete;
  BatchCountGuard& operator=(BatchCountGuard&&) = delete;

  /// How many modules this guard counts for.
  size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp::nn
