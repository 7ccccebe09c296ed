// NvjpegDecoder's set-up, teardown and backends: the hardware engines'
// batched decode, the CUDA backend's decoupled decode a slot at a time, and
// the header checks that route each image. See Note [nvJPEG streams and
// threads] in nvjpeg_decoder.cpp.

#include "jpeg_markers.h"
#include "nvjpeg_impl.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <optional>

namespace lamp::data::detail {
namespace {

// Why nvJPEG cannot decode a well-formed JPEG of this layout (nullptr if it
// can).
const char* unsupported_reason(const JpegLayout& layout) {
  switch (layout.frame_type) {
    case 0:
    case 1:
    case 2:
      break;
    case 3:
      return "lossless JPEG";
    case 5:
    case 6:
    case 7:
      return "hierarchical JPEG";
    default:
      return "arithmetic-coded JPEG";
  }
  if (layout.precision != 8) {
    return "samples of other than 8 bits";
  }
  if (layout.components == 4) {
    return "4 components (CMYK or YCCK)";
  }
  if (layout.components != 1 && layout.components != 3) {
    return "a number of components other than 1, 3 or 4";
  }
  if (layout.rgb) {
    return "3 components in RGB colour space (no YCbCr conversion)";
  }
  if (layout.width == 0 || layout.height == 0) {
    return "a height given by a DNL marker";
  }
  return nullptr;
}

} // namespace

unsigned int wait_event_flags() {
  return cudaEventDisableTiming | cudaEventBlockingSync;
}

void NvjpegDecoder::Impl::init() {
  own_memory = std::make_unique<NvjpegMemory>(device);
  nvjpegStatus_t status = NVJPEG_STATUS_ARCH_MISMATCH;
  if (options.hardware()) {
    status = nvjpegCreateExV2(
        NVJPEG_BACKEND_HARDWARE,
        own_memory->device_allocator(),
        own_memory->pinned_allocator(),
        NVJPEG_FLAGS_DEFAULT,
        &handle);
    if (status != NVJPEG_STATUS_SUCCESS) {
      handle = nullptr;
    } else {
      status = nvjpegJpegStateCreate(handle, &hardware_state);
      if (status != NVJPEG_STATUS_SUCCESS) {
        hardware_state = nullptr;
        nvjpegDestroy(handle);
        handle = nullptr;
      }
    }
  }
  hardware = status == NVJPEG_STATUS_SUCCESS;
  if (!hardware) {
    // NOTE: GPUs without engines answer ARCH_MISMATCH; any other failure of
    // the hardware backend is worth a warning, not an error: the CUDA
    // backend decodes every JPEG the engines do.
    if (options.hardware() && status != NVJPEG_STATUS_ARCH_MISMATCH &&
        status != NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED &&
        status != NVJPEG_STATUS_JPEG_NOT_SUPPORTED) {
      TORCH_WARN(
          "lamp: nvJPEG's hardware decoder is unavailable on cuda:",
          int(device),
          " (",
          nvjpeg_status_name(status),
          "); decoding with its CUDA backend only");
    }
    LAMP_NVJPEG_CHECK(nvjpegCreateExV2(
        NVJPEG_BACKEND_DEFAULT,
        own_memory->device_allocator(),
        own_memory->pinned_allocator(),
        NVJPEG_FLAGS_DEFAULT,
        &handle));
  }
  if (hardware) {
    C10_CUDA_CHECK(
        cudaEventCreateWithFlags(&hardware_done, wait_event_flags()));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&stream_idle, wait_event_flags()));
  }
  LAMP_NVJPEG_CHECK(
      nvjpegDecoderCreate(handle, NVJPEG_BACKEND_DEFAULT, &decoder));
  LAMP_NVJPEG_CHECK(nvjpegDecodeParamsCreate(handle, &params));
  LAMP_NVJPEG_CHECK(
      nvjpegDecodeParamsSetOutputFormat(params, NVJPEG_OUTPUT_RGBI));
  if (options.caching_allocator()) {
    memory = std::make_unique<CachingDeviceMemory>(device);
    LAMP_NVJPEG_CHECK(nvjpegBufferDeviceCreateV2(
        handle, memory->allocator(), &device_buffer));
  } else {
    LAMP_NVJPEG_CHECK(nvjpegBufferDeviceCreateV2(
        handle, own_memory->device_allocator(), &device_buffer));
  }
  for (int parity = 0; parity < 2; ++parity) {
    C10_CUDA_CHECK(
        cudaEventCreateWithFlags(&batch_done[parity], wait_event_flags()));
    for (int i = 0; i < max_batch_size; ++i) {
      nvjpegJpegStream_t bitstream = nullptr;
      LAMP_NVJPEG_CHECK(nvjpegJpegStreamCreate(handle, &bitstream));
      bitstreams[parity].push_back(bitstream);
    }
  }
}

