#include "nvjpeg_counted_memory.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace lamp::data::detail {
namespace {

using Clock = std::chrono::steady_clock;

// TEMPORARY (an A/B diagnostic, to be removed): LAMP_NVJPEG_TRACE=1 prints
// every allocation and free with the time since the first.
bool tracing() {
  static const bool on = [] {
    const char* v = std::getenv("LAMP_NVJPEG_TRACE");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

void trace(const char* what, size_t size, double seconds) {
  if (!tracing()) {
    return;
  }
  static const Clock::time_point start = Clock::now();
  std::fprintf(
      stderr,
      "[lamp nvjpeg] %.3f s %s %zu bytes %.3f ms\n",
      std::chrono::duration<double>(Clock::now() - start).count(),
      what,
      size,
      seconds * 1e3);
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

} // namespace

CountedMemory::CountedMemory() {
  device_.dev_malloc = &CountedMemory::device_malloc;
  device_.dev_free = &CountedMemory::device_free;
  device_.dev_ctx = this;
  pinned_.pinned_malloc = &CountedMemory::pinned_malloc;
  pinned_.pinned_free = &CountedMemory::pinned_free;
  pinned_.pinned_ctx = this;
}

NvjpegAllocations CountedMemory::counts() const {
  NvjpegAllocations c;
  c.device_allocations = device_allocations_.load();
  c.device_frees = device_frees_.load();
  c.device_bytes = device_bytes_.load();
  c.pinned_allocations = pinned_allocations_.load();
  c.pinned_frees = pinned_frees_.load();
  c.pinned_bytes = pinned_bytes_.load();
  c.seconds = static_cast<double>(nanoseconds_.load()) * 1e-9;
  return c;
}

void CountedMemory::add_time(double seconds) {
  nanoseconds_ += static_cast<int64_t>(seconds * 1e9);
}

// NOTE: these are called from inside nvJPEG (C): they return the CUDA
// status (nonzero: nvJPEG reports NVJPEG_STATUS_ALLOCATOR_FAILURE) and never
// throw. nvJPEG calls them with its handle's device current.
int CountedMemory::device_malloc(
    void* self,
    void** ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<CountedMemory*>(self);
  const auto t = Clock::now();
  const cudaError_t e = cudaMalloc(ptr, size);
  const double s = since(t);
  m->add_time(s);
  ++m->device_allocations_;
  m->device_bytes_ += static_cast<int64_t>(size);
  trace("device malloc", size, s);
  return static_cast<int>(e);
}

int CountedMemory::device_free(
    void* self,
    void* ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<CountedMemory*>(self);
  const auto t = Clock::now();
  const cudaError_t e = cudaFree(ptr);
  const double s = since(t);
  m->add_time(s);
  ++m->device_frees_;
  trace("device free", size, s);
  return static_cast<int>(e);
}

int CountedMemory::pinned_malloc(
    void* self,
    void** ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<CountedMemory*>(self);
  const auto t = Clock::now();
  const cudaError_t e = cudaHostAlloc(ptr, size, cudaHostAllocDefault);
  const double s = since(t);
  m->add_time(s);
  ++m->pinned_allocations_;
  m->pinned_bytes_ += static_cast<int64_t>(size);
  trace("pinned malloc", size, s);
  return static_cast<int>(e);
}

int CountedMemory::pinned_free(
    void* self,
    void* ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<CountedMemory*>(self);
  const auto t = Clock::now();
  const cudaError_t e = cudaFreeHost(ptr);
  const double s = since(t);
  m->add_time(s);
  ++m->pinned_frees_;
  trace("pinned free", size, s);
  return static_cast<int>(e);
}

} // namespace lamp::data::detail
