// The Gloo backend of a process group: collectives between CPU processes
// through c10d's ProcessGroupGloo (compiled into libtorch_cpu), on the
// group's own store. Built only when gloo's headers were found
// (LAMP_WITH_GLOO); lamp uses the process group's public calls only, since
// those headers (Debian's libgloo-dev) may be older than the gloo LibTorch
// was built with.

#include "backend.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

// Note [Collectives on the CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CPU has no streams to order work by, so host order is the order: a
// collective the user calls (ProcessGroup::allreduce, broadcast) returns
// once it is done. DDP's reducer starts each bucket's allreduce as the
// bucket fills and waits for all of them in its final callback, so that
// Gloo's threads (ProcessGroupGloo::Options::threads, 2) reduce buckets while
// autograd computes the next ones. Started work is kept in `started_`
// (guarded by `mutex_`: the reducer's hooks run on autograd's thread, the
// user's collectives on theirs) until `synchronize()` waits for it. A
// failure of Gloo (a peer that died: its socket closed; one that never
// came: Gloo's timeout, the group's) is rethrown as c10::DistBackendError,
// and after it every call fails at once: the group is aborted.

namespace lamp::dist::detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: // Gloo has no average: a sum, divided after
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

// The network device Gloo listens on: GLOO_SOCKET_IFNAME's first interface
// when set (as torch.distributed does), else the address this host's name
// resolves to (ProcessGroupGloo falls back to the loopback).
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    std::string first(ifname);
    first = first.substr(0, first.find(','));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const BackendOptions& options)
      : rank_(options.rank),
        world_size_(options.world_size),
        timeout_(options.timeout) {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout_);
    gloo_options->devices.push_back(gloo_device());
    // NOTE: a prefix of the group's own: Gloo's connection keys must not
    // meet lamp's (Note [Store keys]) nor an earlier group's on one store.
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        options.unique_id_key,
        c10::intrusive_ptr<c10d::Store>::reclaim_copy(options.store));
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          store,
          static_cast<int>(rank_),
          static_cast<int>(world_size_),
          gloo_options);
    } catch (const std::exception& e) {
      TORCH_CHECK_WITH(
          DistBackendError,
          false,
          "lamp::dist: rank ",
          rank_,
          ": connecting to the other ",
          world_size_ - 1,
          " rank(s) over Gloo failed (timeout ",
          timeout_.count(),
          " ms): ",
          what_of(e),
          ". Did every rank start? Set GLOO_SOCKET_IFNAME to the network "
          "interface the hosts reach each other on.");
    }
  }

  ~GlooBackend() override {
    try {
      synchronize();
    } catch (const std::exception&) {
      // NOTE: a destructor must not throw; the failure was (or will never
      // be) the caller's to see.
    }
  }

  void allreduce(const at::Tensor& tensor, ReduceOp op, const c10::Stream&)
      override {
    check();
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = timeout_;
    start(
        [&] { return group_->allreduce(tensors, options); },
        std::string("allreduce (") + op_name(op) + ") of " +
            std::to_string(tensor.numel()) + " " +
            c10::toString(tensor.scalar_type()),
        op == ReduceOp::kAvg ? tensor : at::Tensor());
  }

  void broadcast(
      const std::vector<at::Tensor>& tensors,
      int64_t root,
      const c10::Stream&) override {
    check();
    for (const auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      options.timeout = timeout_;
      start(
          [&] { return group_->broadcast(one, options); },
          "broadcast from rank " + std::to_string(root),
          at::Tensor());
    }
  }

  // Waits for every started collective; see Note [Collectives on the CPU].
  void synchronize() override {
    for (;;) {
      Started next;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (started_.empty()) {
          return;
        }
        next = std::move(started_.front());
        started_.pop_front();
      }
      try {
        next.work->wait();
      } catch (const std::exception& e) {
        fail(next.what, what_of(e));
      }
      if (next.average.defined()) {
        if (next.average.is_floating_point()) {
          next.average.div_(world_size_);
        } else {
          next.average.div_(world_size_, "trunc");
        }
      }
    }
  }

  void check() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK_WITH(
        DistBackendError,
        abort_reason_.empty(),
        "lamp::dist: rank ",
        rank_,
        ": the Gloo process group was aborted: ",
        abort_reason_);
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) {
      abort_reason_ = why;
    }
  }

  void* native_handle() const override {
    return nullptr; // no NCCL communicator
  }

  void watch_replay(const c10::Stream&) override {
    TORCH_INTERNAL_ASSERT(false, "a CUDA graph holds no Gloo collectives");
  }

 private:
  struct Started {
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
    at::Tensor average; // divided by the world size once done
  };

  static std::string what_of(const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    return error ? error->what_without_backtrace() : e.what();
  }

  template <typename Launch>
  void start(const Launch& launch, std::string what, at::Tensor average) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const std::exception& e) {
      // NOTE: Gloo checks its input before starting (dtype, layout): that
      // is the caller's mistake, not a failed group.
      TORCH_CHECK(
          false,
          "lamp::dist: rank ",
          rank_,
          ": Gloo cannot run this ",
          what,
          ": ",
          what_of(e));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    started_.push_back({std::move(work), std::move(what), std::move(average)});
  }

  [[noreturn]] void fail(const std::string& what, const std::string& error) {
    const auto reason = what + " failed: " + error +
        " (a rank exited, crashed or stopped calling collectives; timeout " +
        std::to_string(timeout_.count()) + " ms)";
    abort(reason);
    // NOTE: the rest of what was started cannot succeed either; wait for it
    // so that no Gloo thread still writes into a tensor once this throws.
    std::deque<Started> rest;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      rest.swap(started_);
    }
    for (auto& s : rest) {
      try {
        s.work->wait();
      } catch (const std::exception&) {
      }
    }
    TORCH_CHECK_WITH(
        DistBackendError,
        false,
        "lamp::dist: rank ",
        rank_,
        ": the Gloo process group was aborted: ",
        reason);
  }

  const int64_t rank_;
  const int64_t world_size_;
  const std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  mutable std::mutex mutex_; // guards started_, abort_reason_
  std::deque<Started> started_;
  std::string abort_reason_;
};

} // namespace

std::shared_ptr<Backend> make_gloo_backend(const BackendOptions& options) {
  return std::make_shared<GlooBackend>(options);
}

} // namespace lamp::dist::detail