NvjpegDecoder::Impl::~Impl() {
  if (handle == nullptr) {
    return; // init() did not run, or made nothing
  }
  // NOTE: a destructor cannot throw: wait for the work still queued on the
  // buffers, then release them, ignoring the statuses. Without CUDA (torn
  // down at exit), leave them.
  std::optional<c10::cuda::CUDAGuard> guard;
  try {
    guard.emplace(device);
  } catch (const std::exception&) {
    return;
  }
  for (cudaEvent_t event : {hardware_done, batch_done[0], batch_done[1]}) {
    if (event != nullptr) {
      cudaEventSynchronize(event);
    }
  }
  for (Slot& s : slots) {
    cudaEventSynchronize(s.done);
    release(s);
  }
  for (auto& set : bitstreams) {
    for (nvjpegJpegStream_t bitstream : set) {
      nvjpegJpegStreamDestroy(bitstream);
    }
  }
  for (cudaEvent_t event :
       {hardware_done, stream_idle, batch_done[0], batch_done[1]}) {
    if (event != nullptr) {
      cudaEventDestroy(event);
    }
  }
  if (device_buffer != nullptr) {
    nvjpegBufferDeviceDestroy(device_buffer);
  }
  if (params != nullptr) {
    nvjpegDecodeParamsDestroy(params);
  }
  for (nvjpegDecodeParams_t p : hardware_params) {
    nvjpegDecodeParamsDestroy(p);
  }
  if (decoder != nullptr) {
    nvjpegDecoderDestroy(decoder);
  }
  if (hardware_state != nullptr) {
    nvjpegJpegStateDestroy(hardware_state);
  }
  if (handle != nullptr) {
    nvjpegDestroy(handle);
  }
}

// The next slot, made on first use. See Note [nvJPEG streams and threads].
Slot& NvjpegDecoder::Impl::slot() {
  if (next_slot == slots.size() || slots[next_slot].state == nullptr) {
    Slot s;
    try {
      LAMP_NVJPEG_CHECK(nvjpegDecoderStateCreate(handle, decoder, &s.state));
      LAMP_NVJPEG_CHECK(nvjpegBufferPinnedCreateV2(
          handle, own_memory->pinned_allocator(), &s.pinned));
      LAMP_NVJPEG_CHECK(nvjpegStateAttachPinnedBuffer(s.state, s.pinned));
      LAMP_NVJPEG_CHECK(nvjpegStateAttachDeviceBuffer(s.state, device_buffer));
      C10_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, wait_event_flags()));
    } catch (...) {
      release(s);
      throw;
    }
    if (next_slot == slots.size()) {
      slots.push_back(s);
    } else {
      slots[next_slot] = s;
    }
  }
  Slot& s = slots[next_slot];
  next_slot = (next_slot + 1) % kSlots;
  // The slot's previous image must be done with its state and pinned buffer.
  C10_CUDA_CHECK(cudaEventSynchronize(s.done));
  return s;
}

// After an image failed with slot `s`: its state may be half way through
// that image, so it goes (once the work queued with it has run) and slot()
// makes it anew when its turn comes.
void NvjpegDecoder::Impl::retire(Slot& s, cudaStream_t stream) {
  cudaStreamSynchronize(stream);
  release(s);
}

// After an image failed with `bitstream`: a fresh handle for the next one.
void NvjpegDecoder::Impl::renew(nvjpegJpegStream_t& bitstream) {
  nvjpegJpegStreamDestroy(bitstream);
  bitstream = nullptr;
  LAMP_NVJPEG_CHECK(nvjpegJpegStreamCreate(handle, &bitstream));
}

