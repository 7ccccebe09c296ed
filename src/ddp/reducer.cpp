#include "reducer.h"

#include "../optim/multi_tensor.h"
#include "bucketing.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/_foreach_copy.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace lamp::detail {
namespace {

// Views of `flat`, back to back, shaped (and strided) like `like`.
std::vector<torch::Tensor> views_into(
    const torch::Tensor& flat,
    const std::vector<torch::Tensor>& like) {
  // NOTE: views made below the autograd/view-tracking layer are plain
  // aliases, so that `.grad` may be one of them and LibTorch's zero_grad()
  // (which detach_()es the gradient) still works.
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

} // namespace

// Runs after AccumulateGrad has written a parameter's `.grad`, on
// autograd's thread (Note [DDP threads and streams]).
class Reducer::GradReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(Reducer* reducer, size_t index)
      : reducer_(reducer), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    reducer_->on_grad_ready(index_, param);
  }

 private:
  Reducer* reducer_;
  size_t index_;
};

Reducer::Reducer(
    std::vector<std::string> names,
    std::vector<torch::Tensor> params,
    std::vector<torch::Tensor> buffers,
    std::shared_ptr<dist::ProcessGroup> pg,
    DDPOptions options)
    : pg_(std::move(pg)),
      options_(std::move(options)),
      names_(std::move(names)),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      cuda_(pg_->device().is_cuda()),
      comm_stream_(
          cuda_ ? c10::impl::VirtualGuardImpl(c10::kCUDA)
                      .getStreamFromGlobalPool(pg_->device(), true)
                : c10::Stream(c10::Stream::DEFAULT, pg_->device())),
      done_(pg_->device().type()),
      buffers_ready_(pg_->device().type()),
      buffers_done_(pg_->device().type()) {
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = params_;
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    pg_->broadcast(state, 0);
  }
  build_buckets();
  if (options_.broadcast_buffers()) {
    group_buffers();
  }
  register_hooks();
}

Reducer::~Reducer() {
  for (const auto& param : params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(param, nullptr);
  }
  try {
    // The buckets are freed next.
    if (cuda_) {
      comm_stream_.synchronize();
    } else {
      pg_->wait_started();
    }
  } catch (...) { // NOLINT(bugprone-empty-catch): nothing left to do
  }
}

c10::Stream Reducer::current_stream() const {
  return cuda_
      ? c10::impl::VirtualGuardImpl(c10::kCUDA).getStream(pg_->device())
      : comm_stream_;
}

void Reducer::order(
    c10::Event& event,
    const c10::Stream& before,
    const c10::Stream& after) {
  if (cuda_) { // the CPU's order is the host's
    event.record(before);
    event.block(after);
  }
}

void Reducer::build_buckets() {
  // As PyTorch's reducer: buckets over the parameters in the order their
  // gradients become ready, approximated by reverse registration order.
  std::vector<at::Tensor> ready_order(params_.rbegin(), params_.rend());
  const auto assignment = compute_bucket_assignment_by_size(
      ready_order,
      {static_cast<size_t>(options_.first_bucket_cap_mb() * 1024 * 1024),
       static_cast<size_t>(options_.bucket_cap_mb() * 1024 * 1024)});
  const size_t n = params_.size();
  locate_.resize(n);
  for (const auto& positions : assignment.buckets) {
    Bucket bucket(pg_->device().type());
    for (auto p : positions) {
      bucket.params.push_back(n - 1 - p);
    }
    int64_t numel = 0;
    std::vector<torch::Tensor> members;
    for (auto k : bucket.params) {
      numel += params_[k].numel();
      locate_[k] = {buckets_.size(), members.size()};
      members.push_back(params_[k]);
    }
    const auto& first = members.front();
    bucket.flat = at::zeros({numel}, first.options());
    const auto comm_dtype = options_.comm_dtype().value_or(first.scalar_type());
    if (comm_dtype != first.scalar_type()) {
      bucket.comm = at::empty({numel}, first.options().dtype(comm_dtype));
    }
    bucket.views = views_into(bucket.flat, members);
    bucket.pending = bucket.params.size();
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(n, 0);
  used_.assign(n, 0);
}

// Buffers travel in one flat tensor per dtype, as PyTorch coalesces them: a
// hundred small broadcasts cost more than one big one.
void Reducer::group_buffers() {
  for (const auto& buffer : buffers_) {
    auto it = std::find_if(
        buffer_groups_.begin(), buffer_groups_.end(), [&](const auto& g) {
          return g.flat.scalar_type() == buffer.scalar_type();
        });
    if (it == buffer_groups_.end()) {
      buffer_groups_.push_back({at::empty({0}, buffer.options())});
      it = buffer_groups_.end() - 1;
    }
    it->buffers.push_back(buffer);
  }
  for (auto& group : buffer_groups_) {
    int64_t numel = 0;
    for (const auto& buffer : group.buffers) {
      numel += buffer.numel();
    }
    group.flat = at::empty({numel}, group.flat.options());
    group.views = views_into(group.flat, group.buffers);
  }
}

void Reducer::register_hooks() {
  for (size_t k = 0; k < params_.size(); ++k) {
    TORCH_CHECK(
        !torch::autograd::impl::post_acc_grad_hooks(params_[k]),
        "lamp::DistributedDataParallel: parameter '",
        names_[k],
        "' already has a post-accumulate-grad hook; is the module wrapped "
        "twice?");
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[k], std::make_unique<GradReadyHook>(this, k));
  }
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> indices;
  for (const auto& bucket : buckets_) {
    indices.push_back(bucket.params);
  }
  return indices;
}

void Reducer::reset() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(used_.begin(), used_.end(), 0);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
  }
  next_bucket_ = 0;
  callback_queued_ = false;
}

