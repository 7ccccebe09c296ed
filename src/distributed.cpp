#include <lamp/distributed.h>

#include <lamp/config.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/_foreach_copy.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif
#if LAMP_WITH_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

namespace lamp::dist {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

std::string launch_hint(int64_t world_size) {
  return "launch with `torchrun --no-python --nproc_per_node=" +
      std::to_string(world_size > 1 ? world_size : 2) +
      " ./program` (single host), or set RANK, WORLD_SIZE, LOCAL_RANK, "
      "MASTER_ADDR and MASTER_PORT for every process";
}

// `option` if set, else the integer in environment variable `name`.
std::optional<int64_t> integer(
    const std::optional<int64_t>& option,
    const char* name) {
  if (option) {
    return option;
  }
  const auto text = env(name);
  if (!text) {
    return std::nullopt;
  }
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(
      used == text->size(),
      "lamp::dist: environment variable ",
      name,
      "='",
      *text,
      "' is not an integer.");
  return value;
}

} // namespace

LaunchConfig launch_config(const ProcessGroupOptions& options) {
  LaunchConfig config;
  const auto rank = integer(options.rank(), "RANK");
  const auto world_size = integer(options.world_size(), "WORLD_SIZE");
  if (!rank && !world_size) {
    return config; // a plain run: one process, no rendezvous
  }
  const int64_t size = world_size.value_or(0);
  TORCH_CHECK(
      world_size,
      "lamp::dist: RANK is ",
      *rank,
      " but WORLD_SIZE is not set; ",
      launch_hint(0),
      ".");
  TORCH_CHECK(
      size >= 1, "lamp::dist: WORLD_SIZE must be >= 1, got ", size, ".");
  TORCH_CHECK(
      rank,
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but RANK is not set; ",
      launch_hint(size),
      ".");
  TORCH_CHECK(
      0 <= *rank && *rank < size,
      "lamp::dist: RANK is ",
      *rank,
      " but WORLD_SIZE is ",
      size,
      "; RANK must be in [0, WORLD_SIZE).");
  config.rank = *rank;
  config.world_size = size;
  config.local_rank =
      integer(options.local_rank(), "LOCAL_RANK").value_or(config.rank);
  TORCH_CHECK(
      0 <= config.local_rank && config.local_rank <= config.rank,
      "lamp::dist: LOCAL_RANK is ",
      config.local_rank,
      " but RANK is ",
      config.rank,
      "; LOCAL_RANK must be in [0, RANK].");
  if (size == 1) {
    return config;
  }
  config.master_addr = options.master_addr().empty()
      ? env("MASTER_ADDR").value_or("")
      : options.master_addr();
  TORCH_CHECK(
      !config.master_addr.empty(),
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but MASTER_ADDR is not set; ",
      launch_hint(size),
      ".");
  const auto port = integer(options.master_port(), "MASTER_PORT");
  TORCH_CHECK(
      port,
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but MASTER_PORT is not set; ",
      launch_hint(size),
      ".");
  TORCH_CHECK(
      0 < *port && *port < 65536,
      "lamp::dist: MASTER_PORT must be in [1, 65535], got ",
      *port,
      ".");
  config.master_port = *port;
  config.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
  config.restart_count = env("TORCHELASTIC_RESTART_COUNT").value_or("0");
  return config;
}

c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK(
      config.world_size > 1,
      "lamp::dist::rendezvous: a world of one process needs no store.");
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(config.master_port);
  options.numWorkers = config.world_size;
  options.timeout = timeout;
  // NOTE: as torch.distributed's env:// rendezvous: under torchrun the
  // agent already serves the store and every worker is a client of it,
  // under a per-restart prefix; otherwise rank 0 serves it.
  if (config.agent_store) {
    options.isServer = false;
    options.waitWorkers = false;
    auto store =
        c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + config.restart_count, store);
  }
  options.isServer = config.rank == 0;
  options.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
}

// ---------------------------------------------------------------------------
// ProcessGroup

namespace {

using Clock = std::chrono::steady_clock;

std::string bytes_to_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> string_to_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

} // namespace

#if LAMP_WITH_NCCL
namespace {

ncclDataType_t nccl_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kDouble:
      return ncclFloat64;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
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

const char* op_name(ReduceOp op) {
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

} // namespace

// The communicator and its watchdog. `mutex` serialises every NCCL call on
// `comm` with the watchdog's abort; collectives hold it only while they are
// enqueued, never while they run on the device.
struct ProcessGroup::Impl {
  struct Pending {
    cudaEvent_t event;
    Clock::time_point deadline;
    std::string what;
  };

  Impl(int64_t rank, std::chrono::milliseconds timeout)
      : rank(rank), timeout(timeout) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    if (watchdog.joinable()) {
      watchdog.join();
    }
    shutdown();
    for (auto event : free_events) {
      cudaEventDestroy(event);
    }
  }