ImageInfo NvjpegDecoder::Impl::inspect(
    nvjpegJpegStream_t bitstream,
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  TORCH_CHECK_VALUE(
      data != nullptr && size > 0,
      "lamp: cannot decode ",
      name,
      " on the GPU: it is empty");
  // NOTE: what nvJPEG does with a file cut short is undocumented (libjpeg
  // decodes the part it has), and it takes any 3 components for YCbCr: the
  // markers tell, before nvJPEG parses anything.
  const JpegLayout layout = read_jpeg_layout(data, size);
  TORCH_CHECK_VALUE(
      layout.problem.empty(),
      "lamp: cannot decode ",
      name,
      " on the GPU: ",
      layout.problem);
  const char* why = unsupported_reason(layout);
  TORCH_CHECK_NOT_IMPLEMENTED(
      why == nullptr,
      "lamp: ",
      name,
      " is unsupported by nvJPEG (",
      why,
      "); decode it on the CPU (lamp::data::decode_image)");
  // NOTE: the header is enough for the engines; decode_cuda() parses the
  // whole file.
  LAMP_NVJPEG_CHECK_IMAGE(
      nvjpegJpegStreamParseHeader(handle, data, size, bitstream), name);
  unsigned int width = 0;
  unsigned int height = 0;
  LAMP_NVJPEG_CHECK_IMAGE(
      nvjpegJpegStreamGetFrameDimensions(bitstream, &width, &height), name);
  TORCH_CHECK_VALUE(
      int(width) == layout.width && int(height) == layout.height,
      "lamp: cannot decode ",
      name,
      " on the GPU: nvJPEG reads ",
      width,
      "x",
      height,
      " pixels, its frame header ",
      layout.width,
      "x",
      layout.height);
  nvjpegChromaSubsampling_t sampling = NVJPEG_CSS_UNKNOWN;
  LAMP_NVJPEG_CHECK_IMAGE(
      nvjpegJpegStreamGetChromaSubsampling(bitstream, &sampling), name);
  TORCH_CHECK_NOT_IMPLEMENTED(
      sampling != NVJPEG_CSS_UNKNOWN,
      "lamp: ",
      name,
      " is unsupported by nvJPEG (unusual chroma sampling factors); decode "
      "it on the CPU (lamp::data::decode_image)");
  ImageInfo info{int64_t(height), int64_t(width), false};
  // NOTE: the engines take these samplings (nvImageCodec asks the same
  // before nvJPEG's own check). A failed query only means "not for the
  // engines": the CUDA backend decodes the file, or says what is wrong.
  if (hardware &&
      (sampling == NVJPEG_CSS_444 || sampling == NVJPEG_CSS_422 ||
       sampling == NVJPEG_CSS_420 || sampling == NVJPEG_CSS_440 ||
       sampling == NVJPEG_CSS_GRAY)) {
    int supported = -1; // 0 means supported
    info.hardware =
        nvjpegDecodeBatchedSupported(handle, bitstream, &supported) ==
            NVJPEG_STATUS_SUCCESS &&
        supported == 0;
  }
  return info;
}

