#pragma once

// The process group: the ranks of one training job, a store they share and
// the communicator that joins them (NCCL between GPUs, Gloo between CPUs).

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lamp/dist/launch.h>
#include <lamp/export.h>

namespace lamp::detail {
class Reducer;
} // namespace lamp::detail

namespace lamp::dist {

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
/// checked. A watchdog thread aborts the communicator when a collective has
/// not completed `timeout` after it was enqueued, when an NCCL call has
/// been blocked on the host that long (e.g. connecting to a rank that is
/// gone) or when NCCL reports an error; the blocked call and every later
/// call on the group then throw `c10::DistBackendError` saying what
/// happened. Collectives captured in a CUDA graph are watched each time
/// `lamp::GraphedStep` replays the graph.
///
/// On the CPU (hosts without CUDA devices, or `ProcessGroupOptions::backend`
/// "gloo") the communicator is c10d's Gloo: tensors live on the CPU, there
/// are no streams, and `allreduce()`/`broadcast()` return once done. A rank
/// that exits or stops calling collectives makes the others' next
/// collective throw `c10::DistBackendError` (at once when its sockets close,
/// else after `timeout`).
///
/// A world of one process creates no store and no communicator; its
/// collectives do nothing (the result of reducing one rank is its input),
/// so the same program runs with and without a launcher. Not copyable; the
/// destructor waits for outstanding collectives (up to `timeout`) and
/// destroys the communicator, or aborts it.
///
/// Example (launch: `torchrun --no-python --nproc_per_node=2 ./train`):
/// \code
///   auto pg = lamp::dist::init_process_group();
///   auto t = torch::ones({4}, torch::kCUDA) * pg->rank();
///   pg->allreduce(t, lamp::dist::ReduceOp::kSum); // 0 + 1 on both ranks
/// \endcode
class LAMP_API ProcessGroup {
 public:
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ProcessGroup(ProcessGroup&&) = delete;
  ProcessGroup& operator=(ProcessGroup&&) = delete;

  int64_t rank() const;
  int64_t world_size() const;
  int64_t local_rank() const;
  /// How this process was launched and where the ranks met.
  const LaunchConfig& launch_config() const;
  /// This rank's device: `cuda:<local_rank>`; `cuda:0` when the launcher
  /// shows each process only its own GPUs (CUDA_VISIBLE_DEVICES, e.g. Slurm's
  /// `--gpus-per-task=1`) so that the local rank is past the visible ones;
  /// the CPU on a host without CUDA devices.
  c10::Device device() const;
  std::chrono::milliseconds timeout() const;
  /// The store the ranks met on (null in a world of one). Include
  /// <torch/csrc/distributed/c10d/Store.hpp> to use it.
  const c10::intrusive_ptr<c10d::Store>& store() const;
  /// True when `allreduce()` and `broadcast()` work: a world of one, or a
  /// group with a communicator (not `ProcessGroupOptions::nccl(false)`).
  bool has_communicator() const;
  /// The raw `ncclComm_t` (as void*; null in a world of one, without NCCL
  /// or once aborted), for calling NCCL directly.
  void* nccl_comm() const;

  /// Reduces `tensor` (dense, on `device()`) in place across ranks, on
  /// `stream` (a CUDA stream of `device()`; default: the current stream).
  /// On the CPU it returns once done.
  void allreduce(
      const torch::Tensor& tensor,
      ReduceOp op = ReduceOp::kSum,
      std::optional<c10::Stream> stream = std::nullopt);
  /// Overwrites each tensor with rank `root`'s, in one grouped NCCL call
  /// (on the CPU: one Gloo broadcast each, done when this returns).
  void broadcast(
      const std::vector<torch::Tensor>& tensors,
      int64_t root = 0,
      std::optional<c10::Stream> stream = std::nullopt);
  /// Every rank's `value`, indexed by rank, exchanged through the store (a
  /// host operation for small values: names, shapes, flags). Throws
  /// `c10::DistStoreError` when a rank does not take part within the
  /// timeout.
  std::vector<std::string> allgather(const std::string& value);
  /// Returns once every rank has called it (through the store). Throws
  /// `c10::DistStoreError` when a rank does not come within the timeout.
  void barrier();

  /// Throws the watchdog's `c10::DistBackendError` if the communicator was
  /// aborted.
  void check() const;
  /// Aborts the communicator now (other ranks' pending collectives then
  /// time out); later calls throw. For tearing down after an error.
  void abort(const std::string& why = "aborted by the user");

 private:
  // DDP's reducer overlaps the CPU's allreduces with backward: see Note
  // [Collectives on the CPU].
  friend class lamp::detail::Reducer;
  /// On the CPU: starts an allreduce (a sum, or an average) and returns at
  /// once; `wait_started()` waits for every started one. On a GPU it is
  /// `allreduce(tensor, op, stream)`.
  void start_allreduce(
      const torch::Tensor& tensor,
      ReduceOp op,
      const c10::Stream& stream);
  void wait_started();

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Joins the job described by `options` and the launcher's environment
/// (`launch_config`): rendezvous on a c10d::TCPStore, then, with NCCL, sets
/// the current CUDA device to the local rank's, exchanges the ncclUniqueId
/// through the store and creates a blocking NCCL communicator; with Gloo
/// (hosts without CUDA devices), connects the CPU processes. Bounded by
/// `timeout`. Errors are typed: `c10::ValueError` (launch environment,
/// options), `c10::DistStoreError` (rendezvous), `c10::DistBackendError`
/// (NCCL, Gloo). With more than one rank it ignores SIGPIPE if the process
/// has the default action for it (as Python does), so that a peer that
/// exited makes socket writes fail with an error, not end this process.
///
/// Example (launch: `torchrun --no-python --nproc_per_node=2 ./train`,
/// `srun --ntasks-per-node=2 ./train` or
/// `mpirun -np 2 -x MASTER_ADDR=host -x MASTER_PORT=29500 ./train`):
/// \code
///   auto pg = lamp::dist::init_process_group();
///   std::cout << "rank " << pg->rank() << " of " << pg->world_size() << "\n";
/// \endcode
LAMP_API std::shared_ptr<ProcessGroup> init_process_group(
    ProcessGroupOptions options = {});

} // namespace lamp::dist
