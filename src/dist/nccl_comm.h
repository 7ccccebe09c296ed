#pragma once

// Internal, NCCL builds only: one NCCL communicator that another thread can
// abort, the checked-call macro, and the dtype/op maps.

#include <lamp/dist/process_group.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

// Note [Process group threads and locks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Threads: collectives are called by the user's threads and by autograd's
// device threads (DDP's gradient hooks run there); each process group of
// several ranks has one watchdog thread (watchdog.cpp). Communicator set-up
// and graceful shutdown each run on a short-lived helper thread so that the
// caller can give up after the timeout (a blocking ncclCommInitRankConfig
// or ncclCommFinalize cannot be interrupted otherwise).
//
// Locks of NcclComm:
// - `call_mutex_` (timed) serialises every NCCL call on the communicator
//   (NCCL communicators are not thread-safe). It is held only while NCCL is
//   called (`run`), never while work runs on the device, and never together
//   with the watchdog's own mutex.
// - `state_mutex_` guards the abort message and the description of the
//   call in flight; held for a few instructions.
// - `aborted_` (atomic) is set, after the message, by the first `abort`.
//   `run` checks it under `call_mutex_` before calling NCCL.
//
// Aborting (`abort`, from the watchdog, a failed call or the user): set
// `aborted_`, then take `call_mutex_` with a grace period and call
// ncclCommAbort. Holding the lock means no thread is between its check of
// `aborted_` and an NCCL call, so none can use the freed communicator. Not
// getting it within the grace period means a thread has been inside an
// NCCL call all that time, i.e. blocked there on the host (e.g. lazily
// connecting to a rank that is gone); ncclCommAbort from another thread is
// how NCCL interrupts a blocking communicator stuck in a call, so the abort
// goes ahead without the lock, and the interrupted call returns an error
// that `run`'s caller reports with the abort's message. No lock is ever
// held across an NCCL call that the watchdog would need to abort it.

namespace lamp::dist::detail {

using Clock = std::chrono::steady_clock;

/// What an NCCL call was for, for messages. Plain data: made on every
/// collective without allocating; `describe` builds the text on failure.
struct Work {
  enum class Kind : uint8_t { kInit, kAllreduce, kBroadcast, kGraphReplay };
  Kind kind = Kind::kInit;
  uint64_t sequence = 0;
  int64_t numel = 0; // of the tensor (allreduce)
  int64_t tensors = 0; // broadcast
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  ReduceOp op = ReduceOp::kSum;
  int64_t root = 0;
};

/// "allreduce #12 (avg, 1024 Float)", "broadcast #3 (2 tensors from rank
/// 0)", "CUDA graph replay #7 (holding collectives of this group)".
std::string describe(const Work& work);

/// NCCL's dtype for `type`; throws `c10::Error` for a dtype NCCL lacks.
ncclDataType_t nccl_dtype(c10::ScalarType type);
ncclRedOp_t nccl_op(ReduceOp op);

class NcclComm;

/// Throws the `c10::DistBackendError` for a failed NCCL call: `what`
/// failed with ncclGetErrorString(result) and ncclGetLastError's detail.
/// With `comm`, the communicator is aborted first (a failed call leaves it
/// unusable), or, if it already was (the call was interrupted), the abort's
/// message is thrown.
[[noreturn]] void throw_nccl_error(
    ncclResult_t result,
    NcclComm* comm,
    const std::string& what,
    const char* file,
    int line);

} // namespace lamp::dist::detail

/// Checks the `ncclResult_t` of `cmd`, an NCCL call (or `NcclComm::run`);
/// `comm` is the `NcclComm*` it used or nullptr, `what` (evaluated only on
/// failure) says what it was for. See `throw_nccl_error`.
#define LAMP_NCCL_CHECK(cmd, comm, what)                          \
  do {                                                            \
    const ncclResult_t lamp_nccl_result_ = (cmd);                 \
    if (C10_UNLIKELY(lamp_nccl_result_ != ncclSuccess)) {         \
      ::lamp::dist::detail::throw_nccl_error(                     \
          lamp_nccl_result_, (comm), (what), __FILE__, __LINE__); \
    }                                                             \
  } while (0)

namespace lamp::dist::detail {

/// One blocking NCCL communicator. See Note [Process group threads and
/// locks].
class NcclComm {
 public:
  /// Joins the communicator `id` as rank `rank` of `world_size` on CUDA
  /// device `device` (blocking mode). Throws `c10::DistBackendError` if
  /// that fails or takes longer than `timeout`.
  static std::unique_ptr<NcclComm> create(
      const ncclUniqueId& id,
      int64_t rank,
      int64_t world_size,
      c10::DeviceIndex device,
      std::chrono::milliseconds timeout);

  /// Aborts the communicator if `shutdown` has not released it.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// Calls `f(comm)`, one or more NCCL calls on the communicator, with
  /// `call_mutex_` held and `work` marked as in flight; returns its result
  /// (check it with LAMP_NCCL_CHECK). Throws the abort's
  /// `c10::DistBackendError` instead once aborted.
  template <typename F>
  ncclResult_t run(const Work& work, F&& f) {
    std::lock_guard<std::timed_mutex> lock(call_mutex_);
    if (C10_UNLIKELY(aborted())) {
      throw_error();
    }
    {
      std::lock_guard<std::mutex> state(state_mutex_);
      call_work_ = work;
    }
    call_since_ns_.store(now_ns(), std::memory_order_release);
    const ncclResult_t result = f(comm_.load(std::memory_order_relaxed));
    call_since_ns_.store(0, std::memory_order_release);
    return result;
  }

  /// Aborts the communicator (any thread; idempotent: the first reason is
  /// kept and warned about once).
  void abort(const std::string& why) noexcept;
  bool aborted() const {
    return aborted_.load(std::memory_order_acquire);
  }
  /// Throws `c10::DistBackendError` with the abort's message.
  [[noreturn]] void throw_error() const;

  /// The NCCL call in flight since before `since`, if any (watchdog).
  std::optional<Work> call_in_flight_since(Clock::time_point since) const;
  /// ncclCommGetAsyncError as a message, when it reports an error
  /// (watchdog). Skips the check while another thread is calling NCCL.
  std::optional<std::string> async_error();

  /// Finalizes and destroys the communicator, or aborts it when that does
  /// not finish by `deadline`. For the owner, once nothing else uses it.
  void shutdown(Clock::time_point deadline) noexcept;

  int64_t rank() const {
    return rank_;
  }
  void* handle() const {
    return comm_.load(std::memory_order_acquire);
  }

 private:
  NcclComm(int64_t rank, c10::DeviceIndex device, ncclComm_t comm)
      : rank_(rank), device_(device), comm_(comm) {}
  static int64_t now_ns();

  const int64_t rank_;
  const c10::DeviceIndex device_;
  std::atomic<ncclComm_t> comm_;
  std::timed_mutex call_mutex_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex state_mutex_; // guards error_, call_work_
  std::string error_;
  Work call_work_;
  std::atomic<int64_t> call_since_ns_{0}; // 0: no call in flight
};

} // namespace lamp::dist::detail
