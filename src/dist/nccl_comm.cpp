#include "nccl_comm.h"

#include "backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <thread>

namespace lamp::dist::detail {
namespace {

// How long `abort` waits for `call_mutex_` before it concludes that the
// holder is blocked inside NCCL. See Note [Process group threads and locks].
constexpr auto kAbortGrace = std::chrono::seconds(1);

// The outcome of an NCCL call on a helper thread that the caller may stop
// waiting for; shared so that an abandoned helper touches nothing freed.
struct HelperCall {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  bool abandoned = false;
  ncclResult_t result = ncclSuccess;
  ncclComm_t comm = nullptr;
  std::string detail;
};

} // namespace

std::string describe(const Work& work) {
  const auto n = std::to_string(work.sequence);
  switch (work.kind) {
    case Work::Kind::kInit:
      return "creating the NCCL communicator";
    case Work::Kind::kAllreduce:
      return "allreduce #" + n + " (" + op_name(work.op) + ", " +
          std::to_string(work.numel) + " " + c10::toString(work.dtype) + ")";
    case Work::Kind::kBroadcast:
      return "broadcast #" + n + " (" + std::to_string(work.tensors) +
          " tensors from rank " + std::to_string(work.root) + ")";
    case Work::Kind::kGraphReplay:
      return "CUDA graph replay #" + n + " (holding collectives of this group)";
  }
  return "an NCCL call";
}

ncclDataType_t nccl_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kInt:
      return ncclInt32;
    case c10::kLong:
      return ncclInt64;
    case c10::kChar:
      return ncclInt8;
    case c10::kByte:
    case c10::kBool:
      return ncclUint8;
    default:
      TORCH_CHECK(
          false,
          "lamp::dist: NCCL cannot communicate tensors of dtype ",
          type,
          "; use float, half, bfloat16, double, int8, uint8, bool, int32 or "
          "int64.");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

void throw_nccl_error(
    ncclResult_t result,
    NcclComm* comm,
    const std::string& what,
    const char* file,
    int line) {
  if (comm != nullptr && comm->aborted()) {
    comm->throw_error(); // interrupted by the abort: its reason is the news
  }
  // NOTE: ncclGetLastError's argument is unused (and may be freed by a
  // concurrent abort): nullptr.
  const std::string detail = ncclGetLastError(nullptr);
  const std::string message = what + " failed: " + ncclGetErrorString(result) +
      (detail.empty() ? "" : " (" + detail + ")") + " [" + file + ":" +
      std::to_string(line) + "]";
  if (comm != nullptr) {
    comm->abort(message);
    comm->throw_error();
  }
  TORCH_CHECK_WITH(DistBackendError, false, "lamp::dist: ", message);
}

std::unique_ptr<NcclComm> NcclComm::create(
    const ncclUniqueId& id,
    int64_t rank,
    int64_t world_size,
    c10::DeviceIndex device,
    std::chrono::milliseconds timeout) {
  // NOTE: on a helper thread: a blocking communicator's set-up cannot be
  // interrupted, so the caller waits at most `timeout` for it and gives up
  // (the helper then aborts whatever it gets). See Note [Process group
  // threads and locks].
  auto call = std::make_shared<HelperCall>();
  std::thread([call, id, rank, world_size, device] {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
    try {
      c10::cuda::set_device(device);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      ncclUniqueId unique_id = id;
      result = ncclCommInitRankConfig(
          &comm,
          static_cast<int>(world_size),
          unique_id,
          static_cast<int>(rank),
          &config);
    } catch (const std::exception&) {
      result = ncclUnhandledCudaError;
    }
    std::lock_guard<std::mutex> lock(call->mutex);
    if (call->abandoned || result != ncclSuccess) {
      if (comm != nullptr) {
        ncclCommAbort(comm);
        comm = nullptr;
      }
    }
    call->result = result;
    call->comm = comm;
    call->detail = result == ncclSuccess ? "" : ncclGetLastError(nullptr);
    call->done = true;
    call->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mutex);
  if (!call->done_cv.wait_for(lock, timeout, [&] { return call->done; })) {
    call->abandoned = true;
    TORCH_CHECK_WITH(
        DistBackendError,
        false,
        "lamp::dist: rank ",
        rank,
        ": creating the NCCL communicator of ",
        world_size,
        " ranks did not finish within ",
        timeout.count(),
        " ms; a rank probably exited or is stuck before "
        "init_process_group() returned.");
  }
  TORCH_CHECK_WITH(
      DistBackendError,
      call->result == ncclSuccess,
      "lamp::dist: rank ",
      rank,
      ": ncclCommInitRankConfig (",
      world_size,
      " ranks) failed: ",
      ncclGetErrorString(call->result),
      call->detail.empty() ? "" : " (" + call->detail + ")");
  return std::unique_ptr<NcclComm>(new NcclComm(rank, device, call->comm));
}

NcclComm::~NcclComm() {
  if (comm_.load() != nullptr) {
    abort("the process group was destroyed without shutting down");
  }
}

int64_t NcclComm::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

void NcclComm::abort(const std::string& why) noexcept {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!error_.empty()) {
      return;
    }
    error_ = "lamp::dist: rank " + std::to_string(rank_) + ": " + why +
        "; the NCCL communicator was aborted and every later call on this "
        "process group throws. A rank probably exited, crashed or is stuck; "
        "every rank must call the same collectives in the same order.";
    message = error_;
  }
  aborted_.store(true, std::memory_order_release);
  try {
    TORCH_WARN(message);
  } catch (...) { // NOLINT(bugprone-empty-catch): warnings as errors
  }
  std::unique_lock<std::timed_mutex> call(call_mutex_, std::defer_lock);
  // See Note [Process group threads and locks]: without the lock after the
  // grace period, a thread is blocked inside NCCL and this interrupts it.
  (void)call.try_lock_for(kAbortGrace);
  if (ncclComm_t comm = comm_.exchange(nullptr)) {
    (void)ncclCommAbort(comm);
  }
}