  // Waits (bounded) for outstanding collectives, then finalizes and
  // destroys the communicator; aborts it when that does not finish in time.
  void shutdown() noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    if (comm == nullptr) {
      return;
    }
    const auto deadline = Clock::now() + timeout;
    bool done = true;
    for (auto& p : pending) {
      while (cudaEventQuery(p.event) == cudaErrorNotReady) {
        if (Clock::now() > deadline) {
          done = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      (void)cudaGetLastError();
      cudaEventDestroy(p.event);
    }
    pending.clear();
    if (done) {
      ncclResult_t state = ncclCommFinalize(comm);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ncclCommGetAsyncError(comm, &state);
      }
      done = state == ncclSuccess;
    }
    if (done) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
    comm = nullptr;
  }

  // Throws if `result` is an error; waits, up to the timeout, while the
  // non-blocking communicator reports the call as still in progress.
  void check_locked(ncclResult_t result, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    while (result == ncclInProgress) {
      if (Clock::now() > deadline) {
        abort_locked(
            what + " did not get going within " +
            std::to_string(timeout.count()) + " ms");
        TORCH_CHECK(false, error);
      }
      std::this_thread::yield();
      ncclCommGetAsyncError(comm, &result);
    }
    if (result != ncclSuccess) {
      const std::string detail = ncclGetLastError(comm);
      abort_locked(
          what + " failed: " + ncclGetErrorString(result) +
          (detail.empty() ? "" : " (" + detail + ")"));
      TORCH_CHECK(false, error);
    }
  }

  void check_alive_locked() const {
    TORCH_CHECK(error.empty(), error);
    TORCH_CHECK(
        comm != nullptr, "lamp::dist: the process group was shut down.");
  }

  // Remembers that the work just enqueued on `stream` must complete within
  // the timeout. Not during CUDA graph capture: the captured work runs at
  // replay.
  void track_locked(cudaStream_t stream, std::string what) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
      return;
    }
    cudaEvent_t event = nullptr;
    if (free_events.empty()) {
      C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = free_events.back();
      free_events.pop_back();
    }
    C10_CUDA_CHECK(cudaEventRecord(event, stream));
    pending.push_back({event, Clock::now() + timeout, std::move(what)});
  }

  void abort_locked(const std::string& why) {
    if (error.empty()) {
      error = "lamp::dist: rank " + std::to_string(rank) + ": " + why +
          "; the NCCL communicator was aborted and every later call on this "
          "process group throws. A rank probably exited, crashed or is "
          "stuck; every rank must call the same collectives in the same "
          "order.";
      std::cerr << error << std::endl;
    }
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    for (auto& p : pending) {
      cudaEventDestroy(p.event);
    }
    pending.clear();
  }

  void watch() {
    // NOTE: while another thread captures a CUDA graph in the (default)
    // global mode, "unsafe" calls such as cudaEventQuery from this thread
    // would fail and invalidate the capture; relaxed mode allows them here.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      wake.wait_for(lock, std::chrono::milliseconds(100));
      if (comm == nullptr) {
        continue;
      }
      while (!pending.empty()) {
        auto& p = pending.front();
        const auto status = cudaEventQuery(p.event);
        if (status == cudaSuccess) {
          free_events.push_back(p.event);
          pending.pop_front();
          continue;
        }
        const bool capture_related =
            status >= cudaErrorStreamCaptureUnsupported &&
            status <= cudaErrorStreamCaptureWrongThread;
        if (status != cudaErrorNotReady && !capture_related) {
          abort_locked(
              p.what + " failed on the device: " + cudaGetErrorString(status));
        } else if (Clock::now() > p.deadline) {
          abort_locked(
              p.what + " did not complete within " +
              std::to_string(timeout.count()) + " ms");
        } else {
          (void)cudaGetLastError();
        }
        break;
      }
      if (comm != nullptr) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          abort_locked(
              std::string("NCCL reported an asynchronous error: ") +
              ncclGetErrorString(state) + " (" + ncclGetLastError(comm) + ")");
        }
      }
    }
  }

  int64_t rank;
  std::chrono::milliseconds timeout;
  ncclComm_t comm = nullptr;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::string error;
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> free_events;
  uint64_t sequence = 0;
  std::thread watchdog;
};
#else
struct ProcessGroup::Impl {};
#endif

