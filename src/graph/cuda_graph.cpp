#include <lamp/cuda_graph.h>

#include <lamp/config.h>
#include <lamp/optim.h>

#include "../amp/kept_casts.h"
#include "../dist/backend.h"
#include "../optim/bump_versions.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#if LAMP_WITH_CUDA
#include "memset_nodes.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <memory>
#include <optional>
#include <string>

namespace lamp {
namespace {

// Calls f(group, name, value) for each hyperparameter a captured step bakes
// in: all but the learning rate (which the fused optimizers read from the
// device). No allocation: it runs before every replay.
template <typename F>
void for_each_hyperparameter(const torch::optim::Optimizer& optimizer, F f) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = groups[g].options();
    auto adam_like = [&](const auto& o) {
      f(g, "betas[0]", std::get<0>(o.betas()));
      f(g, "betas[1]", std::get<1>(o.betas()));
      f(g, "eps", o.eps());
      f(g, "weight_decay", o.weight_decay());
      f(g, "amsgrad", o.amsgrad() ? 1.0 : 0.0);
    };
    if (dynamic_cast<const optim::FusedAdamW*>(&optimizer)) {
      adam_like(static_cast<const torch::optim::AdamWOptions&>(options));
    } else if (dynamic_cast<const optim::FusedAdam*>(&optimizer)) {
      adam_like(static_cast<const torch::optim::AdamOptions&>(options));
    } else if (dynamic_cast<const optim::FusedSGD*>(&optimizer)) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
      f(g, "momentum", o.momentum());
      f(g, "dampening", o.dampening());
      f(g, "weight_decay", o.weight_decay());
      f(g, "nesterov", o.nesterov() ? 1.0 : 0.0);
    }
  }
}

} // namespace

struct GraphedStep::Impl {
  Function step;
  std::vector<torch::Tensor> inputs;
  std::vector<torch::optim::Optimizer*> optimizers;
  GraphedStepOptions options;
  int64_t calls = 0;
  torch::Tensor loss; // the captured step's output
#if LAMP_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> side;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  size_t memsets = 0; // memset nodes of the graph made kernels
  at::cuda::MempoolId_t pool{0, 0}; // the graph's private memory pool
#endif

  std::vector<double> captured_hyperparameters; // of all optimizers, in order
  detail::KeptCasts kept_casts; // keep_kept_casts()
  // The process groups whose collectives the graph holds. See Note
  // [Watching collectives] (src/dist/watchdog.h).
  std::vector<std::weak_ptr<dist::detail::Backend>> collectives;

  // Before a replay: a group that was aborted (its communicator is gone,
  // and the graph holds it) or destroyed must not be replayed.
  void check_collectives() const {
    for (const auto& weak : collectives) {
      const auto backend = weak.lock();
      TORCH_CHECK_WITH(
          DistBackendError,
          backend,
          "lamp::GraphedStep: the captured step holds collectives of a "
          "process group that was destroyed; call reset() to capture the "
          "step again with the group in use.");
      backend->check();
    }
  }

  // After a replay on `stream`: its collectives must complete in time.
  void watch_replay(const c10::Stream& stream) const {
    for (const auto& weak : collectives) {
      if (const auto backend = weak.lock()) {
        backend->watch_replay(stream);
      }
    }
  }

  // Learning rates live in device tensors that the captured kernels read;
  // bring them up to date before the graph runs.
  void sync_learning_rates() {
    for (auto* optimizer : optimizers) {
      static_cast<optim::FusedOptimizer*>(optimizer)->sync_device_lr();
    }
  }

  // The kept weight casts that the captured step writes (and its forward
  // reads): held, so that the memory the graph writes stays theirs.
  void keep_kept_casts() {
    kept_casts.clear();
    for (auto* optimizer : optimizers) {
      auto in_use =
          static_cast<optim::FusedOptimizer*>(optimizer)->kept_casts_in_use();
      kept_casts.insert(kept_casts.end(), in_use.begin(), in_use.end());
    }
  }