void NcclComm::throw_error() const {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    message = error_;
  }
  TORCH_INTERNAL_ASSERT(!message.empty(), "throw_error() before an abort");
  TORCH_CHECK_WITH(DistBackendError, false, message);
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

std::optional<Work> NcclComm::call_in_flight_since(
    Clock::time_point since) const {
  const int64_t start = call_since_ns_.load(std::memory_order_acquire);
  const int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            since.time_since_epoch())
                            .count();
  if (start == 0 || start > limit) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(state_mutex_);
  return call_work_;
}

std::optional<std::string> NcclComm::async_error() {
  std::unique_lock<std::timed_mutex> call(call_mutex_, std::try_to_lock);
  ncclComm_t comm = comm_.load(std::memory_order_acquire);
  if (!call.owns_lock() || comm == nullptr) {
    return std::nullopt;
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
  if (result != ncclSuccess) {
    state = result;
  }
  if (state == ncclSuccess || state == ncclInProgress) {
    return std::nullopt;
  }
  const std::string detail = ncclGetLastError(nullptr);
  return std::string("NCCL reported an asynchronous error: ") +
      ncclGetErrorString(state) + (detail.empty() ? "" : " (" + detail + ")");
}

void NcclComm::shutdown(Clock::time_point deadline) noexcept {
  ncclComm_t comm = comm_.load();
  if (comm == nullptr || aborted()) {
    return;
  }
  // NOTE: a blocking ncclCommFinalize waits for the other ranks' work; on a
  // helper thread so that a dead peer costs at most until `deadline`.
  std::shared_ptr<HelperCall> call;
  try {
    call = std::make_shared<HelperCall>();
    std::thread([call, comm, device = device_] {
      ncclResult_t result = ncclUnhandledCudaError;
      try {
        c10::cuda::set_device(device); // a new thread starts on device 0
        result = ncclCommFinalize(comm);
      } catch (const std::exception&) { // NOLINT(bugprone-empty-catch)
      }
      std::lock_guard<std::mutex> lock(call->mutex);
      call->result = result;
      call->done = true;
      call->done_cv.notify_all();
    }).detach();
  } catch (...) {
    abort("shutting down: could not start the finalizing thread");
    return;
  }
  std::string failure;
  {
    std::unique_lock<std::mutex> lock(call->mutex);
    if (!call->done_cv.wait_until(lock, deadline, [&] { return call->done; })) {
      call->abandoned = true;
      failure = "did not finish in time";
    } else if (call->result != ncclSuccess) {
      failure = std::string("failed: ") + ncclGetErrorString(call->result);
    }
  }
  if (!failure.empty()) {
    abort("shutting down: ncclCommFinalize " + failure);
    return;
  }
  comm_.store(nullptr);
  (void)ncclCommDestroy(comm);
}

} // namespace lamp::dist::detail