ProcessGroup::ProcessGroup(ProcessGroupOptions options)
    : options_(std::move(options)), config_(launch_config(options_)) {
  TORCH_CHECK(
      options_.timeout().count() > 0,
      "lamp::dist::ProcessGroupOptions::timeout must be > 0, got ",
      options_.timeout().count(),
      " ms.");
  const auto devices = static_cast<int64_t>(torch::cuda::device_count());
  if (devices > 0) {
    TORCH_CHECK(
        config_.local_rank < devices,
        "lamp::dist: LOCAL_RANK is ",
        config_.local_rank,
        " but this host has ",
        devices,
        " CUDA device(s); start at most ",
        devices,
        " processes per host (torchrun --nproc_per_node=",
        devices,
        ").");
#if LAMP_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(config_.local_rank));
#endif
    device_ = c10::Device(
        c10::kCUDA, static_cast<c10::DeviceIndex>(config_.local_rank));
  }
  if (config_.world_size == 1) {
    return;
  }
  TORCH_CHECK(
      devices > 0,
      "lamp::dist: WORLD_SIZE is ",
      config_.world_size,
      " but no CUDA device was found; lamp communicates over NCCL and needs "
      "one GPU per process.");
#if LAMP_WITH_NCCL
  store_ = rendezvous(config_, options_.timeout());
  impl_ = std::make_unique<Impl>(config_.rank, options_.timeout());
  ncclUniqueId id;
  const auto key = next_key("nccl_unique_id");
  if (config_.rank == 0) {
    const auto result = ncclGetUniqueId(&id);
    TORCH_CHECK(
        result == ncclSuccess,
        "lamp::dist: ncclGetUniqueId failed: ",
        ncclGetErrorString(result));
    const auto* begin = reinterpret_cast<const uint8_t*>(&id);
    store_->set(key, std::vector<uint8_t>(begin, begin + sizeof(id)));
  } else {
    const auto bytes = store_->get(key);
    TORCH_CHECK(
        bytes.size() == sizeof(id),
        "lamp::dist: the ncclUniqueId in the store has ",
        bytes.size(),
        " bytes, expected ",
        sizeof(id),
        "; do all ranks use the same NCCL version?");
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
  }
  // NOTE: a blocking communicator: in non-blocking mode NCCL launches every
  // collective from a helper thread and the caller waits for it, about
  // 1-3 ms a collective on the H200 VMs, which stalls backward. Blocking
  // set-up would hang if a rank never came, so every rank first meets at a
  // store barrier, which times out.
  barrier();
  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 1;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    const auto result = ncclCommInitRankConfig(
        &impl_->comm,
        static_cast<int>(config_.world_size),
        id,
        static_cast<int>(config_.rank),
        &nccl_config);
    TORCH_CHECK(
        result == ncclSuccess || result == ncclInProgress,
        "lamp::dist: ncclCommInitRankConfig failed on rank ",
        config_.rank,
        ": ",
        ncclGetErrorString(result),
        " (",
        ncclGetLastError(nullptr),
        ")");
    impl_->check_locked(
        result,
        "creating the NCCL communicator of " +
            std::to_string(config_.world_size) + " ranks");
  }
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
#else
  TORCH_CHECK(
      false,
      "lamp::dist: WORLD_SIZE is ",
      config_.world_size,
      " but this lamp was built without NCCL (LAMP_WITH_NCCL=OFF); rebuild "
      "it with NCCL to train on several GPUs.");
#endif
}

ProcessGroup::~ProcessGroup() = default;

void* ProcessGroup::nccl_comm() const {
#if LAMP_WITH_NCCL
  return impl_ ? static_cast<void*>(impl_->comm) : nullptr;
#else
  return nullptr;
#endif
}

std::string ProcessGroup::next_key(const char* what) {
  return std::string("lamp/") + what + "/" + std::to_string(store_sequence_++);
}

void ProcessGroup::check() const {
#if LAMP_WITH_NCCL
  if (impl_) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    TORCH_CHECK(impl_->error.empty(), impl_->error);
  }
#endif
}

void ProcessGroup::abort(const std::string& why) {
#if LAMP_WITH_NCCL
  if (impl_) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->abort_locked(why);
  }
#else
  (void)why;
#endif
}

namespace {

void check_tensor(
    const torch::Tensor& tensor,
    c10::Device device,
    const char* what) {
  TORCH_CHECK(tensor.defined(), "lamp::dist::", what, ": undefined tensor.");
  TORCH_CHECK(
      tensor.device() == device,
      "lamp::dist::",
      what,
      ": the tensor is on ",
      tensor.device(),
      " but this rank's device is ",
      device,
      "; move it there first.");
  TORCH_CHECK(
      tensor.is_non_overlapping_and_dense(),
      "lamp::dist::",
      what,
      ": the tensor must be dense (e.g. contiguous); got sizes ",
      tensor.sizes(),
      " and strides ",
      tensor.strides(),
      ".");
}

} // namespace

