#pragma once

// Data-parallel training: `lamp::DistributedDataParallel` averages
// gradients across the ranks of a process group while backward runs.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <lamp/dist/process_group.h>
#include <lamp/export.h>

namespace lamp {

/// Options of `DistributedDataParallel`; defaults are those of Python's
/// `torch.nn.parallel.DistributedDataParallel`.
struct LAMP_API DDPOptions {
  /// Size of every gradient bucket but the first, in MiB. Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Size of the first bucket (the last layers' gradients, ready first), in
  /// MiB; small so that communication starts early. Default: 1.
  TORCH_ARG(double, first_bucket_cap_mb) = 1.0;
  /// Allow parameters that get no gradient in some backward passes: at the
  /// end of backward their share of the bucket is zero and the bucket is
  /// reduced anyway. Costs one small allreduce and a host sync per
  /// backward (as in PyTorch). Without it such a parameter is an error at
  /// the end of backward. Default: false.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Copy rank 0's buffers (e.g. BatchNorm running statistics) to all ranks
  /// after every synchronised backward, so every forward starts from rank
  /// 0's. Default: true.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Make each parameter's `.grad` a view into its bucket, saving a copy of
  /// every gradient and the memory of one set of gradients. `zero_grad()`
  /// (set to none) undoes it for one step. Default: false.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// Communicate gradients in this dtype (kHalf or kBFloat16 halve the
  /// bytes, as PyTorch's fp16/bf16 compress hooks), or in the parameters'
  /// dtype when unset. Default: unset.
  TORCH_ARG(std::optional<torch::Dtype>, comm_dtype) = std::nullopt;
};

/// Data-parallel training: every rank holds a replica of `module` and
/// trains it on its own share of the batch; by the time `backward()`
/// returns, every parameter's gradient is the average over ranks, so the
/// replicas take identical optimizer steps.
///
/// At construction the ranks check that their modules have the same
/// parameters and buffers (names, shapes, dtypes; a mismatch throws on
/// every rank, naming the first differing one), then rank 0's values are
/// broadcast. Parameters are grouped into buckets as PyTorch's reducer
/// does (`compute_bucket_assignment_by_size` over the parameters in reverse
/// registration order, the order their gradients become ready: one open
/// bucket per dtype, `first_bucket_cap_mb` for the first, `bucket_cap_mb`
/// after). A hook after each gradient's accumulation copies it into its
/// bucket; once a bucket is complete its allreduce (average) starts on a
/// dedicated NCCL stream while backward goes on. Buckets are reduced in the
/// same order on every rank. When backward ends, an autograd-engine
/// callback makes the caller's stream wait for the reductions and writes
/// the averages back into `.grad`. No host sync anywhere (unless
/// `find_unused_parameters`).
///
/// Call `forward` on the module itself, as without DDP. Under `no_sync()`
/// backward only accumulates local gradients (gradient accumulation); the
/// next backward outside it averages the sum.
///
/// GradScaler: with averaged gradients an inf/NaN on any rank reaches every
/// rank's gradients, so every rank skips the same steps. When ranks step on
/// gradients that were not averaged (e.g. stepping inside `no_sync()`),
/// give the scaler the process group
/// (`GradScalerOptions().process_group(pg)`): it then takes the maximum of
/// found_inf over ranks.
///
/// A world of one process makes `DistributedDataParallel` a no-op. Not
/// copyable; movable (a `no_sync()` guard follows the moved object);
/// destroying it removes the hooks.
///
/// Example (launch: `torchrun --no-python --nproc_per_node=2 ./train`):
/// \code
///   auto pg = lamp::dist::init_process_group();
///   auto model = Net();
///   model->to(pg->device());
///   lamp::DistributedDataParallel ddp(model.ptr(), pg);
///   lamp::optim::FusedAdam optimizer(model->parameters());
///   lamp::GradScaler scaler;
///   for (auto& [x, y] : my_shard_of_the_batches) {
///     optimizer.zero_grad();
///     torch::Tensor loss;
///     {
///       lamp::AutocastGuard autocast(torch::kCUDA);
///       loss = torch::cross_entropy_loss(model->forward(x), y);
///     }
///     scaler.scale(loss).backward(); // gradients averaged over ranks
///     scaler.step(optimizer);
///     scaler.update();
///   }
/// \endcode
class LAMP_API DistributedDataParallel {
 private:
  struct Impl;

 public:
  DistributedDataParallel(
      std::shared_ptr<torch::nn::Module> module,
      std::shared_ptr<dist::ProcessGroup> process_group,
      DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;

  /// RAII guard: backward passes inside its scope do not communicate and
  /// leave the local gradients accumulated in `.grad`; the first backward
  /// after it averages them. Not nestable. The guard refers to the DDP
  /// state, not to the `DistributedDataParallel` object: moving the object
  /// while a guard is alive keeps the moved-to object in `no_sync()` until
  /// the guard ends; destroying it first is harmless.
  class LAMP_API NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard(NoSyncGuard&&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    std::weak_ptr<Impl> impl_;
  };
  /// `auto guard = ddp.no_sync();` as Python's `with ddp.no_sync():`.
  [[nodiscard]] NoSyncGuard no_sync() {
    return NoSyncGuard(*this);
  }

  /// Broadcasts rank 0's buffers to every rank now (stream-ordered).
  void sync_buffers();

  const std::shared_ptr<torch::nn::Module>& module() const;
  const std::shared_ptr<dist::ProcessGroup>& process_group() const;
  const DDPOptions& options() const;
  /// Parameter indices (in registration order) of each bucket, in the order
  /// the buckets are reduced (empty in a world of one).
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  Impl& impl() const;
  std::shared_ptr<Impl> impl_;
};

} // namespace lamp
