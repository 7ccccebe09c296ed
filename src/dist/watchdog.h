#pragma once

// Internal, NCCL builds only: the thread that turns a hung or failed
// collective into an abort of the communicator.

#include "nccl_comm.h"

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

// Note [Watching collectives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Which stream orders what: a collective is enqueued on the caller's CUDA
// stream and returns; right after it (same thread, no host sync), the
// group records a CUDA event on that stream and hands it to the watchdog
// with a deadline (now + timeout). Streams are FIFO, so the event completes
// when the collective and everything before it on that stream has.
//
// The watchdog thread wakes every 100 ms and, holding only its own mutex
// while it looks at the queue, checks in order:
//   1. the oldest pending event: completed -> recycled; an error ->
//      fault; past its deadline -> fault ("did not complete within");
//   2. an NCCL call blocked on the host for longer than the timeout
//      (`NcclComm::call_in_flight_since`) -> fault;
//   3. ncclCommGetAsyncError -> fault.
// A fault aborts the communicator (`NcclComm::abort`, after the watchdog's
// mutex is released). The thread runs in relaxed stream-capture mode: its
// cudaEventQuery calls must not invalidate a CUDA graph that another
// thread is capturing.
//
// CUDA graphs: a collective enqueued on a capturing stream runs only when
// the graph is replayed, so it is not watched then. Instead the group notes
// itself in a registry under the capture's id (capture_registry.cpp; keyed
// by id, not thread: DDP's hooks enqueue from autograd's threads). After
// capture_end GraphedStep takes the groups noted for its capture; before
// each replay it checks them (an aborted group throws: its communicator is
// gone, and the graph holds it), and after each replay it calls
// `Backend::watch_replay` with its stream, which records an event after the
// replay and watches it like an eager collective. So a rank that dies
// during graphed training makes the others' replays miss their deadline,
// the watchdog aborts, NCCL's kernels return, and the next step throws.

namespace lamp::dist::detail {

/// One process group's watchdog thread. See Note [Watching collectives].
class Watchdog {
 public:
  /// Starts the thread, which aborts `comm` (it must outlive the watchdog)
  /// on a fault. `device` is the group's CUDA device.
  Watchdog(
      NcclComm& comm,
      c10::DeviceIndex device,
      std::chrono::milliseconds timeout);
  /// Stops the thread (see `stop_and_drain`).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Watches `work`, just enqueued on `stream` (not capturing): it must
  /// complete within the timeout. No host sync; no allocation once warm.
  void watch(cudaStream_t stream, const Work& work);

  /// Stops the thread, then waits until `deadline` for the pending work;
  /// true if all of it completed.
  bool stop_and_drain(Clock::time_point deadline) noexcept;

 private:
  struct Pending {
    cudaEvent_t event = nullptr;
    Clock::time_point deadline;
    Work work;
  };

  void run();
  // Step 1 of the Note, with mutex_ held; a fault's message or "".
  std::string check_pending_locked(Clock::time_point now);
  void push_locked(const Pending& pending);
  Pending& front_locked() {
    return ring_[head_];
  }
  void pop_locked();

  NcclComm& comm_;
  const c10::DeviceIndex device_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_; // guards all below but thread_
  std::condition_variable wake_;
  bool stop_ = false;
  // Pending work, oldest first: a ring that only grows (no allocation in
  // steady state).
  std::vector<Pending> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
  std::vector<cudaEvent_t> free_events_;
  std::thread thread_;
};

} // namespace lamp::dist::detail