void ProcessGroup::allreduce(
    const torch::Tensor& tensor,
    ReduceOp op,
    std::optional<c10::Stream> stream) {
  check_tensor(tensor, device_, "allreduce");
  TORCH_CHECK(
      !(tensor.scalar_type() == at::kBool && op != ReduceOp::kMax),
      "lamp::dist::allreduce: bool tensors support ReduceOp::kMax only.");
  if (config_.world_size == 1) {
    return;
  }
#if LAMP_WITH_NCCL
  const auto cuda_stream = stream
      ? c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *stream)
      : c10::cuda::getCurrentCUDAStream(device_.index());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_alive_locked();
  const auto what = "allreduce #" + std::to_string(impl_->sequence++) + " (" +
      op_name(op) + ", " + std::to_string(tensor.numel()) + " " +
      c10::toString(tensor.scalar_type()) + ")";
  impl_->check_locked(
      ncclAllReduce(
          tensor.data_ptr(),
          tensor.data_ptr(),
          tensor.numel(),
          nccl_dtype(tensor.scalar_type()),
          nccl_op(op),
          impl_->comm,
          cuda_stream.stream()),
      what);
  impl_->track_locked(cuda_stream.stream(), what);
#endif
}

void ProcessGroup::broadcast(
    const std::vector<torch::Tensor>& tensors,
    int64_t root,
    std::optional<c10::Stream> stream) {
  TORCH_CHECK(
      0 <= root && root < config_.world_size,
      "lamp::dist::broadcast: root must be in [0, ",
      config_.world_size,
      "), got ",
      root,
      ".");
  for (const auto& tensor : tensors) {
    check_tensor(tensor, device_, "broadcast");
  }
  if (config_.world_size == 1 || tensors.empty()) {
    return;
  }
#if LAMP_WITH_NCCL
  const auto cuda_stream = stream
      ? c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *stream)
      : c10::cuda::getCurrentCUDAStream(device_.index());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_alive_locked();
  const auto what = "broadcast #" + std::to_string(impl_->sequence++) + " (" +
      std::to_string(tensors.size()) + " tensors from rank " +
      std::to_string(root) + ")";
  impl_->check_locked(ncclGroupStart(), what);
  for (const auto& tensor : tensors) {
    const auto result = ncclBroadcast(
        tensor.data_ptr(),
        tensor.data_ptr(),
        tensor.numel(),
        nccl_dtype(tensor.scalar_type()),
        static_cast<int>(root),
        impl_->comm,
        cuda_stream.stream());
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      impl_->check_locked(result, what);
    }
  }
  impl_->check_locked(ncclGroupEnd(), what);
  impl_->track_locked(cuda_stream.stream(), what);
#endif
}

std::vector<std::string> ProcessGroup::allgather(const std::string& value) {
  if (config_.world_size == 1) {
    return {value};
  }
  check();
  const auto key = next_key("allgather") + "/";
  store_->set(key + std::to_string(config_.rank), string_to_bytes(value));
  std::vector<std::string> values;
  for (int64_t r = 0; r < config_.world_size; ++r) {
    try {
      values.push_back(bytes_to_string(store_->get(key + std::to_string(r))));
    } catch (const std::exception& e) {
      TORCH_CHECK(
          false,
          "lamp::dist::allgather: rank ",
          config_.rank,
          " gave up waiting for rank ",
          r,
          "'s value after ",
          options_.timeout().count(),
          " ms (did every rank call it?): ",
          e.what());
    }
  }
  return values;
}

void ProcessGroup::barrier() {
  if (config_.world_size == 1) {
    return;
  }
  check();
  const auto key = next_key("barrier");
  if (store_->add(key, 1) == config_.world_size) {
    store_->set(key + "/done", string_to_bytes("1"));
  }
  try {
    store_->wait({key + "/done"});
  } catch (const std::exception& e) {
    TORCH_CHECK(
        false,
        "lamp::dist::barrier: rank ",
        config_.rank,
        " gave up waiting for the other ranks after ",
        options_.timeout().count(),
        " ms: ",
        e.what());
  }
}

std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions options) {
  return std::make_shared<ProcessGroup>(std::move(options));
}

} // namespace lamp::dist

// ---------------------------------------------------------------------------
// DistributedDataParallel

namespace lamp {
namespace {

// One line per parameter and buffer: what every rank must agree on.
std::vector<std::string> describe(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& tensors,
    const char* kind) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::ostringstream line;
    line << kind << " '" << names[i] << "' "
         << c10::toString(tensors[i].scalar_type()) << tensors[i].sizes()
         << " strides " << tensors[i].strides();
    lines.push_back(line.str());
  }
  return lines;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
  }
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) {
    text += line + "\n";
  }
  return text;
}