void Reducer::on_grad_ready(size_t k, const torch::Tensor& param) {
  if (!require_sync_) {
    return;
  }
  if (ready_[k]) {
    reset();
    TORCH_CHECK(
        false,
        "lamp::DistributedDataParallel: parameter '",
        names_[k],
        "' received its gradient twice in one backward pass, or backward "
        "ran twice without ending (retain_graph). DDP averages each "
        "gradient once per backward: run the other backward passes of an "
        "iteration under ddp.no_sync().");
  }
  ready_[k] = 1;
  used_[k] = 1;
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback(
        [this] { finalize(); });
  }
  const auto [b, slot] = locate_[k];
  auto& bucket = buckets_[b];
  auto& view = bucket.views[slot];
  auto& grad = param.mutable_grad();
  if (!grad.is_same(view)) {
    view.copy_(grad);
    if (options_.gradient_as_bucket_view()) {
      grad = view;
    }
  }
  if (--bucket.pending == 0) {
    launch_ready_buckets();
  }
}

// Starts the allreduce of every complete bucket, in bucket order.
void Reducer::launch_ready_buckets() {
  const auto compute = current_stream();
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_].pending == 0) {
    auto& bucket = buckets_[next_bucket_++];
    order(bucket.ready, compute, comm_stream_);
    c10::StreamGuard on_comm(comm_stream_);
    if (bucket.comm.defined()) {
      bucket.comm.copy_(bucket.flat);
    }
    // NOTE: on the CPU this only starts the allreduce, and `finalize` waits
    // (and copies `comm` back): Note [Collectives on the CPU].
    pg_->start_allreduce(
        bucket.comm.defined() ? bucket.comm : bucket.flat,
        dist::ReduceOp::kAvg,
        comm_stream_);
    if (bucket.comm.defined() && cuda_) {
      bucket.flat.copy_(bucket.comm);
    }
  }
}

// The autograd engine's final callback: runs once backward is done, on the
// caller's current stream.
void Reducer::finalize() {
  callback_queued_ = false;
  const auto current = current_stream();
  if (next_bucket_ < buckets_.size()) {
    std::vector<size_t> missing;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!ready_[k]) {
        missing.push_back(k);
      }
    }
    if (!options_.find_unused_parameters()) {
      reset();
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 10; ++i) {
        list += (i ? ", '" : "'") + names_[missing[i]] + "'";
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
      const auto [b, slot] = locate_[k];
      buckets_[b].views[slot].zero_();
      --buckets_[b].pending;
    }
    launch_ready_buckets();
  }
  std::vector<char> globally_used;
  if (options_.find_unused_parameters()) {
    globally_used = reduce_used_map();
  }
  if (!cuda_) {
    pg_->wait_started();
    for (auto& bucket : buckets_) {
      if (bucket.comm.defined()) {
        bucket.flat.copy_(bucket.comm);
      }
    }
  }
  order(done_, comm_stream_, current);

  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads, views;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!globally_used.empty() && !globally_used[k]) {
      continue; // no rank has a gradient: leave `.grad` as it is
    }
    const auto [b, slot] = locate_[k];
    const auto& view = buckets_[b].views[slot];
    auto& grad = params_[k].mutable_grad();
    if (grad.is_same(view)) {
      continue;
    }
    if (options_.gradient_as_bucket_view()) {
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
  if (!buffer_groups_.empty()) {
    broadcast_buffers(current);
  }
  reset();
}

// Every rank's used-parameter map, combined (max) over ranks; one small
// allreduce and a host sync, only with find_unused_parameters.
std::vector<char> Reducer::reduce_used_map() {
  TORCH_CHECK(
      !(cuda_ && capturing()),
      "lamp::DistributedDataParallel: find_unused_parameters needs a host "
      "sync every backward and cannot be captured in a CUDA graph; make "
      "every parameter take part in the loss, or freeze the unused ones "
      "(requires_grad(false)) before wrapping.");
  if (!used_host_.defined()) {
    used_host_ = at::empty(
        {static_cast<int64_t>(params_.size())},
        at::TensorOptions().dtype(at::kInt).pinned_memory(cuda_));
    used_device_ =
        cuda_ ? at::empty_like(used_host_, pg_->device()) : used_host_;
  }
  auto* host = used_host_.data_ptr<int32_t>();
  for (size_t k = 0; k < params_.size(); ++k) {
    host[k] = used_[k];
  }
  if (cuda_) {
    c10::StreamGuard on_comm(comm_stream_);
    used_device_.copy_(used_host_, /*non_blocking=*/true);
    pg_->allreduce(used_device_, dist::ReduceOp::kMax, comm_stream_);
    used_host_.copy_(used_device_, /*non_blocking=*/true);
    comm_stream_.synchronize();
  } else {
    pg_->allreduce(used_host_, dist::ReduceOp::kMax); // done when it returns
  }
  pg_->check();
  return std::vector<char>(host, host + params_.size());
}

void Reducer::broadcast_buffers(const c10::Stream& current) {
  order(buffers_ready_, current, comm_stream_);
  c10::StreamGuard on_comm(comm_stream_);
  std::vector<torch::Tensor> flats;
  for (auto& group : buffer_groups_) {
    if (pg_->rank() == 0) {
      at::_foreach_copy_(group.views, group.buffers);
    }
    flats.push_back(group.flat);
  }
  pg_->broadcast(flats, 0, comm_stream_);
  if (pg_->rank() != 0) {
    for (auto& group : buffer_groups_) {
      at::_foreach_copy_(group.buffers, group.views);
    }
  }
  order(buffers_done_, comm_stream_, current);
}

} // namespace lamp::detail
