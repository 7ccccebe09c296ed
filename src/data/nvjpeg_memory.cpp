#include "nvjpeg_memory.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <exception>

namespace lamp::data::detail {

// Note [nvJPEG's own memory]
// nvJPEG grows its buffers as it meets larger images and batches: it frees
// the old buffer and allocates a larger one. With nvJPEG's default
// allocators a pinned buffer is freed with cudaFreeHost, which waits for
// the whole device, the training step's queued work too: measured on an
// H200 under ResNet-50 training, 20-30 ms a call, 35-59 calls in a
// three-epoch run on 6,000 photographs (most in the first), each stalling
// a stage thread (docs/design/image-loader.md). A loader thread should not
// wait for the training step, so the pinned buffers come from LibTorch's
// caching host allocator: a freed block goes back to its cache, not to the
// driver, and is handed out again only once the work queued before the
// free, on every stream this decoder ran on, is done (events recorded at
// the free), as for a pinned tensor. Its sizes are powers of two, so a
// buffer that grows grows less often.
//
// Device buffers stay with cudaMalloc / cudaFree, as nvJPEG's defaults: the
// hardware engines' writes do not follow stream order (Note [nvJPEG streams
// and threads]), so their state's memory must never be handed to other work
// while they may still write it, which cudaFree's device-wide wait ensures.
// (On nvJPEG 13.3 the engines' state allocated no device memory through
// this allocator in a run: the CUDA backend's device buffer has an
// allocator of its own, CachingDeviceMemory.)

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

} // namespace

NvjpegMemory::NvjpegMemory(c10::DeviceIndex device) : device_index_(device) {
  device_.dev_malloc = &NvjpegMemory::device_malloc;
  device_.dev_free = &NvjpegMemory::device_free;
  device_.dev_ctx = this;
  pinned_.pinned_malloc = &NvjpegMemory::pinned_malloc;
  pinned_.pinned_free = &NvjpegMemory::pinned_free;
  pinned_.pinned_ctx = this;
}

NvjpegAllocations NvjpegMemory::counts() const {
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

void NvjpegMemory::add_time(double seconds) {
  nanoseconds_ += static_cast<int64_t>(seconds * 1e9);
}

// NOTE: these four are called from inside nvJPEG (C): they return nonzero
// on failure (nvJPEG reports NVJPEG_STATUS_ALLOCATOR_FAILURE) and never
// throw.
int NvjpegMemory::device_malloc(
    void* self,
    void** ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<NvjpegMemory*>(self);
  const auto t = Clock::now();
  c10::cuda::CUDAGuard guard(m->device_index_);
  const cudaError_t e = cudaMalloc(ptr, size);
  const double s = since(t);
  m->add_time(s);
  ++m->device_allocations_;
  m->device_bytes_ += static_cast<int64_t>(size);
  return static_cast<int>(e);
}

int NvjpegMemory::device_free(
    void* self,
    void* ptr,
    size_t /*size*/,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<NvjpegMemory*>(self);
  const auto t = Clock::now();
  const cudaError_t e = cudaFree(ptr);
  const double s = since(t);
  m->add_time(s);
  ++m->device_frees_;
  return static_cast<int>(e);
}

int NvjpegMemory::pinned_malloc(
    void* self,
    void** ptr,
    size_t size,
    cudaStream_t /*stream*/) {
  auto* m = static_cast<NvjpegMemory*>(self);
  try {
    const auto t = Clock::now();
    c10::cuda::CUDAGuard guard(m->device_index_);
    c10::DataPtr block =
        at::getHostAllocator(at::kCUDA)->allocate(std::max<size_t>(size, 1));
    *ptr = block.get();
    m->pinned_blocks_.add(std::move(block));
    const double s = since(t);
    m->add_time(s);
    ++m->pinned_allocations_;
    m->pinned_bytes_ += static_cast<int64_t>(size);
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

int NvjpegMemory::pinned_free(
    void* self,
    void* ptr,
    size_t /*size*/,
    cudaStream_t stream) {
  auto* m = static_cast<NvjpegMemory*>(self);
  if (ptr == nullptr) {
    return 0;
  }
  try {
    const auto t = Clock::now();
    c10::cuda::CUDAGuard guard(m->device_index_);
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    // See Note [nvJPEG's own memory]: the block waits for these streams'
    // work before its next use.
    const auto record = [&](const c10::DataPtr& block, cudaStream_t used) {
      host->record_event(
          block.get(),
          block.get_context(),
          c10::cuda::getStreamFromExternal(used, m->device_index_).unwrap());
    };
    if (!m->pinned_blocks_.release(ptr, stream, record)) {
      return 1;
    }
    const double s = since(t);
    m->add_time(s);
    ++m->pinned_frees_;
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

} // namespace lamp::data::detail
