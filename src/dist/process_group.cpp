#include <lamp/dist/process_group.h>

#include <lamp/config.h>

#include "backend.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/cuda.h>

#include <csignal>
#include <cstdlib>
#include <mutex>
#include <utility>

// Note [Store keys]
// ~~~~~~~~~~~~~~~~~
// The store operations of a group (allgather, barrier, the ncclUniqueId)
// use keys "lamp/<what>/<n>", n counting the group's store operations.
// Every rank calls them in the same order, so the same n names the same
// operation on every rank. A long job calls barrier() and allgather() many
// times, so keys are deleted once every rank is done with them: when every
// rank has arrived at operation n (all values of an allgather are there,
// a barrier's count is complete), every rank has finished operation n - 1,
// and rank 0 deletes its keys. Rank 0 deletes rather than "the last
// reader" because rank 0 serves the store: an operation that needed the
// server after the last rank's wait returned could fail once rank 0 has
// left its last operation and exited. So only the last operation's keys
// outlive it. The ncclUniqueId is deleted the same way (by rank 0, after
// the barrier that follows its exchange).

namespace lamp::dist {

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  LaunchConfig config;
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store;
  std::mutex key_mutex; // guards key_sequence, done_keys
  int64_t key_sequence = 0;
  std::vector<std::string> done_keys; // of the previous store operation
  std::shared_ptr<detail::Backend> backend; // null: world of one, or !nccl

  std::string next_key(const char* what) {
    std::lock_guard<std::mutex> lock(key_mutex);
    return std::string("lamp/") + what + "/" + std::to_string(key_sequence++);
  }

  // Called once every rank has arrived at the current store operation,
  // whose keys are `keys`: rank 0 deletes the previous operation's. See
  // Note [Store keys].
  void arrived(std::vector<std::string> keys) {
    std::vector<std::string> previous;
    {
      std::lock_guard<std::mutex> lock(key_mutex);
      previous = std::exchange(done_keys, std::move(keys));
    }
    if (config.rank != 0) {
      return;
    }
    detail::store_op(config.rank, "deleting store keys", [&] {
      for (const auto& key : previous) {
        store->deleteKey(key);
      }
    });
  }

  // `stream`, checked to be one of this rank's device, or the current one.
  c10::Stream stream_of(
      const std::optional<c10::Stream>& stream,
      const char* what) const {
    if (!stream) {
      return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
    }
    TORCH_CHECK_VALUE(
        stream->device() == device,
        "lamp::dist::",
        what,
        ": the stream is on ",
        stream->device(),
        " but this rank's device is ",
        device,
        "; pass a CUDA stream of ",
        device,
        " (or none: the current stream).");
    return *stream;
  }

  detail::Backend& backend_for(const char* what) const {
    TORCH_CHECK_WITH(
        DistBackendError,
        backend != nullptr,
        "lamp::dist::",
        what,
        ": this process group of ",
        config.world_size,
        " ranks has no communicator (ProcessGroupOptions::nccl(false)); "
        "only allgather() and barrier() work on it.");
    return *backend;
  }
};

// Note [SIGPIPE and peers that exit]
// The store's and Gloo's TCP connections write to peers' sockets; once a
// peer has exited, such a write raises SIGPIPE, whose default action ends
// the process at once, where the write should fail (EPIPE) and the
// collective throw DistBackendError naming the peer (what every other rank
// reports when one exits). Python ignores SIGPIPE from its start, so c10d's
// store and Gloo never meet it there; a C++ program does. A process group of
// more than one rank ignores SIGPIPE when it is at its default action, as
// Python does; a handler the program installed is left alone.
namespace {
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}
} // namespace

