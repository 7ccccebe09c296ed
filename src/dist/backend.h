#pragma once

// Internal: what a ProcessGroup of several ranks needs from its
// communicator, the registry through which lamp::GraphedStep finds the
// communicators whose collectives a CUDA graph holds, and the store-error
// helper both sides use.

#include <lamp/dist/process_group.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
} // namespace c10d

namespace lamp::dist::detail {

/// The collectives of a process group (NCCL between GPUs: nccl_backend.cpp;
/// Gloo between CPUs: gloo_backend.cpp). Owned
/// by a `std::shared_ptr` so that the capture registry can hold weak
/// references. See Note [Process group threads and locks].
class Backend : public std::enable_shared_from_this<Backend> {
 public:
  virtual ~Backend() = default;
  /// Enqueues an in-place allreduce of `tensor` on `stream` (a CUDA stream
  /// of the group's device). Throws `c10::DistBackendError` once aborted.
  virtual void allreduce(
      const at::Tensor& tensor,
      ReduceOp op,
      const c10::Stream& stream) = 0;
  /// Enqueues a broadcast of each of `tensors` from `root`, grouped.
  virtual void broadcast(
      const std::vector<at::Tensor>& tensors,
      int64_t root,
      const c10::Stream& stream) = 0;
  /// Waits until the collectives enqueued so far are done (CPU backends,
  /// whose collectives run on their own threads: see Note [Collectives on
  /// the CPU]); a device backend's work is ordered by streams instead.
  virtual void synchronize() {}
  /// Throws the `c10::DistBackendError` of the abort, if there was one.
  virtual void check() const = 0;
  /// Aborts the communicator (any thread; the first reason wins).
  virtual void abort(const std::string& why) = 0;
  /// The raw communicator, or null once aborted.
  virtual void* native_handle() const = 0;
  /// Called by GraphedStep after each replay of a CUDA graph that holds
  /// this group's collectives: watches the work the replay enqueued on
  /// `stream` like an eager collective. See Note [Watching collectives].
  virtual void watch_replay(const c10::Stream& stream) = 0;
};

/// "sum", "avg" or "max", for messages.
inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

/// What `make_nccl_backend` needs from the process group.
struct BackendOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  c10::Device device{c10::kCPU};
  std::chrono::milliseconds timeout{0};
  c10d::Store* store = nullptr;
  /// Store key under which rank 0 publishes the ncclUniqueId (Gloo: the
  /// prefix of its connection keys).
  std::string unique_id_key;
  /// The process group's store barrier.
  std::function<void()> barrier;
};

/// An NCCL communicator over the ranks of `options`. Defined in
/// nccl_backend.cpp, which is compiled only when lamp has NCCL.
std::shared_ptr<Backend> make_nccl_backend(const BackendOptions& options);

/// Gloo's collectives between the CPU processes of `options`. Defined in
/// gloo_backend.cpp, which is compiled only when lamp has Gloo.
std::shared_ptr<Backend> make_gloo_backend(const BackendOptions& options);

/// Records that `backend` enqueued a collective on a stream that is
/// capturing the CUDA graph capture `capture_id` (any thread: DDP's hooks
/// run on autograd's device threads). See Note [Watching collectives].
void note_captured_collective(
    unsigned long long capture_id,
    const std::weak_ptr<Backend>& backend);

/// The backends noted for `capture_id`, each once; the registry forgets
/// them. Called once a capture has ended (or failed).
std::vector<std::weak_ptr<Backend>> take_captured_collectives(
    unsigned long long capture_id);

/// Runs `op` (an operation on the store) and turns any failure into a
/// `c10::DistStoreError` that says what rank `rank` was doing (`what`).
template <typename Op>
auto store_op(int64_t rank, const std::string& what, Op&& op)
    -> decltype(op()) {
  try {
    return op();
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    TORCH_CHECK_WITH(
        DistStoreError,
        false,
        "lamp::dist: rank ",
        rank,
        ": ",
        what,
        ": ",
        error ? error->what_without_backtrace() : e.what());
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

} // namespace lamp::dist::detail