  void record_hyperparameters() {
    captured_hyperparameters.clear();
    for (auto* optimizer : optimizers) {
      for_each_hyperparameter(*optimizer, [&](size_t, const char*, double v) {
        captured_hyperparameters.push_back(v);
      });
    }
  }

  // Other hyperparameters are kernel arguments in the graph: a change
  // (e.g. OneCycleLR cycling beta1 or momentum) would silently not apply.
  void check_hyperparameters() const {
    size_t k = 0;
    for (size_t i = 0; i < optimizers.size(); ++i) {
      for_each_hyperparameter(
          *optimizers[i], [&](size_t group, const char* name, double now) {
            const double then = k < captured_hyperparameters.size()
                ? captured_hyperparameters[k]
                : now;
            ++k;
            TORCH_CHECK(
                now == then,
                "lamp::GraphedStep: optimizer #",
                i,
                ", param group ",
                group,
                ": ",
                name,
                " changed from ",
                then,
                " to ",
                now,
                " after the step was captured. A captured step bakes in "
                "every hyperparameter but the learning rate: call reset() "
                "after such a change (the next call captures again), or keep "
                "it fixed (e.g. OneCycleLR with cycle_momentum = false).");
          });
    }
  }

#if LAMP_WITH_CUDA
  // One eager step on the side stream, ordered after and before the
  // caller's stream.
  torch::Tensor warm_up() {
    const auto current = c10::cuda::getCurrentCUDAStream();
    c10::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(*side);
    torch::Tensor out;
    {
      c10::cuda::CUDAStreamGuard on_side(*side);
      out = step(inputs);
    }
    c10::cuda::CUDAEvent done;
    done.record(*side);
    done.block(current);
    if (out.defined() && out.is_cuda()) {
      out.record_stream(current);
    }
    return out;
  }

  void capture() {
    // NOTE: as torch.cuda.graph: the capture starts from an idle device, so
    // that the capturing stream needs no event from outside the capture.
    torch::cuda::synchronize();
    // NOTE: and, as torch.cuda.graph, with the caching allocator's free
    // blocks given back to the driver: the warm-up steps' activations stay
    // cached otherwise while the graph's private pool allocates its own
    // (GPT-2 124M at batch 16: the process held 14.8 GiB graphed, 8.4
    // eager).
    c10::cuda::CUDACachingAllocator::emptyCache();
    // NOTE: keep_graph: capture_end leaves the graph uninstantiated, so
    // that its memset nodes can become kernels first (Note [Memset nodes]).
    graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    c10::cuda::CUDAStreamGuard on_side(*side);
    // NOTE: our own pool id: a failed capture cannot tell its pool.
    pool = at::cuda::graph_pool_handle();
    // NOTE: thread-local capture mode: other threads of the process may go on
    // using CUDA on their own streams while this thread captures (e.g.
    // lamp::data::ImageLoader's copy thread allocating, copying and
    // synchronising its stream). In the default global mode any such call
    // from any thread invalidates the capture ("operation failed due to a
    // previous error during capture"). This thread's own step is held to
    // the same rules either way.
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    // The process groups that enqueue collectives during this capture note
    // themselves under its id (Note [Watching collectives]).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    C10_CUDA_CHECK(cudaStreamGetCaptureInfo(*side, &status, &capture_id));
    try {
      loss = step(inputs);
    } catch (const std::exception& e) {
      (void)dist::detail::take_captured_collectives(capture_id);
      abandon_capture();
      TORCH_CHECK(
          false,
          "lamp::GraphedStep: the step could not be captured in a CUDA "
          "graph: ",
          first_line(e.what()),
          "\nA captured step must not synchronise with the host: no "
          ".item(), .cpu(), printing of tensors, "
          "torch::cuda::synchronize(), data-dependent shapes (nonzero, "
          "masked_select) or DDP's find_unused_parameters inside it; read "
          "the returned loss outside the step instead.");
    }
    collectives = dist::detail::take_captured_collectives(capture_id);
    try {
      graph->capture_end();
    } catch (const std::exception& e) {
      collectives.clear();
      abandon_capture();
      TORCH_CHECK(
          false,
          "lamp::GraphedStep: capturing the step in a CUDA graph failed: ",
          first_line(e.what()),
          "\nSomething in the step synchronised with the host or used "
          "another stream without ordering it after the capturing one.");
    }
    TORCH_CHECK(
        loss.defined(),
        "lamp::GraphedStep: the step returned an undefined tensor; return "
        "the loss.");
    if (options.memset_kernels()) {
      const c10::cuda::CUDAGuard on_device(side->device_index());
      const cudaError_t error =
          detail::replace_memset_nodes(graph->raw_cuda_graph(), &memsets);
      if (error != cudaSuccess) {
        (void)cudaGetLastError();
        graph.reset();
        loss = torch::Tensor();
        TORCH_CHECK(
            false,
            "lamp::GraphedStep: turning the captured graph's memset nodes "
            "into kernels failed: ",
            cudaGetErrorString(error),
            ". GraphedStepOptions().memset_kernels(false) leaves them as "
            "they are.");
      }
    }
    graph->instantiate();
  }