ProcessGroup::ProcessGroup(ProcessGroupOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& impl = *impl_;
  TORCH_CHECK_VALUE(
      options.timeout().count() > 0,
      "lamp::dist::ProcessGroupOptions::timeout must be > 0, got ",
      options.timeout().count(),
      " ms.");
  impl.options = std::move(options);
  const auto& kind = impl.options.backend();
  TORCH_CHECK_VALUE(
      kind == "auto" || kind == "nccl" || kind == "gloo",
      "lamp::dist::ProcessGroupOptions::backend must be \"auto\", \"nccl\" "
      "or \"gloo\", got \"",
      kind,
      "\".");
  impl.config = dist::launch_config(impl.options);
  const auto& config = impl.config;
  if (config.world_size > 1) {
    ignore_sigpipe();
  }
  const bool communicator = impl.options.nccl();
  const auto devices = static_cast<int64_t>(torch::cuda::device_count());
  const bool gloo = kind == "gloo" || (kind == "auto" && devices == 0);
  if (devices > 0 && !gloo) {
    int64_t index = config.local_rank;
    if (index >= devices) {
      // NOTE: a launcher that binds GPUs to tasks (Slurm's --gpus-per-task
      // or --gpu-bind, a site's prolog) makes each process see only its
      // own: the first visible device is this rank's. Two ranks on one GPU
      // are then NCCL's "duplicate GPU" error.
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      TORCH_CHECK_VALUE(
          visible != nullptr && *visible != '\0',
          "lamp::dist: the local rank is ",
          config.local_rank,
          " but this host has ",
          devices,
          " CUDA device(s); start at most ",
          devices,
          " processes per host (torchrun --nproc_per_node=",
          devices,
          ", srun --ntasks-per-node=",
          devices,
          ") (launcher: ",
          to_string(config.launcher),
          ").");
      index = 0;
    }
    impl.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(impl.device);
  }
  if (config.world_size == 1) {
    return;
  }
  if (communicator && gloo) {
    TORCH_CHECK_WITH(
        DistBackendError,
        LAMP_WITH_GLOO,
        "lamp::dist: ",
        to_string(config.launcher),
        " started ",
        config.world_size,
        " processes ",
        kind == "gloo" ? "for Gloo" : "on a host without CUDA devices",
        ", but this lamp was built without Gloo (gloo's headers, Debian's "
        "libgloo-dev, were not found); install them and rebuild lamp to "
        "train on CPUs, or pass ProcessGroupOptions().nccl(false) for a "
        "store-only group.");
  }
  TORCH_CHECK_WITH(
      DistBackendError,
      !communicator || gloo || LAMP_WITH_NCCL,
      "lamp::dist: ",
      to_string(config.launcher),
      " started ",
      config.world_size,
      " processes but this lamp was built without NCCL (LAMP_WITH_NCCL=OFF); "
      "rebuild it with NCCL to train on several GPUs, pass "
      "ProcessGroupOptions().backend(\"gloo\") to train on the CPUs, or "
      "ProcessGroupOptions().nccl(false) for a store-only group.");
  TORCH_CHECK_WITH(
      DistBackendError,
      !communicator || gloo || devices > 0,
      "lamp::dist: ",
      to_string(config.launcher),
      " started ",
      config.world_size,
      " processes for NCCL but no CUDA device was found; NCCL needs one GPU "
      "per process (ProcessGroupOptions().backend(\"gloo\") or \"auto\" "
      "trains on the CPUs).");
  impl.store = rendezvous(config, impl.options.timeout());
  if (!communicator) {
    return;
  }
  detail::BackendOptions backend;
  backend.rank = config.rank;
  backend.world_size = config.world_size;
  backend.device = impl.device;
  backend.timeout = impl.options.timeout();
  backend.store = impl.store.get();
  backend.barrier = [this] { barrier(); };
  if (gloo) {
#if LAMP_WITH_GLOO
    backend.unique_id_key = impl.next_key("gloo");
    impl.backend = detail::make_gloo_backend(backend);
#endif
    return;
  }
#if LAMP_WITH_NCCL
  backend.unique_id_key = impl.next_key("nccl_unique_id");
  impl.backend = detail::make_nccl_backend(backend);
#endif
}

ProcessGroup::~ProcessGroup() = default;

int64_t ProcessGroup::rank() const {
  return impl_->config.rank;
}

int64_t ProcessGroup::world_size() const {
  return impl_->config.world_size;
}

int64_t ProcessGroup::local_rank() const {
  return impl_->config.local_rank;
}

const LaunchConfig& ProcessGroup::launch_config() const {
  return impl_->config;
}

c10::Device ProcessGroup::device() const {
  return impl_->device;
}

std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->options.timeout();
}

const c10::intrusive_ptr<c10d::Store>& ProcessGroup::store() const {
  return impl_->store;
}

bool ProcessGroup::has_communicator() const {
  return impl_->config.world_size == 1 || impl_->backend != nullptr;
}

void* ProcessGroup::nccl_comm() const {
  return impl_->backend ? impl_->backend->native_handle() : nullptr;
}

void ProcessGroup::check() const {
  if (impl_->backend) {
    impl_->backend->check();
  }
}

void ProcessGroup::abort(const std::string& why) {
  if (impl_->backend) {
    impl_->backend->abort(why);
  }
}

