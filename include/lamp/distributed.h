#pragma once

// Data-parallel training over NCCL, launched like PyTorch's
// (`torchrun --no-python --nproc_per_node=N ./program`, env:// rendezvous):
// a process group (`lamp::dist::init_process_group`) and
// `lamp::DistributedDataParallel`, which averages gradients across ranks
// while backward runs.

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lamp/export.h>

namespace lamp::dist {

/// How to join the process group. Every field left unset is read from the
/// environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT).
struct LAMP_API ProcessGroupOptions {
  /// This process's rank in [0, world_size). Default: $RANK.
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  /// Number of processes. Default: $WORLD_SIZE, or 1 when neither it nor
  /// $RANK is set (a plain, non-distributed run).
  TORCH_ARG(std::optional<int64_t>, world_size) = std::nullopt;
  /// Rank on this host, which picks the CUDA device. Default: $LOCAL_RANK,
  /// else the rank.
  TORCH_ARG(std::optional<int64_t>, local_rank) = std::nullopt;
  /// Host of rank 0's store. Default: $MASTER_ADDR.
  TORCH_ARG(std::string, master_addr) = "";
  /// Port of rank 0's store. Default: $MASTER_PORT.
  TORCH_ARG(std::optional<int64_t>, master_port) = std::nullopt;
  /// How long rendezvous, communicator set-up and each collective may take
  /// before they fail. A collective still running after this long aborts
  /// the communicator; the next call on the group then throws on every
  /// rank still alive. Default: 10 minutes.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
};

/// Where this process stands, after options and environment are merged and
/// checked.
struct LAMP_API LaunchConfig {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int64_t master_port = 0;
  /// torchrun's agent already runs the store (TORCHELASTIC_USE_AGENT_STORE):
  /// every rank, rank 0 included, connects to it as a client.
  bool agent_store = false;
  /// torchrun's restart count, part of the store's key prefix.
  std::string restart_count = "0";
};

/// Merges `options` with the launch environment and checks the result.
/// Missing or inconsistent values throw `c10::Error` naming the variable and
/// how to launch, e.g. "WORLD_SIZE is 2 but RANK is not set; launch with
/// `torchrun --no-python --nproc_per_node=2 ./program`".
LAMP_API LaunchConfig launch_config(const ProcessGroupOptions& options = {});

/// The key-value store all ranks share: rank 0 serves a c10d::TCPStore at
/// master_addr:master_port (or torchrun's agent does), the others connect.
/// Blocks until every rank has joined or `timeout` passes (then throws).
/// Keys are prefixed as torch.distributed's env:// rendezvous does under
/// torchrun. Not needed (and not created) when world_size is 1.
LAMP_API c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout);

/// Reduction of `ProcessGroup::allreduce`.
enum class ReduceOp { kSum, kAvg, kMax };

/// The ranks of one training job and the NCCL communicator that joins their
/// GPUs, one GPU (the local rank's) per process. Made by
/// `init_process_group()`.
///
/// Collectives are enqueued on the CUDA stream the caller passes (by
/// default the current stream) and return at once: they are ordered like
/// any other work on that stream and never synchronise the host. Every rank
/// must call the same collectives in the same order. Every NCCL call is
/// checked; a collective that has not completed `timeout` after it was
/// enqueued (a rank died or took another path) makes a watchdog thread
/// abort the communicator, and every later call on the group throws
/// `c10::Error` saying what timed out.
///
/// A world of one process creates no store and no communicator; its
/// collectives do nothing (the result of reducing one rank is its input),
/// so the same program runs with and without torchrun. Not copyable; the
/// destructor waits for outstanding collectives (up to `timeout`) and
/// destroys the communicator, or aborts it.
class LAMP_API ProcessGroup {
 public:
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ProcessGroup(ProcessGroup&&) = delete;
  ProcessGroup& operator=(ProcessGroup&&) = delete;

  int64_t rank() const {
    return config_.rank;
  }
  int64_t world_size() const {
    return config_.world_size;
  }
  int64_t local_rank() const {
    return config_.local_rank;
  }
  /// This rank's device: `cuda:<local_rank>`, or the CPU in a world of one
  /// without CUDA.
  c10::Device device() const {
    return device_;
  }
  std::chrono::milliseconds timeout() const {
    return options_.timeout();
  }
  /// The store the ranks met on (null in a world of one).
  const c10::intrusive_ptr<c10d::Store>& store() const {
    return store_;
  }
  /// The raw `ncclComm_t` (as void*; null in a world of one), for calling
  /// NCCL directly.
  void* nccl_comm() const;

  /// Reduces `tensor` (contiguous, on `device()`) in place across ranks.
  void allreduce(
      const torch::Tensor& tensor,
      ReduceOp op = ReduceOp::kSum,
      std::optional<c10::Stream> stream = std::nullopt);
  /// Overwrites each tensor with rank `root`'s, in one grouped NCCL call.
  void broadcast(
      const std::vector<torch::Tensor>& tensors,
      int64_t root = 0,
      std::optional<c10::Stream> stream = std::nullopt);
  /// Every rank's `value`, indexed by rank, exchanged through the store (a
  /// host operation for small values: names, shapes, flags).
  std::vector<std::string> allgather(const std::string& value);
  /// Returns once every rank has called it (through the store).
  void barrier();

  /// Throws the watchdog's error if the communicator was aborted.
  void check() const;
  /// Aborts the communicator now (other ranks' pending collectives then
  /// time out); later calls throw. For tearing down after an error.
  void abort(const std::string& why = "aborted by the user");

  struct Impl; // NCCL state, defined in distributed.cpp

 private:
  std::string next_key(const char* what);

  ProcessGroupOptions options_;
  LaunchConfig config_;
  c10::Device device_{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t store_sequence_ = 0;
  std::unique_ptr<Impl> impl_;
};

/// Joins the job described by `options` and the torchrun environment:
/// rendezvous on a c10d::TCPStore, sets the current CUDA device to the
/// local rank's, exchanges the ncclUniqueId through the store and creates
/// the NCCL communicator (non-blocking, bounded by `timeout`).
///
/// Example (launch: `torchrun --no-python --nproc_per_node=2 ./train`):
/// \code
///   auto pg = lamp::dist::init_process_group();
///   auto t = torch::ones({4}, torch::kCUDA) * pg->rank();
///   pg->allreduce(t, lamp::dist::ReduceOp::kSum); // 0 + 1 on both ranks
/// \endcode
LAMP_API std::shared_ptr<ProcessGroup> init_process_group(
    ProcessGroupOptions options = {});

} // namespace lamp::dist

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
/// broadcast. Parameters are grouped in reverse registration order into
/// buckets (`first_bucket_cap_mb`, then `bucket_cap_mb`). A hook after each
/// gradient's accumulation copies it into its bucket; once a bucket is
/// complete its allreduce (average) starts on a dedicated NCCL stream while
/// backward goes on. Buckets are reduced in the same order on every rank.
/// When backward ends, an autograd-engine callback makes the caller's
/// stream wait for the reductions and writes the averages back into
/// `.grad`. No host sync anywhere (unless `find_unused_parameters`).
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
/// A world of one process makes `DistributedDataParallel` a no-op.
/// Not copyable; destroying it removes the hooks.
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
  /// after it averages them. Not nestable.
  class LAMP_API NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard(NoSyncGuard&&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel& ddp_;
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
  /// the buckets are reduced.
  std::vector<std::vector<size_t>> bucket_indices() const;

  struct Impl; // buckets and hooks, defined in distributed.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp
