#pragma once

// Internal: the state of a lamp::data::detail::NvjpegDecoder (its nvJPEG
// handle, the hardware engines' state, the CUDA backend's slots and
// bitstream handles), shared by nvjpeg_decoder.cpp (the public methods:
// one batch's orchestration) and nvjpeg_backends.cpp (set-up, teardown and
// each backend's decode). See Note [nvJPEG streams and threads] in
// nvjpeg_decoder.cpp.

#include "nvjpeg_decoder.h"
#include "nvjpeg_memory.h"
#include "nvjpeg_utils.h"

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include <memory>
#include <string>
#include <vector>

namespace lamp::data::detail {

constexpr size_t kSlots = 8;

// Flags of every event a decoder's thread waits on: see Note [nvJPEG streams
// and threads] (why the waits block rather than spin).
unsigned int wait_event_flags();

// The CUDA backend's resources for one image in flight.
struct Slot {
  nvjpegJpegState_t state = nullptr;
  nvjpegBufferPinned_t pinned = nullptr;
  cudaEvent_t done = nullptr;
};

// Destroys what `s` holds (made anew by Impl::slot() on its next turn).
inline void release(Slot& s) {
  if (s.done != nullptr) {
    cudaEventDestroy(s.done);
  }
  if (s.state != nullptr) {
    nvjpegJpegStateDestroy(s.state);
  }
  if (s.pinned != nullptr) {
    nvjpegBufferPinnedDestroy(s.pinned);
  }
  s = Slot{};
}

struct ImageInfo {
  int64_t height = 0;
  int64_t width = 0;
  bool hardware = false;
};

struct NvjpegDecoder::Impl {
  c10::DeviceIndex device = 0;
  int max_batch_size = 0;
  NvjpegDecoderOptions options;
  // The handle's allocators (its buffers, the slots' pinned buffers): made
  // before and destroyed after every nvJPEG object below (~Impl releases
  // those first). See Note [nvJPEG's own memory].
  std::unique_ptr<NvjpegMemory> own_memory;
  nvjpegHandle_t handle = nullptr;
  bool hardware = false;
  int hardware_failures = 0; // batches in a row
  nvjpegJpegState_t hardware_state = nullptr;
  cudaEvent_t hardware_done = nullptr;
  // Recorded on the caller's stream for the hardware engines' host barrier.
  cudaEvent_t stream_idle = nullptr;
  nvjpegJpegDecoder_t decoder = nullptr;
  nvjpegDecodeParams_t params = nullptr;
  // The engines' per-image parameters (ROI), made on first use.
  std::vector<nvjpegDecodeParams_t> hardware_params;
  std::unique_ptr<CachingDeviceMemory> memory;
  nvjpegBufferDevice_t device_buffer = nullptr;
  std::vector<Slot> slots;
  size_t next_slot = 0;
  // Two sets of bitstream handles, used by alternate batches.
  std::vector<nvjpegJpegStream_t> bitstreams[2];
  cudaEvent_t batch_done[2] = {nullptr, nullptr};
  int batch_parity = 0;
  cudaStream_t last_stream = nullptr;
  int64_t hardware_count = 0;
  int64_t cuda_count = 0;
  double cuda_seconds = 0;
  // The largest allocation allocate_outputs has made (bytes).
  int64_t largest_outputs = 0;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();
  void init();
  Slot& slot();
  void retire(Slot& s, cudaStream_t stream);
  void renew(nvjpegJpegStream_t& bitstream);
  // out[i] = a uint8 [h, w, 3] tensor on the device for each image not
  // `failed`: views of one allocation from the caching allocator (the
  // current stream's).
  void allocate_outputs(
      const std::vector<std::pair<int64_t, int64_t>>& shapes,
      const std::vector<char>& failed,
      std::vector<at::Tensor>& out);
  ImageInfo inspect(
      nvjpegJpegStream_t bitstream,
      const uint8_t* data,
      size_t size,
      const std::string& name);
  bool decode_hardware(
      const std::vector<size_t>& ids,
      const std::vector<const uint8_t*>& data,
      const std::vector<size_t>& sizes,
      const std::vector<std::string>& names,
      const std::vector<CropBox>* regions,
      std::vector<torch::Tensor>& out,
      cudaStream_t stream);
  void decode_cuda(
      nvjpegJpegStream_t& bitstream,
      const uint8_t* data,
      size_t size,
      const std::string& name,
      const CropBox* region,
      torch::Tensor& out,
      cudaStream_t stream);
};

} // namespace lamp::data::detail
