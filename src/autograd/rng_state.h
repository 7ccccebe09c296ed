#pragma once

// The default random number generators' states, taken before a checkpointed
// forward call and put back for its recompute (lamp::checkpoint), so that
// dropout drops the same elements twice. See Note [Random numbers of a
// recompute inside a CUDA graph capture].

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace lamp::autograd {

class RngState {
 public:
  /// The states of the CPU's default generator and of the default
  /// generators of `cuda_devices` (each listed once), now.
  static RngState take(const std::vector<c10::Device>& cuda_devices);

  /// Sets the generators to this state and returns the state they had, for
  /// `restore` after the recompute.
  RngState swap_in() const;

  /// Sets the generators to this state.
  void restore() const;

 private:
  struct Cuda {
    c10::DeviceIndex index = 0;
    // Outside a capture: the generator's state as get_state() gives it.
    at::Tensor state;
    // Inside a capture: the offset into the captured graph's random
    // numbers (the state a captured kernel reads is the graph's).
    bool capturing = false;
    uint64_t offset_intragraph = 0;
  };
  at::Tensor cpu_;
  std::vector<Cuda> cuda_;
};

} // namespace lamp::autograd
