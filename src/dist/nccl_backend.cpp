// The NCCL backend of a process group: set-up through the store, the
// collectives, and their watching (NCCL builds only).

#include "backend.h"
#include "nccl_comm.h"
#include "watchdog.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>

namespace lamp::dist::detail {
namespace {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendOptions& options)
      : rank_(options.rank),
        device_(options.device),
        timeout_(options.timeout) {
    auto& store = *options.store;
    const auto& key = options.unique_id_key;
    ncclUniqueId id;
    if (rank_ == 0) {
      LAMP_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
      const auto* begin = reinterpret_cast<const uint8_t*>(&id);
      store_op(rank_, "publishing the ncclUniqueId", [&] {
        store.set(key, std::vector<uint8_t>(begin, begin + sizeof(id)));
      });
    } else {
      const auto bytes =
          store_op(rank_, "waiting for rank 0's ncclUniqueId", [&] {
            return store.get(key);
          });
      TORCH_CHECK_WITH(
          DistBackendError,
          bytes.size() == sizeof(id),
          "lamp::dist: the ncclUniqueId in the store has ",
          bytes.size(),
          " bytes, expected ",
          sizeof(id),
          "; do all ranks use the same NCCL version?");
      std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
    }
    // NOTE: every rank meets at a store barrier first, which times out: a
    // rank that never came is then a DistStoreError, not a communicator
    // waiting for it. After it, every rank has read the id.
    options.barrier();
    if (rank_ == 0) {
      store_op(rank_, "deleting the ncclUniqueId", [&] {
        return store.deleteKey(key);
      });
    }
    comm_ = NcclComm::create(
        id, rank_, options.world_size, device_.index(), timeout_);
    watchdog_ = std::make_unique<Watchdog>(*comm_, device_.index(), timeout_);
  }

  ~NcclBackend() override {
    const auto deadline = Clock::now() + timeout_;
    const bool drained = watchdog_->stop_and_drain(deadline);
    if (!drained) {
      comm_->abort(
          "outstanding collectives did not complete within " +
          std::to_string(timeout_.count()) +
          " ms while the process group was destroyed");
    }
    comm_->shutdown(deadline);
  }

  void allreduce(
      const at::Tensor& tensor,
      ReduceOp op,
      const c10::Stream& stream) override {
    const auto cuda_stream = c10::cuda::CUDAStream(stream);
    Work work;
    work.kind = Work::Kind::kAllreduce;
    work.sequence = sequence_.fetch_add(1, std::memory_order_relaxed);
    work.numel = tensor.numel();
    work.dtype = tensor.scalar_type();
    work.op = op;
    const auto dtype = nccl_dtype(tensor.scalar_type());
    const auto nccl_reduce = nccl_op(op);
    void* data = tensor.data_ptr();
    LAMP_NCCL_CHECK(
        comm_->run(
            work,
            [&](ncclComm_t comm) {
              return ncclAllReduce(
                  data,
                  data,
                  tensor.numel(),
                  dtype,
                  nccl_reduce,
                  comm,
                  cuda_stream.stream());
            }),
        comm_.get(),
        describe(work));
    after_enqueue(cuda_stream.stream(), work);
  }

  void broadcast(
      const std::vector<at::Tensor>& tensors,
      int64_t root,
      const c10::Stream& stream) override {
    const auto cuda_stream = c10::cuda::CUDAStream(stream);
    Work work;
    work.kind = Work::Kind::kBroadcast;
    work.sequence = sequence_.fetch_add(1, std::memory_order_relaxed);
    work.tensors = static_cast<int64_t>(tensors.size());
    work.root = root;
    for (const auto& tensor : tensors) {
      (void)nccl_dtype(tensor.scalar_type()); // throws before any NCCL call
    }
    LAMP_NCCL_CHECK(
        comm_->run(
            work,
            [&](ncclComm_t comm) {
              ncclResult_t result = ncclGroupStart();
              for (size_t i = 0; i < tensors.size() && result == ncclSuccess;
                   ++i) {
                result = ncclBroadcast(
                    tensors[i].data_ptr(),
                    tensors[i].data_ptr(),
                    tensors[i].numel(),
                    nccl_dtype(tensors[i].scalar_type()),
                    static_cast<int>(root),
                    comm,
                    cuda_stream.stream());
              }
              const ncclResult_t end = ncclGroupEnd();
              return result != ncclSuccess ? result : end;
            }),
        comm_.get(),
        describe(work));
    after_enqueue(cuda_stream.stream(), work);
  }

  void check() const override {
    if (C10_UNLIKELY(comm_->aborted())) {
      comm_->throw_error();
    }
  }

  void abort(const std::string& why) override {
    comm_->abort(why);
  }

  void* native_handle() const override {
    return comm_->handle();
  }

  void watch_replay(const c10::Stream& stream) override {
    Work work;
    work.kind = Work::Kind::kGraphReplay;
    work.sequence = replays_.fetch_add(1, std::memory_order_relaxed);
    watchdog_->watch(c10::cuda::CUDAStream(stream).stream(), work);
  }

 private:
  // Eager work is watched now; captured work at each replay. See Note
  // [Watching collectives].
  void after_enqueue(cudaStream_t stream, const Work& work) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_id));
    if (status == cudaStreamCaptureStatusActive) {
      note_captured_collective(capture_id, weak_from_this());
    } else if (status == cudaStreamCaptureStatusNone) {
      watchdog_->watch(stream, work);
    }
  }

  const int64_t rank_;
  const c10::Device device_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<NcclComm> comm_;
  std::unique_ptr<Watchdog> watchdog_; // watches comm_; destroyed first
  std::atomic<uint64_t> sequence_{0};
  std::atomic<uint64_t> replays_{0};
};

} // namespace

std::shared_ptr<Backend> make_nccl_backend(const BackendOptions& options) {
  return std::make_shared<NcclBackend>(options);
}

} // namespace lamp::dist::detail