// Returns false when the engines failed on the batch; the caller then
// decodes it with the CUDA backend.
bool NvjpegDecoder::Impl::decode_hardware(
    const std::vector<size_t>& ids,
    const std::vector<const uint8_t*>& data,
    const std::vector<size_t>& sizes,
    const std::vector<std::string>& names,
    const std::vector<CropBox>* regions,
    std::vector<torch::Tensor>& out,
    cudaStream_t stream) {
  std::vector<const unsigned char*> bytes;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> images(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const size_t i = ids[k];
    bytes.push_back(data[i]);
    lengths.push_back(sizes[i]);
    images[k].channel[0] = out[i].data_ptr<uint8_t>();
    images[k].pitch[0] = size_t(out[i].size(1)) * 3;
  }
  if (regions != nullptr) {
    while (hardware_params.size() < ids.size()) {
      nvjpegDecodeParams_t p = nullptr;
      LAMP_NVJPEG_CHECK(nvjpegDecodeParamsCreate(handle, &p));
      hardware_params.push_back(p);
      LAMP_NVJPEG_CHECK(
          nvjpegDecodeParamsSetOutputFormat(p, NVJPEG_OUTPUT_RGBI));
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      const CropBox& r = (*regions)[ids[k]];
      LAMP_NVJPEG_CHECK(nvjpegDecodeParamsSetROI(
          hardware_params[k],
          int(r.left),
          int(r.top),
          int(r.width),
          int(r.height)));
    }
  }
  // The host barrier of Note [nvJPEG streams and threads]; then the last
  // hardware batch (perhaps on another stream) must be done with the state.
  // (An event rather than cudaStreamSynchronize, so that the wait blocks.)
  C10_CUDA_CHECK(cudaEventRecord(stream_idle, stream));
  C10_CUDA_CHECK(cudaEventSynchronize(stream_idle));
  C10_CUDA_CHECK(cudaEventSynchronize(hardware_done));
  const char* call = "nvjpegDecodeBatchedInitialize";
  nvjpegStatus_t status = nvjpegDecodeBatchedInitialize(
      handle, hardware_state, int(ids.size()), 1, NVJPEG_OUTPUT_RGBI);
  if (status == NVJPEG_STATUS_SUCCESS && regions != nullptr) {
    call = "nvjpegDecodeBatchedEx";
    status = nvjpegDecodeBatchedEx(
        handle,
        hardware_state,
        bytes.data(),
        lengths.data(),
        images.data(),
        hardware_params.data(),
        stream);
  } else if (status == NVJPEG_STATUS_SUCCESS) {
    call = "nvjpegDecodeBatched";
    status = nvjpegDecodeBatched(
        handle,
        hardware_state,
        bytes.data(),
        lengths.data(),
        images.data(),
        stream);
  }
  C10_CUDA_CHECK(cudaEventRecord(hardware_done, stream));
  if (status == NVJPEG_STATUS_SUCCESS) {
    hardware_failures = 0;
    return true;
  }
  // Let whatever the engines started finish before the CUDA backend writes
  // the same outputs; then a fresh state for the next batch.
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  nvjpegJpegStateDestroy(hardware_state);
  hardware_state = nullptr;
  LAMP_NVJPEG_CHECK(nvjpegJpegStateCreate(handle, &hardware_state));
  TORCH_WARN(
      "lamp: nvJPEG's hardware decoder failed (",
      call,
      ": ",
      nvjpeg_status_name(status),
      ") on a batch of ",
      ids.size(),
      " JPEGs starting with ",
      names[ids[0]],
      "; decoding them with nvJPEG's CUDA backend");
  return false;
}

void NvjpegDecoder::Impl::decode_cuda(
    nvjpegJpegStream_t& bitstream,
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const CropBox* region,
    torch::Tensor& out,
    cudaStream_t stream) {
  Slot* s = nullptr;
  try {
    LAMP_NVJPEG_CHECK_IMAGE(
        nvjpegJpegStreamParse(handle, data, size, 0, 0, bitstream), name);
    // (0, 0, -1, -1): the whole image.
    LAMP_NVJPEG_CHECK(
        region == nullptr ? nvjpegDecodeParamsSetROI(params, 0, 0, -1, -1)
                          : nvjpegDecodeParamsSetROI(
                                params,
                                int(region->left),
                                int(region->top),
                                int(region->width),
                                int(region->height)));
    s = &slot();
    LAMP_NVJPEG_CHECK_IMAGE(
        nvjpegDecodeJpegHost(handle, decoder, s->state, params, bitstream),
        name);
    LAMP_NVJPEG_CHECK_IMAGE(
        nvjpegDecodeJpegTransferToDevice(
            handle, decoder, s->state, bitstream, stream),
        name);
    nvjpegImage_t image{};
    image.channel[0] = out.data_ptr<uint8_t>();
    image.pitch[0] = size_t(out.size(1)) * 3;
    LAMP_NVJPEG_CHECK_IMAGE(
        nvjpegDecodeJpegDevice(handle, decoder, s->state, &image, stream),
        name);
    C10_CUDA_CHECK(cudaEventRecord(s->done, stream));
  } catch (...) {
    // NOTE: nvJPEG's states after a failed image are not documented to be
    // reusable: see Note [nvJPEG streams and threads].
    if (s != nullptr) {
      retire(*s, stream);
    }
    renew(bitstream);
    throw;
  }
}

bool nvjpeg_supports(const JpegLayout& layout) {
  return layout.problem.empty() && unsupported_reason(layout) == nullptr;
}

} // namespace lamp::data::detail