  // Leaves capture mode after a failed capture so that the stream and the
  // caching allocator are usable again.
  void abandon_capture() noexcept {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(*side, &partial) == cudaSuccess && partial) {
      cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(
          side->device_index(), pool);
      c10::cuda::CUDACachingAllocator::releasePool(side->device_index(), pool);
    } catch (...) { // NOLINT(bugprone-empty-catch): already ended
    }
    graph.reset();
    loss = torch::Tensor();
    // NOTE: the failed capture never ran the CUDA generator's capture
    // epilogue, so the generator still believes a capture is going on and
    // every later random op would throw. An empty capture runs it.
    try {
      at::cuda::CUDAGraph repair;
      repair.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      repair.capture_end();
    } catch (...) { // NOLINT(bugprone-empty-catch): best effort
    }
  }

  static std::string first_line(const std::string& text) {
    return text.substr(0, text.find('\n'));
  }
#endif
};

GraphedStep::GraphedStep(
    Function step,
    const std::vector<torch::Tensor>& example_inputs,
    std::vector<torch::optim::Optimizer*> optimizers,
    GraphedStepOptions options)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(step, "lamp::GraphedStep: the step function is empty.");
  TORCH_CHECK(
      options.warmup_steps() >= 1,
      "lamp::GraphedStepOptions::warmup_steps must be >= 1 (state such as "
      "optimizer moments must exist before the capture), got ",
      options.warmup_steps(),
      ".");
  TORCH_CHECK(
      !optimizers.empty(),
      "lamp::GraphedStep: pass the optimizer(s) the step uses, e.g. "
      "{&optimizer}, so that they can be checked to be graph-safe.");
  for (size_t i = 0; i < optimizers.size(); ++i) {
    TORCH_CHECK(
        optimizers[i] != nullptr,
        "lamp::GraphedStep: optimizer #",
        i,
        " is null.");
    auto* fused = dynamic_cast<optim::FusedOptimizer*>(optimizers[i]);
    TORCH_CHECK(
        fused != nullptr,
        "lamp::GraphedStep: optimizer #",
        i,
        " is not a lamp::optim::FusedOptimizer. torch::optim optimizers "
        "keep their step count on the host (a replayed graph would repeat "
        "the captured step's bias correction forever) and, under "
        "GradScaler, read found_inf on the host, which a CUDA graph cannot "
        "capture. Use lamp::optim::FusedAdam, FusedAdamW or FusedSGD (they "
        "take the same options).");
    fused->use_device_lr(true);
  }
#if LAMP_WITH_CUDA
  std::optional<c10::Device> device;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    const auto& t = example_inputs[i];
    TORCH_CHECK(
        t.defined() && t.is_cuda(),
        "lamp::GraphedStep: example input #",
        i,
        " must be a CUDA tensor (CUDA graphs capture CUDA work); got ",
        t.defined() ? t.device().str() : std::string("an undefined tensor"),
        ".");
    TORCH_CHECK(
        !device || *device == t.device(),
        "lamp::GraphedStep: example inputs on ",
        *device,
        " and ",
        t.device(),
        "; a graph runs on one device.");
    device = t.device();
    impl_->inputs.push_back(t.detach().clone(at::MemoryFormat::Preserve));
  }
  TORCH_CHECK(
      torch::cuda::is_available(),
      "lamp::GraphedStep: CUDA graphs need a CUDA device; none was found. "
      "Call the step function directly instead.");
  const auto index = device ? device->index()
                            : c10::cuda::getCurrentCUDAStream().device_index();
  impl_->side = c10::cuda::getStreamFromPool(false, index);
