#include "rng_state.h"

#include <lamp/config.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <mutex>

namespace lamp::autograd {

// Note [Random numbers of a recompute inside a CUDA graph capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA kernel that draws random numbers (dropout, flash attention's
// dropout) asks its generator for a Philox (seed, offset) and moves the
// offset on. Outside a capture the pair is the generator's state, which
// get_state()/set_state() read and write (torch.utils.checkpoint does just
// that). Inside a capture the kernel is given pointers to the graph's seed
// and base offset, filled before each replay, plus an offset *into* the
// graph's numbers (CUDAGeneratorState::offset_intragraph_); get_state() and
// set_state() refuse to run then. To replay a forward call's numbers in a
// captured recompute, that intragraph offset has to be put back for the
// recompute and then forward again, and ATen (2.11) has no public call for
// it: CUDAGeneratorImpl keeps the state in a private member. We reach it
// through the explicit-instantiation rule ([temp.spec] allows naming a
// private member in an explicit instantiation), one member, read and written
// only while capturing, with the generator's mutex held. The graph's
// wholegraph increment is the largest offset reached, so a recompute that
// rewinds and replays leaves it correct. Tested by CheckpointGpu.* (the
// recompute's dropout masks against the forward call's, inside GraphedStep).
#if LAMP_WITH_CUDA
namespace {

using StateMember =
    c10::intrusive_ptr<at::CUDAGeneratorState> at::CUDAGeneratorImpl::*;

StateMember cuda_generator_state();

template <StateMember Member>
struct StateAccess {
  friend StateMember cuda_generator_state() {
    return Member;
  }
};
template struct StateAccess<&at::CUDAGeneratorImpl::state_>;

at::CUDAGeneratorState& state_of(at::CUDAGeneratorImpl* gen) {
  return *(gen->*cuda_generator_state());
}

bool capturing_on(c10::DeviceIndex index) {
  c10::cuda::CUDAGuard guard(index);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() !=
      c10::cuda::CaptureStatus::None;
}

} // namespace
#endif

RngState RngState::take(const std::vector<c10::Device>& cuda_devices) {
  RngState s;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu_ = gen.get_state();
  }
#if LAMP_WITH_CUDA
  for (const auto& device : cuda_devices) {
    TORCH_INTERNAL_ASSERT(device.is_cuda());
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    Cuda c;
    c.index = device.index();
    c.capturing = capturing_on(c.index);
    if (c.capturing) {
      c.offset_intragraph =
          state_of(at::check_generator<at::CUDAGeneratorImpl>(gen))
              .offset_intragraph_;
    } else {
      c.state = gen.get_state();
    }
    s.cuda_.push_back(std::move(c));
  }
#else
  TORCH_INTERNAL_ASSERT(cuda_devices.empty());
#endif
  return s;
}

void RngState::restore() const {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(cpu_);
  }
#if LAMP_WITH_CUDA
  for (const auto& c : cuda_) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(c.index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    TORCH_CHECK(
        c.capturing == capturing_on(c.index),
        "lamp::checkpoint: the forward call ran ",
        c.capturing ? "inside" : "outside",
        " a CUDA graph capture and its recompute ",
        c.capturing ? "outside" : "inside",
        " one, so the recompute cannot replay its random numbers; run the "
        "forward and backward passes in the same captured step (GraphedStep), "
        "or pass CheckpointOptions().preserve_rng_state(false)");
    if (c.capturing) {
      state_of(at::check_generator<at::CUDAGeneratorImpl>(gen))
          .offset_intragraph_ = c.offset_intragraph;
    } else {
      gen.set_state(c.state);
    }
  }
#endif
}

RngState RngState::swap_in() const {
  std::vector<c10::Device> devices;
  for (const auto& c : cuda_) {
    devices.emplace_back(c10::kCUDA, c.index);
  }
  auto now = take(devices);
  restore();
  return now;
}

} // namespace lamp::autograd
