#pragma once

// Internal: nvJPEG's own allocations (its handle's buffers: the hardware
// engines' state; the CUDA backend's pinned buffers) made with cudaMalloc
// and cudaHostAlloc as nvJPEG's default allocators make them, through
// allocators of lamp's that count and time them. A buffer that grows is
// freed and allocated anew, and cudaFree / cudaFreeHost wait for the whole
// device (the training step's queued work too): how often that happens in
// a run is what these counts show.

#include <nvjpeg.h>

#include <atomic>
#include <cstdint>

namespace lamp::data::detail {

/// What an NvjpegDecoder's nvJPEG allocated and freed so far.
struct NvjpegAllocations {
  int64_t device_allocations = 0;
  int64_t device_frees = 0;
  int64_t device_bytes = 0; // allocated, in all
  int64_t pinned_allocations = 0;
  int64_t pinned_frees = 0;
  int64_t pinned_bytes = 0;
  double seconds = 0; // inside these calls, on the calling threads
};

/// nvJPEG's V2 device and pinned allocators on cudaMalloc / cudaFree and
/// cudaHostAlloc / cudaFreeHost (what nvJPEG does by default), counted.
/// Thread-safe.
class CountedMemory {
 public:
  CountedMemory();
  CountedMemory(const CountedMemory&) = delete;
  CountedMemory& operator=(const CountedMemory&) = delete;

  /// For nvjpegCreateExV2 / nvjpegBufferPinnedCreateV2; valid while this
  /// object lives.
  nvjpegDevAllocatorV2_t* device_allocator() {
    return &device_;
  }
  nvjpegPinnedAllocatorV2_t* pinned_allocator() {
    return &pinned_;
  }
  NvjpegAllocations counts() const;

 private:
  static int device_malloc(void* self, void** ptr, size_t size, cudaStream_t);
  static int device_free(void* self, void* ptr, size_t size, cudaStream_t);
  static int pinned_malloc(void* self, void** ptr, size_t size, cudaStream_t);
  static int pinned_free(void* self, void* ptr, size_t size, cudaStream_t);
  void add_time(double seconds);

  nvjpegDevAllocatorV2_t device_{};
  nvjpegPinnedAllocatorV2_t pinned_{};
  std::atomic<int64_t> device_allocations_{0};
  std::atomic<int64_t> device_frees_{0};
  std::atomic<int64_t> device_bytes_{0};
  std::atomic<int64_t> pinned_allocations_{0};
  std::atomic<int64_t> pinned_frees_{0};
  std::atomic<int64_t> pinned_bytes_{0};
  std::atomic<int64_t> nanoseconds_{0};
};

} // namespace lamp::data::detail