#else
  (void)example_inputs;
  TORCH_CHECK(
      false,
      "lamp::GraphedStep: this lamp was built without CUDA "
      "(LAMP_WITH_CUDA=OFF); call the step function directly instead.");
#endif
  impl_->step = std::move(step);
  impl_->optimizers = std::move(optimizers);
  impl_->options = options;
}

GraphedStep::~GraphedStep() = default;
GraphedStep::GraphedStep(GraphedStep&&) noexcept = default;
GraphedStep& GraphedStep::operator=(GraphedStep&&) noexcept = default;

torch::Tensor GraphedStep::operator()(const std::vector<torch::Tensor>& batch) {
  auto& impl = *impl_;
  TORCH_CHECK(
      batch.size() == impl.inputs.size(),
      "lamp::GraphedStep: got ",
      batch.size(),
      " input tensors, the step was set up with ",
      impl.inputs.size(),
      ".");
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& in = batch[i];
    const auto& fixed = impl.inputs[i];
    TORCH_CHECK(
        in.defined() && in.sizes() == fixed.sizes() &&
            in.scalar_type() == fixed.scalar_type(),
        "lamp::GraphedStep: input #",
        i,
        " is ",
        in.defined() ? c10::toString(in.scalar_type()) : "undefined",
        in.defined() ? in.sizes() : at::IntArrayRef{},
        " but the step was set up with ",
        c10::toString(fixed.scalar_type()),
        fixed.sizes(),
        ". A CUDA graph replays fixed shapes and dtypes: pad or drop a last "
        "partial batch, or make one GraphedStep per shape.");
    fixed.copy_(in, /*non_blocking=*/true);
  }
#if LAMP_WITH_CUDA
  if (impl.calls < impl.options.warmup_steps()) {
    ++impl.calls;
    return impl.warm_up();
  }
  impl.sync_learning_rates();
  if (!impl.graph) {
    impl.record_hyperparameters();
    impl.capture();
    impl.keep_kept_casts();
  } else {
    impl.check_hyperparameters();
    // Weights changed since the last replay (a checkpoint loaded, an
    // in-place edit): their kept 16-bit copies, which the graph reads, are
    // written again first.
    detail::refresh_kept_casts(impl.kept_casts);
  }
  ++impl.calls;
  impl.check_collectives();
  impl.graph->replay();
  impl.watch_replay(c10::cuda::getCurrentCUDAStream());
  // The replay stepped the parameters in kernels alone: their versions say
  // so, as an eager step's would (src/optim/bump_versions.h).
  for (auto* optimizer : impl.optimizers) {
    for (const auto& group : optimizer->param_groups()) {
      detail::bump_versions(group.params());
    }
  }
  // And it wrote their kept copies (the captured step's kernel did).
  for (const auto& kept : impl.kept_casts) {
    kept->mark_written();
  }
#endif
  return impl.loss;
}

void GraphedStep::reset() {
#if LAMP_WITH_CUDA
  if (impl_->graph) {
    torch::cuda::synchronize(); // the graph's memory may still be in use
    impl_->graph.reset();
  }
  impl_->collectives.clear();
  impl_->kept_casts.clear();
#endif
  impl_->loss = torch::Tensor();
}

bool GraphedStep::is_captured() const {
#if LAMP_WITH_CUDA
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

const std::vector<torch::Tensor>& GraphedStep::static_inputs() const {
  return impl_->inputs;
}

size_t GraphedStep::memset_kernels() const {
#if LAMP_WITH_CUDA
  return impl_->graph ? impl_->memsets : 0;
#else
  return 0;
#endif
}

} // namespace lamp