// Throws on every rank, naming the first difference, unless all ranks
// describe the same module.
void check_same_module(
    const std::vector<std::string>& mine,
    dist::ProcessGroup& pg) {
  const auto all = pg.allgather(join(mine));
  const auto reference = split(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const auto other = split(all[r]);
    for (size_t i = 0; i < std::max(other.size(), reference.size()); ++i) {
      const std::string theirs =
          i < other.size() ? other[i] : std::string("nothing");
      const std::string ours =
          i < reference.size() ? reference[i] : std::string("nothing");
      TORCH_CHECK(
          theirs == ours,
          "lamp::DistributedDataParallel: the ranks' modules differ: at "
          "parameter/buffer #",
          i,
          " rank ",
          r,
          " has ",
          theirs,
          " but rank 0 has ",
          ours,
          ". Every rank must build the same model (same layers, shapes, "
          "dtypes and memory format) and move it to its device before "
          "wrapping it.");
    }
  }
}

} // namespace

#if LAMP_WITH_NCCL
struct DistributedDataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params; // indices into Impl::params
    torch::Tensor flat; // the gradients, back to back
    torch::Tensor comm; // `flat` in options.comm_dtype(), if different
    std::vector<torch::Tensor> views; // of `flat`, one a parameter
    size_t pending = 0; // gradients still to come this backward
    c10::cuda::CUDAEvent ready;
  };

  // Runs after AccumulateGrad has written a parameter's `.grad`.
  struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
    GradReadyHook(Impl* impl, size_t index) : impl(impl), index(index) {}
    void operator()(const torch::autograd::Variable& param) override {
      impl->on_grad_ready(index, param);
    }
    Impl* impl;
    size_t index;
  };

  Impl(
      std::shared_ptr<torch::nn::Module> module_,
      std::shared_ptr<dist::ProcessGroup> pg_,
      DDPOptions options_)
      : module(std::move(module_)),
        pg(std::move(pg_)),
        options(std::move(options_)) {}

  ~Impl() {
    for (const auto& param : params) {
      torch::autograd::impl::set_post_acc_grad_hooks(param, nullptr);
    }
    if (comm_stream) {
      try {
        comm_stream->synchronize(); // buckets are freed next
      } catch (...) { // NOLINT(bugprone-empty-catch): nothing left to do
      }
    }
  }

  void build_buckets() {
    const auto device = pg->device();
    comm_stream = c10::cuda::getStreamFromPool(true, device.index());
    // NOTE: as PyTorch's compute_bucket_assignment_by_size: reverse
    // registration order approximates the order gradients become ready;
    // one open bucket per dtype; a bucket closes once it reaches its cap.
    const auto first_cap =
        static_cast<int64_t>(options.first_bucket_cap_mb() * 1024 * 1024);
    const auto cap =
        static_cast<int64_t>(options.bucket_cap_mb() * 1024 * 1024);
    struct Open {
      at::ScalarType dtype;
      std::vector<size_t> params;
      int64_t bytes = 0;
      bool first = true;
    };
    std::vector<Open> open;
    std::vector<std::vector<size_t>> closed;
    for (size_t k = params.size(); k-- > 0;) {
      const auto dtype = params[k].scalar_type();
      auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
        return o.dtype == dtype;
      });
      if (it == open.end()) {
        open.push_back({dtype});
        it = open.end() - 1;
      }
      it->params.push_back(k);
      it->bytes += params[k].numel() * params[k].element_size();
      if (it->bytes >= (it->first ? first_cap : cap)) {
        closed.push_back(std::move(it->params));
        it->params.clear();
        it->bytes = 0;
        it->first = false;
      }
    }
    for (auto& o : open) {
      if (!o.params.empty()) {
        closed.push_back(std::move(o.params));
      }
    }
    // Reduce first the bucket whose gradients come first.
    std::stable_sort(closed.begin(), closed.end(), [](auto& a, auto& b) {
      return a.front() > b.front();
    });

    locate.resize(params.size());
    for (auto& indices : closed) {
      Bucket bucket;
      int64_t numel = 0;
      for (auto k : indices) {
        numel += params[k].numel();
      }
      const auto& first = params[indices.front()];
      bucket.flat = at::zeros({numel}, first.options());
      const auto comm_dtype =
          options.comm_dtype().value_or(first.scalar_type());
      if (comm_dtype != first.scalar_type()) {
        bucket.comm = at::empty({numel}, first.options().dtype(comm_dtype));
      }
      for (auto k : indices) {
        locate[k] = {buckets.size(), bucket.views.size()};
        bucket.views.push_back(params[k]);
      }
      bucket.views = views_into(bucket.flat, bucket.views);
      bucket.params = indices;
      bucket.pending = indices.size();
      buckets.push_back(std::move(bucket));
    }
    ready.assign(params.size(), 0);
    used.assign(params.size(), 0);

    // Buffers travel in one flat tensor per dtype, as PyTorch coalesces
    // them: a hundred small broadcasts cost more than one big one.
    if (options.broadcast_buffers()) {
      for (const auto& buffer : buffers) {
        auto it = std::find_if(
            buffer_groups.begin(), buffer_groups.end(), [&](const auto& g) {
              return g.flat.scalar_type() == buffer.scalar_type();
            });
        if (it == buffer_groups.end()) {
          buffer_groups.push_back({at::empty({0}, buffer.options())});
          it = buffer_groups.end() - 1;
        }
        it->buffers.push_back(buffer);
      }
      for (auto& group : buffer_groups) {
        int64_t numel = 0;
        for (const auto& buffer : group.buffers) {
          numel += buffer.numel();
        }
        group.flat = at::empty({numel}, group.flat.options());
        group.views = views_into(group.flat, group.buffers);
      }
    }
  }

  // Views of `flat`, back to back, shaped (and strided) like `like`.
  static std::vector<torch::Tensor> views_into(
      const torch::Tensor& flat,
      const std::vector<torch::Tensor>& like) {
    // NOTE: views made below the autograd/view-tracking layer are plain
    // aliases, so that `.grad` may be one of them and LibTorch's
    // zero_grad() (which detach_()es the gradient) still works.
    at::AutoDispatchBelowADInplaceOrView no_view_tracking;
    std::vector<torch::Tensor> views;
    int64_t offset = 0;
    for (const auto& t : like) {
      views.push_back(
          t.is_non_overlapping_and_dense()
              ? flat.as_strided(t.sizes(), t.strides(), offset)
              : flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    return views;
  }

  void register_hooks() {
    for (size_t k = 0; k < params.size(); ++k) {
      TORCH_CHECK(
          !torch::autograd::impl::post_acc_grad_hooks(params[k]),
          "lamp::DistributedDataParallel: parameter '",
          names[k],
          "' already has a post-accumulate-grad hook; is the module wrapped "
          "twice?");
      torch::autograd::impl::set_post_acc_grad_hooks(
          params[k], std::make_unique<GradReadyHook>(this, k));
    }
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), 0);
    std::fill(used.begin(), used.end(), 0);
    for (auto& bucket : buckets) {
      bucket.pending = bucket.params.size();
    }
    next_bucket = 0;
    callback_queued = false;
  }

  void on_grad_ready(size_t k, const torch::Tensor& param) {
    if (!require_sync) {
      return;
    }
    if (ready[k]) {
      reset();
      TORCH_CHECK(
          false,
          "lamp::DistributedDataParallel: parameter '",
          names[k],
          "' received its gradient twice in one backward pass, or backward "
          "ran twice without ending (retain_graph). DDP averages each "
          "gradient once per backward: run the other backward passes of an "
          "iteration under ddp.no_sync().");
    }
    ready[k] = 1;
    used[k] = 1;
    if (!callback_queued) {
      callback_queued = true;
      torch::autograd::Engine::get_default_engine().queue_callback(
          [this] { finalize(); });
    }
    const auto [b, slot] = locate[k];
    auto& bucket = buckets[b];
    auto& view = bucket.views[slot];
    auto& grad = param.mutable_grad();
    if (!grad.is_same(view)) {
      view.copy_(grad);
      if (options.gradient_as_bucket_view()) {
        grad = view;
      }
    }
    if (--bucket.pending == 0) {
      launch_ready_buckets();
    }
  }

  // Starts the allreduce of every complete bucket, in bucket order.
  void launch_ready_buckets() {
    const auto compute = c10::cuda::getCurrentCUDAStream(pg->device().index());
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      auto& bucket = buckets[next_bucket++];
      bucket.ready.record(compute);
      bucket.ready.block(*comm_stream);
      c10::cuda::CUDAStreamGuard on_comm(*comm_stream);
      if (bucket.comm.defined()) {
        bucket.comm.copy_(bucket.flat);
        pg->allreduce(bucket.comm, dist::ReduceOp::kAvg, *comm_stream);
        bucket.flat.copy_(bucket.comm);
      } else {
        pg->allreduce(bucket.flat, dist::ReduceOp::kAvg, *comm_stream);
      }
    }
  }

  // The autograd engine's final callback: runs once backward is done, on
  // the caller's current stream.
  void finalize() {
    callback_queued = false;
    const auto device_index = pg->device().index();
    const auto current = c10::cuda::getCurrentCUDAStream(device_index);
    if (next_bucket < buckets.size()) {
      std::vector<size_t> missing;
      for (size_t k = 0; k < params.size(); ++k) {
        if (!ready[k]) {
          missing.push_back(k);
        }
      }
      if (!options.find_unused_parameters()) {
        reset();
        std::string list;
        for (size_t i = 0; i < missing.size() && i < 10; ++i) {
          list += (i ? ", '" : "'") + names[missing[i]] + "'";
        }
        TORCH_CHECK(
            false,
            "lamp::DistributedDataParallel: ",
            missing.size(),
            " parameter(s) got no gradient in this backward pass: ",
            list,
            missing.size() > 10 ? ", ..." : "",
            ". Make every parameter take part in the loss, set "
            "requires_grad(false) on those you freeze before wrapping, or "
            "construct DDP with DDPOptions().find_unused_parameters(true).");
      }
      torch::NoGradGuard no_grad;
      for (auto k : missing) {
        const auto [b, slot] = locate[k];
        buckets[b].views[slot].zero_();
        --buckets[b].pending;
      }
      launch_ready_buckets();
    }
    std::vector<char> globally_used;
    if (options.find_unused_parameters()) {
      globally_used = reduce_used_map();
    }
    done.record(*comm_stream);
    done.block(current);

    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads, views;
    for (size_t k = 0; k < params.size(); ++k) {
      if (!globally_used.empty() && !globally_used[k]) {
        continue; // no rank has a gradient: leave `.grad` as it is
      }
      const auto [b, slot] = locate[k];
      const auto& view = buckets[b].views[slot];
      auto& grad = params[k].mutable_grad();
      if (grad.is_same(view)) {
        continue;
      }
      if (options.gradient_as_bucket_view()) {
        grad = view;
      } else if (!grad.defined()) {
        grad = view.clone();
      } else {
        grads.push_back(grad);
        views.push_back(view);
      }
    }
    if (!grads.empty()) {
      at::_foreach_copy_(grads, views);
    }
    if (!buffer_groups.empty()) {
      broadcast_buffers(current);
    }
    reset();
  }

  // Every rank's used-parameter map, combined (max) over ranks; one small
  // allreduce and a host sync, only with find_unused_parameters.
  std::vector<char> reduce_used_map() {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(
        c10::cuda::getCurrentCUDAStream(pg->device().index()), &capturing));
    TORCH_CHECK(
        capturing == cudaStreamCaptureStatusNone,
        "lamp::DistributedDataParallel: find_unused_parameters needs a host "
        "sync every backward and cannot be captured in a CUDA graph; make "
        "every parameter take part in the loss, or freeze the unused ones "
        "(requires_grad(false)) before wrapping.");
    if (!used_host.defined()) {
      used_host = at::empty(
          {static_cast<int64_t>(params.size())},
          at::TensorOptions().dtype(at::kInt).pinned_memory(true));
      used_device = at::empty_like(used_host, pg->device());
    }
    auto* host = used_host.data_ptr<int32_t>();
    for (size_t k = 0; k < params.size(); ++k) {
      host[k] = used[k];
    }
    c10::cuda::CUDAStreamGuard on_comm(*comm_stream);
    used_device.copy_(used_host, /*non_blocking=*/true);
    pg->allreduce(used_device, dist::ReduceOp::kMax, *comm_stream);
    used_host.copy_(used_device, /*non_blocking=*/true);
    comm_stream->synchronize();
    pg->check();
    return std::vector<char>(host, host + params.size());
  }

  void broadcast_buffers(const c10::cuda::CUDAStream& current) {
    buffers_ready.record(current);
    buffers_ready.block(*comm_stream);
    c10::cuda::CUDAStreamGuard on_comm(*comm_stream);
    std::vector<torch::Tensor> flats;
    for (auto& group : buffer_groups) {
      if (pg->rank() == 0) {
        at::_foreach_copy_(group.views, group.buffers);
      }
      flats.push_back(group.flat);
    }
    pg->broadcast(flats, 0, *comm_stream);
    if (pg->rank() != 0) {
      for (auto& group : buffer_groups) {
        at::_foreach_copy_(group.buffers, group.views);
      }
    }
    buffers_done.record(*comm_stream);
    buffers_done.block(current);
  }

  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<dist::ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::string> names; // of `params`
  std::vector<torch::Tensor> params; // those that require grad, in order
  std::vector<torch::Tensor> buffers;
  std::vector<Bucket> buckets;
  struct BufferGroup {
    torch::Tensor flat; // one dtype's buffers, back to back
    std::vector<torch::Tensor> buffers;
    std::vector<torch::Tensor> views; // of `flat`, one a buffer
  };
  std::vector<BufferGroup> buffer_groups;
  std::vector<std::pair<size_t, size_t>> locate; // param -> (bucket, slot)
  std::vector<char> ready; // gradient seen this backward
  std::vector<char> used; // ditto, for find_unused_parameters
  size_t next_bucket = 0;
  bool callback_queued = false;
  bool require_sync = true;
  std::optional<c10::cuda::CUDAStream> comm_stream;
  c10::cuda::CUDAEvent done;
  c10::cuda::CUDAEvent buffers_ready;
  c10::cuda::CUDAEvent buffers_done;
  torch::Tensor used_host;
  torch::Tensor used_device;
};
#else
struct DistributedDataParallel::Impl {
  Impl(
      std::shared_ptr<torch::nn::Module> module_,
      std::shared_ptr<dist::ProcessGroup> pg_,
      DDPOptions options_)
      : module(std::move(module_)),
        pg(std::move(pg_)),
        options(std::move(options_)) {}
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<dist::ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> buffers;
  bool require_sync = true;
};
#endif

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module,
    std::shared_ptr<dist::ProcessGroup> process_group,
    DDPOptions options) {
  TORCH_CHECK(module, "lamp::DistributedDataParallel: the module is null.");
  TORCH_CHECK(
      process_group,
      "lamp::DistributedDataParallel: the process group is null; pass "
      "lamp::dist::init_process_group().");
  TORCH_CHECK(
      options.bucket_cap_mb() > 0 && options.first_bucket_cap_mb() > 0,
      "lamp::DDPOptions: bucket_cap_mb and first_bucket_cap_mb must be > 0, "
      "got ",
      options.bucket_cap_mb(),
      " and ",
      options.first_bucket_cap_mb(),
      ".");
  const auto comm_dtype = options.comm_dtype();
  TORCH_CHECK(
      !comm_dtype || at::isFloatingType(*comm_dtype),
      "lamp::DDPOptions::comm_dtype must be a floating-point dtype (e.g. "
      "torch::kHalf or torch::kBFloat16), got ",
      *comm_dtype,
      ".");
  impl_ = std::make_unique<Impl>(
      std::move(module), std::move(process_group), std::move(options));
  auto& impl = *impl_;
  for (const auto& item : impl.module->named_parameters()) {
    if (item.value().requires_grad()) {
      impl.names.push_back(item.key());
      impl.params.push_back(item.value());
    }
  }
  std::vector<std::string> buffer_names;
  for (const auto& item : impl.module->named_buffers()) {
    buffer_names.push_back(item.key());
    impl.buffers.push_back(item.value());
  }
  auto& pg = *impl.pg;
  if (pg.world_size() == 1) {
    return; // nothing to average, nothing to broadcast
  }
  for (size_t k = 0; k < impl.params.size(); ++k) {
    const auto& p = impl.params[k];
    TORCH_CHECK(
        p.device() == pg.device() && p.layout() == at::kStrided,
        "lamp::DistributedDataParallel: parameter '",
        impl.names[k],
        "' is a ",
        p.layout(),
        " tensor on ",
        p.device(),
        " but this rank's device is ",
        pg.device(),
        "; call module->to(pg->device()) before wrapping it (dense "
        "parameters only).");
  }
  for (size_t k = 0; k < impl.buffers.size(); ++k) {
    TORCH_CHECK(
        impl.buffers[k].device() == pg.device(),
        "lamp::DistributedDataParallel: buffer '",
        buffer_names[k],
        "' is on ",
        impl.buffers[k].device(),
        " but this rank's device is ",
        pg.device(),
        "; call module->to(pg->device()) before wrapping it.");
  }
  auto lines = describe(impl.names, impl.params, "parameter");
  const auto buffer_lines = describe(buffer_names, impl.buffers, "buffer");
  lines.insert(lines.end(), buffer_lines.begin(), buffer_lines.end());
  check_same_module(lines, pg);

#if LAMP_WITH_NCCL
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = impl.params;
    state.insert(state.end(), impl.buffers.begin(), impl.buffers.end());
    pg.broadcast(state, 0);
  }
  impl.build_buckets();
  impl.register_hooks();
#endif
}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(
    DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(
    DistributedDataParallel&&) noexcept = default;

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp) {
  TORCH_CHECK(
      ddp_.impl_->require_sync,
      "lamp::DistributedDataParallel::no_sync(): already inside no_sync(); "
      "it does not nest.");
  ddp_.impl_->require_sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  ddp_.impl_->require_sync = true;
}

void DistributedDataParallel::sync_buffers() {
  auto& impl = *impl_;
  if (impl.pg->world_size() == 1 || impl.buffers.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  impl.pg->broadcast(impl.buffers, 0);
}

const std::shared_ptr<torch::nn::Module>& DistributedDataParallel::module()
    const {
  return impl_->module;
}

const std::shared_ptr<dist::ProcessGroup>& DistributedDataParallel::
    process_group() const {
  return impl_->pg;
}

const DDPOptions& DistributedDataParallel::options() const {
  return impl_->options;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices()
    const {
  std::vector<std::vector<size_t>> indices;
#if LAMP_WITH_NCCL
  for (const auto& bucket : impl_->buckets) {
    indices.push_back(bucket.params);
  }
#endif
  return indices;
}

} // namespace lamp
