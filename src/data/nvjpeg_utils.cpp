#include "nvjpeg_utils.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <exception>

namespace lamp::data::detail {

const char* nvjpeg_status_name(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS:
      return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG:
      return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "an unknown nvJPEG status";
}

void throw_nvjpeg_error(
    nvjpegStatus_t status,
    const char* call,
    const std::string* image,
    const char* file,
    uint32_t line) {
  std::string function(call);
  function = function.substr(0, function.find('('));
  int version[3] = {0, 0, 0};
  nvjpegGetProperty(MAJOR_VERSION, &version[0]);
  nvjpegGetProperty(MINOR_VERSION, &version[1]);
  nvjpegGetProperty(PATCH_LEVEL, &version[2]);
  const std::string what = c10::str(
      nvjpeg_status_name(status),
      " (status ",
      int(status),
      ", nvJPEG ",
      version[0],
      ".",
      version[1],
      ".",
      version[2],
      ")");
  const c10::SourceLocation where{"lamp nvJPEG decoder", file, line};
  if (image == nullptr) {
    throw c10::Error(
        where, c10::str("lamp: nvJPEG's ", function, " failed: ", what));
  }
  switch (status) {
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      throw c10::NotImplementedError(
          where,
          c10::str(
              "lamp: ",
              *image,
              " is unsupported by nvJPEG (",
              function,
              ": ",
              what,
              "); decode it on the CPU (lamp::data::decode_image)"));
    case NVJPEG_STATUS_BAD_JPEG:
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      throw c10::ValueError(
          where,
          c10::str(
              "lamp: cannot decode ",
              *image,
              " on the GPU: nvJPEG's ",
              function,
              " found a corrupt or truncated JPEG: ",
              what));
    default:
      throw c10::Error(
          where,
          c10::str(
              "lamp: nvJPEG's ", function, " failed on ", *image, ": ", what));
  }
}

CachingDeviceMemory::CachingDeviceMemory(c10::DeviceIndex device)
    : device_(device) {
  allocator_.dev_malloc = &CachingDeviceMemory::allocate;
  allocator_.dev_free = &CachingDeviceMemory::release;
  allocator_.dev_ctx = this;
}

void StreamBlocks::use_stream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
    streams_.push_back(stream);
  }
}

void StreamBlocks::add(c10::DataPtr block) {
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = block.get();
  blocks_.emplace(ptr, std::move(block));
}

// NOTE: these two are called from inside nvJPEG (C): they return nonzero
// instead of throwing, and nvJPEG reports NVJPEG_STATUS_ALLOCATOR_FAILURE.
int CachingDeviceMemory::allocate(
    void* self,
    void** ptr,
    size_t size,
    cudaStream_t stream) {
  auto* memory = static_cast<CachingDeviceMemory*>(self);
  try {
    c10::cuda::CUDAGuard guard(memory->device_);
    c10::cuda::CUDAStreamGuard stream_guard(
        c10::cuda::getStreamFromExternal(stream, memory->device_));
    c10::DataPtr block = c10::cuda::CUDACachingAllocator::get()->allocate(
        std::max<size_t>(size, 1));
    *ptr = block.get();
    memory->blocks_.add(std::move(block));
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

int CachingDeviceMemory::release(
    void* self,
    void* ptr,
    size_t /*size*/,
    cudaStream_t stream) {
  auto* memory = static_cast<CachingDeviceMemory*>(self);
  if (ptr == nullptr) {
    return 0;
  }
  try {
    c10::cuda::CUDAGuard guard(memory->device_);
    const auto record = [&](const c10::DataPtr& block, cudaStream_t used) {
      c10::cuda::CUDACachingAllocator::recordStream(
          block, c10::cuda::getStreamFromExternal(used, memory->device_));
    };
    return memory->blocks_.release(ptr, stream, record) ? 0 : 1;
  } catch (const std::exception&) {
    return 1;
  }
}

} // namespace lamp::data::detail
