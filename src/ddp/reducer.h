#pragma once

// Internal: DistributedDataParallel's reducer, which averages gradients
// bucket by bucket while backward runs.

#include <lamp/ddp.h>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// Note [DDP threads and streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Threads: construction, sync_buffers() and destruction run on the user's
// thread. During backward, autograd runs each parameter's gradient hook
// (`Reducer::on_grad_ready`, a PostAccumulateGradHook) on its thread for
// the parameters' device, one hook at a time, and at the end the final
// callback (`Reducer::finalize`, queued with Engine::queue_callback) on
// that same thread, while the user's thread waits in backward(). The
// reducer's state is thus touched by one thread at a time and needs no
// lock; backward() returning orders the hand-overs.
//
// Streams: a hook copies its gradient into the bucket on the current stream
// of that thread (the stream backward runs on, "compute"). When a bucket is
// complete, its `ready` event is recorded on compute and the reducer's comm
// stream (a high-priority pool stream) waits for it; the bucket's allreduce
// and the comm_dtype casts around it run on the comm stream, overlapping
// the rest of backward. `finalize` records `done` on the comm stream and
// makes the caller's current stream wait for it before copying the
// averages into `.grad`: the caller sees averaged gradients in stream
// order, with no host sync. Buffers go the same way (buffers_ready, comm
// stream, buffers_done). Buckets are allocated at construction and used
// only on these two streams, ordered by these events; the destructor
// synchronises the comm stream before they are freed.
//
// On the CPU there are no streams: the events are skipped, allreduces run on
// Gloo's threads and `finalize` waits for them (Note [Collectives on the
// CPU]).
// CUDA graphs: GraphedStep captures all of this like any stream work (the
// events become graph edges); Note [Watching collectives] says how the
// captured allreduces are watched at each replay.

namespace lamp::detail {

/// Buckets, hooks and the final callback of a `DistributedDataParallel`
/// over a process group of several ranks. See Note [DDP threads and
/// streams].
class Reducer {
 public:
  /// Broadcasts rank 0's `params` and `buffers`, builds the buckets and
  /// registers the hooks. `params` are those that require grad, in
  /// registration order, all on the group's device.
  Reducer(
      std::vector<std::string> names,
      std::vector<torch::Tensor> params,
      std::vector<torch::Tensor> buffers,
      std::shared_ptr<dist::ProcessGroup> pg,
      DDPOptions options);
  /// Removes the hooks; waits for the comm stream.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Off inside `no_sync()`: backward only accumulates local gradients.
  void set_require_sync(bool require_sync) {
    require_sync_ = require_sync;
  }
  /// Parameter indices of each bucket, in reduction order.
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  struct Bucket {
    explicit Bucket(c10::DeviceType type) : ready(type) {}
    std::vector<size_t> params; // indices into params_
    torch::Tensor flat; // the gradients, back to back
    torch::Tensor comm; // `flat` in options.comm_dtype(), if different
    std::vector<torch::Tensor> views; // of `flat`, one a parameter
    size_t pending = 0; // gradients still to come this backward
    c10::Event ready;
  };
  struct BufferGroup {
    torch::Tensor flat; // one dtype's buffers, back to back
    std::vector<torch::Tensor> buffers;
    std::vector<torch::Tensor> views; // of `flat`, one a buffer
  };
  class GradReadyHook;

  void build_buckets();
  void group_buffers();
  void register_hooks();
  void reset();
  void on_grad_ready(size_t k, const torch::Tensor& param);
  void launch_ready_buckets();
  void finalize();
  std::vector<char> reduce_used_map();
  void broadcast_buffers(const c10::Stream& current);
  c10::Stream current_stream() const;
  /// Makes `after` wait for what `before` has enqueued so far (on a GPU;
  /// on the CPU host order is enough).
  void order(
      c10::Event& event,
      const c10::Stream& before,
      const c10::Stream& after);

  std::shared_ptr<dist::ProcessGroup> pg_;
  DDPOptions options_;
  std::vector<std::string> names_; // of params_
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  std::vector<Bucket> buckets_;
  std::vector<BufferGroup> buffer_groups_;
  std::vector<std::pair<size_t, size_t>> locate_; // param -> (bucket, slot)
  std::vector<char> ready_; // gradient seen this backward
  std::vector<char> used_; // ditto, for find_unused_parameters
  size_t next_bucket_ = 0;
  bool callback_queued_ = false;
  bool require_sync_ = true;
  bool
      cuda_; // the group's device is a GPU (else Note [Collectives on the CPU])
  c10::Stream comm_stream_; // the CPU's default stream on the CPU
  c10::Event done_;
  c10::Event buffers_ready_;
  c10::Event buffers_done_;
  torch::Tensor used_host_;
  torch::Tensor used_device_;
};

} // namespace lamp::detail
