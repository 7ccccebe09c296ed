#pragma once

// Internal: nvJPEG status checks, the registry of the blocks lamp's allocators
// hand nvJPEG, and the device allocator that puts nvJPEG's CUDA-backend
// buffer in LibTorch's caching allocator.

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <nvjpeg.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace lamp::data::detail {

/// The name of an nvJPEG status ("NVJPEG_STATUS_BAD_JPEG"); nvJPEG has no
/// error strings of its own.
const char* nvjpeg_status_name(nvjpegStatus_t status);

/// Throws for a failed nvJPEG call: c10::Error saying which call, which
/// status and which nvJPEG. With `image` (the file's name): a corrupt or
/// truncated JPEG is a c10::ValueError naming the file, a JPEG nvJPEG does
/// not support a c10::NotImplementedError saying "unsupported by nvJPEG".
[[noreturn]] void throw_nvjpeg_error(
    nvjpegStatus_t status,
    const char* call,
    const std::string* image,
    const char* file,
    uint32_t line);

/// Every nvJPEG call goes through one of these.
#define LAMP_NVJPEG_CHECK(call)                                               \
  do {                                                                        \
    const nvjpegStatus_t lamp_nvjpeg_status_ = (call);                        \
    if (lamp_nvjpeg_status_ != NVJPEG_STATUS_SUCCESS) {                       \
      ::lamp::data::detail::throw_nvjpeg_error(                               \
          lamp_nvjpeg_status_, #call, nullptr, __FILE__, uint32_t(__LINE__)); \
    }                                                                         \
  } while (0)

/// For calls about one image, named `name` in the error.
#define LAMP_NVJPEG_CHECK_IMAGE(call, name)                                   \
  do {                                                                        \
    const nvjpegStatus_t lamp_nvjpeg_status_ = (call);                        \
    if (lamp_nvjpeg_status_ != NVJPEG_STATUS_SUCCESS) {                       \
      ::lamp::data::detail::throw_nvjpeg_error(                               \
          lamp_nvjpeg_status_, #call, &(name), __FILE__, uint32_t(__LINE__)); \
    }                                                                         \
  } while (0)

/// The blocks an allocator of lamp's handed to nvJPEG, by address, and the
/// streams nvJPEG's work with them ran on: at a free, the block is to wait
/// for each of those streams' queued work before it is used again (the
/// caching allocators' recordStream / record_event). Thread-safe.
class StreamBlocks {
 public:
  /// Notes a stream that nvJPEG's work with these blocks runs on.
  void use_stream(cudaStream_t stream);
  void add(c10::DataPtr block);
  /// Calls record(block, s) for every stream noted and for `also` (if not
  /// null), each once, then drops the block; false if `ptr` is not one.
  template <class Record>
  bool release(void* ptr, cudaStream_t also, Record&& record) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      return false;
    }
    for (cudaStream_t used : streams_) {
      record(it->second, used);
    }
    if (also != nullptr &&
        std::find(streams_.begin(), streams_.end(), also) == streams_.end()) {
      record(it->second, also);
    }
    blocks_.erase(it);
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, c10::DataPtr> blocks_;
  std::vector<cudaStream_t> streams_;
};

/// nvJPEG's stream-aware device allocator (nvjpegDevAllocatorV2_t) on
/// LibTorch's CUDA caching allocator: a block is allocated on the stream
/// nvJPEG names, and freed after every stream that decode() ran on has been
/// recorded on it (the caching allocator may give a freed block to the next
/// allocation on its own stream at once; recorded streams hold it until
/// their work is done). Thread-safe.
class CachingDeviceMemory {
 public:
  explicit CachingDeviceMemory(c10::DeviceIndex device);
  CachingDeviceMemory(const CachingDeviceMemory&) = delete;
  CachingDeviceMemory& operator=(const CachingDeviceMemory&) = delete;

  /// For nvjpegBufferDeviceCreateV2; valid while this object lives.
  nvjpegDevAllocatorV2_t* allocator() {
    return &allocator_;
  }
  /// Notes a stream that nvJPEG's work with these blocks runs on.
  void use_stream(cudaStream_t stream) {
    blocks_.use_stream(stream);
  }

 private:
  static int allocate(void* self, void** ptr, size_t size, cudaStream_t s);
  static int release(void* self, void* ptr, size_t size, cudaStream_t s);

  c10::DeviceIndex device_;
  nvjpegDevAllocatorV2_t allocator_{};
  StreamBlocks blocks_;
};

} // namespace lamp::data::detail
