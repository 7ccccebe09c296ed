#pragma once

// Internal: the allocators of an NvjpegDecoder's nvJPEG handle (its own
// buffers: the hardware engines' state, the CUDA backend's pinned buffers),
// counted. See Note [nvJPEG's own memory] in nvjpeg_memory.cpp.

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <nvjpeg.h>

#include <atomic>
#include <cstdint>

#include "nvjpeg_utils.h"

namespace lamp::data::detail {

/// What an NvjpegDecoder's nvJPEG allocated and freed so far.
struct NvjpegAllocations {
  int64_t device_allocations = 0;
  int64_t device_frees = 0;
  int64_t device_bytes = 0; // asked for, in all
  int64_t pinned_allocations = 0;
  int64_t pinned_frees = 0;
  int64_t pinned_bytes = 0;
  double seconds = 0; // inside these calls, on the calling threads
};

/// nvJPEG's V2 allocators for one handle: device memory from cudaMalloc
/// (as nvJPEG's default), pinned memory from LibTorch's caching host
/// allocator, every call counted. Thread-safe.
class NvjpegMemory {
 public:
  explicit NvjpegMemory(c10::DeviceIndex device);
  NvjpegMemory(const NvjpegMemory&) = delete;
  NvjpegMemory& operator=(const NvjpegMemory&) = delete;

  /// For nvjpegCreateExV2 and nvjpegBuffer*CreateV2; valid while this
  /// object lives.
  nvjpegDevAllocatorV2_t* device_allocator() {
    return &device_;
  }
  nvjpegPinnedAllocatorV2_t* pinned_allocator() {
    return &pinned_;
  }
  /// Notes a stream that nvJPEG's work with these buffers runs on.
  void use_stream(cudaStream_t stream) {
    pinned_blocks_.use_stream(stream);
  }
  NvjpegAllocations counts() const;

 private:
  static int device_malloc(void* self, void** ptr, size_t size, cudaStream_t);
  static int device_free(void* self, void* ptr, size_t size, cudaStream_t);
  static int pinned_malloc(void* self, void** ptr, size_t size, cudaStream_t);
  static int pinned_free(void* self, void* ptr, size_t size, cudaStream_t);
  void add_time(double seconds);

  c10::DeviceIndex device_index_;
  nvjpegDevAllocatorV2_t device_{};
  nvjpegPinnedAllocatorV2_t pinned_{};
  StreamBlocks pinned_blocks_;
  std::atomic<int64_t> device_allocations_{0};
  std::atomic<int64_t> device_frees_{0};
  std::atomic<int64_t> device_bytes_{0};
  std::atomic<int64_t> pinned_allocations_{0};
  std::atomic<int64_t> pinned_frees_{0};
  std::atomic<int64_t> pinned_bytes_{0};
  std::atomic<int64_t> nanoseconds_{0};
};

} // namespace lamp::data::detail