namespace {

void check_tensor(
    const torch::Tensor& tensor,
    c10::Device device,
    const char* what) {
  TORCH_CHECK_VALUE(
      tensor.defined(), "lamp::dist::", what, ": undefined tensor.");
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

std::string to_text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> to_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

} // namespace

void ProcessGroup::allreduce(
    const torch::Tensor& tensor,
    ReduceOp op,
    std::optional<c10::Stream> stream) {
  auto& impl = *impl_;
  check_tensor(tensor, impl.device, "allreduce");
  TORCH_CHECK_VALUE(
      !(tensor.scalar_type() == at::kBool && op != ReduceOp::kMax),
      "lamp::dist::allreduce: bool tensors support ReduceOp::kMax only.");
  const auto on = impl.stream_of(stream, "allreduce");
  if (impl.config.world_size == 1) {
    return;
  }
  auto& backend = impl.backend_for("allreduce");
  backend.allreduce(tensor, op, on);
  if (!impl.device.is_cuda()) {
    backend.synchronize(); // See Note [Collectives on the CPU].
  }
}

void ProcessGroup::start_allreduce(
    const torch::Tensor& tensor,
    ReduceOp op,
    const c10::Stream& stream) {
  auto& impl = *impl_;
  if (impl.device.is_cuda()) {
    allreduce(tensor, op, stream);
    return;
  }
  check_tensor(tensor, impl.device, "allreduce");
  if (impl.config.world_size > 1) {
    impl.backend_for("allreduce").allreduce(tensor, op, stream);
  }
}

void ProcessGroup::wait_started() {
  auto& impl = *impl_;
  if (!impl.device.is_cuda() && impl.backend) {
    impl.backend->synchronize();
  }
}

void ProcessGroup::broadcast(
    const std::vector<torch::Tensor>& tensors,
    int64_t root,
    std::optional<c10::Stream> stream) {
  auto& impl = *impl_;
  TORCH_CHECK_VALUE(
      0 <= root && root < impl.config.world_size,
      "lamp::dist::broadcast: root must be in [0, ",
      impl.config.world_size,
      "), got ",
      root,
      ".");
  for (const auto& tensor : tensors) {
    check_tensor(tensor, impl.device, "broadcast");
  }
  const auto on = impl.stream_of(stream, "broadcast");
  if (impl.config.world_size == 1 || tensors.empty()) {
    return;
  }
  auto& backend = impl.backend_for("broadcast");
  backend.broadcast(tensors, root, on);
  if (!impl.device.is_cuda()) {
    backend.synchronize(); // See Note [Collectives on the CPU].
  }
}

// See Note [Store keys].
std::vector<std::string> ProcessGroup::allgather(const std::string& value) {
  auto& impl = *impl_;
  const auto n = impl.config.world_size;
  if (n == 1) {
    return {value};
  }
  check();
  auto& store = *impl.store;
  const auto key = impl.next_key("allgather");
  std::vector<std::string> keys;
  for (int64_t r = 0; r < n; ++r) {
    keys.push_back(key + "/" + std::to_string(r));
  }
  const auto rank = impl.config.rank;
  const auto doing = "allgather (" + key + ") after " +
      std::to_string(impl.options.timeout().count()) +
      " ms: did every rank call it?";
  const auto bytes = detail::store_op(rank, doing, [&] {
    store.set(keys[rank], to_bytes(value));
    store.wait(keys);
    if (store.hasExtendedApi()) {
      return store.multiGet(keys);
    }
    std::vector<std::vector<uint8_t>> all;
    for (const auto& k : keys) {
      all.push_back(store.get(k));
    }
    return all;
  });
  impl.arrived(std::move(keys));
  std::vector<std::string> values;
  for (const auto& b : bytes) {
    values.push_back(to_text(b));
  }
  return values;
}

// See Note [Store keys].
void ProcessGroup::barrier() {
  auto& impl = *impl_;
  const auto n = impl.config.world_size;
  if (n == 1) {
    return;
  }
  check();
  auto& store = *impl.store;
  const auto key = impl.next_key("barrier");
  const auto doing = "barrier (" + key +
      "): gave up waiting for the other "
      "ranks after " +
      std::to_string(impl.options.timeout().count()) + " ms";
  detail::store_op(impl.config.rank, doing, [&] {
    if (store.add(key, 1) == n) {
      store.set(key + "/done", to_bytes("1"));
    }
    store.wait({key + "/done"});
  });
  impl.arrived({key, key + "/done"});
}

std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions options) {
  return std::make_shared<ProcessGroup>(std::move(options));
}

} // namespace lamp::dist
