#include "watchdog.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

namespace lamp::dist::detail {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);

bool capture_related(cudaError_t status) {
  return status >= cudaErrorStreamCaptureUnsupported &&
      status <= cudaErrorStreamCaptureWrongThread;
}

} // namespace

Watchdog::Watchdog(
    NcclComm& comm,
    c10::DeviceIndex device,
    std::chrono::milliseconds timeout)
    : comm_(comm), device_(device), timeout_(timeout), ring_(64) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop_and_drain(Clock::now());
  for (auto event : free_events_) {
    (void)cudaEventDestroy(event);
  }
}

void Watchdog::push_locked(const Pending& pending) {
  if (size_ == ring_.size()) {
    std::vector<Pending> bigger(ring_.size() * 2);
    for (size_t i = 0; i < size_; ++i) {
      bigger[i] = ring_[(head_ + i) % ring_.size()];
    }
    ring_ = std::move(bigger);
    head_ = 0;
  }
  ring_[(head_ + size_) % ring_.size()] = pending;
  ++size_;
}

void Watchdog::pop_locked() {
  head_ = (head_ + 1) % ring_.size();
  --size_;
}

void Watchdog::watch(cudaStream_t stream, const Work& work) {
  if (comm_.aborted()) {
    return; // nothing will run; the next call throws
  }
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (event == nullptr) {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  const auto status = cudaEventRecord(event, stream);
  if (status != cudaSuccess) {
    (void)cudaEventDestroy(event);
    C10_CUDA_CHECK(status);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  push_locked({event, Clock::now() + timeout_, work});
}

std::string Watchdog::check_pending_locked(Clock::time_point now) {
  while (size_ > 0) {
    auto& p = front_locked();
    const auto status = cudaEventQuery(p.event);
    if (status == cudaSuccess) {
      free_events_.push_back(p.event);
      pop_locked();
      continue;
    }
    std::string fault;
    if (status != cudaErrorNotReady && !capture_related(status)) {
      fault = describe(p.work) +
          " failed on the device: " + cudaGetErrorString(status);
    } else if (now > p.deadline) {
      fault = describe(p.work) + " did not complete within " +
          std::to_string(timeout_.count()) + " ms";
    }
    (void)cudaGetLastError();
    return fault;
  }
  return "";
}

void Watchdog::run() {
  // NOTE: see Note [Watching collectives]: relaxed capture mode, and the
  // group's device so that no context is created on device 0.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, kPollInterval);
    if (stop_ || comm_.aborted()) {
      continue;
    }
    const auto now = Clock::now();
    std::string fault = check_pending_locked(now);
    lock.unlock();
    if (fault.empty()) {
      if (const auto stuck = comm_.call_in_flight_since(now - timeout_)) {
        fault = describe(*stuck) +
            " has been blocked inside NCCL on the host for more than " +
            std::to_string(timeout_.count()) +
            " ms (e.g. connecting to a rank that is gone or never called it)";
      }
    }
    if (fault.empty()) {
      fault = comm_.async_error().value_or("");
    }
    if (!fault.empty()) {
      comm_.abort(fault);
    }
    lock.lock();
    if (comm_.aborted()) {
      // The aborted work's events complete or are re-recorded later.
      while (size_ > 0) {
        free_events_.push_back(front_locked().event);
        pop_locked();
      }
    }
  }
}

bool Watchdog::stop_and_drain(Clock::time_point deadline) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  bool done = true;
  while (size_ > 0) {
    auto& p = front_locked();
    while (done && cudaEventQuery(p.event) == cudaErrorNotReady) {
      if (Clock::now() > deadline) {
        done = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)cudaGetLastError();
    free_events_.push_back(p.event);
    pop_locked();
  }
  return done;
}

} // namespace lamp::dist::detail
