#include "nvjpeg_decoder.h"

#include "jpeg_markers.h"
#include "nvjpeg_utils.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <nvjpeg.h>

#include <map>
#include <mutex>
#include <optional>

namespace lamp::data::detail {

// Note [nvJPEG streams and threads]
// Threads: a decoder holds nvJPEG states, buffers and bitstream handles,
// which nvJPEG lets one thread use at a time; so one decoder per decoding
// thread (several may share a device; each has its own nvJPEG handle).
//
// Streams: decode() enqueues all work on the caller's `stream`. The outputs
// come from LibTorch's caching allocator with `stream` current, so they
// belong to `stream`: use them there, or record them on another stream
// (Tensor::record_stream) before dropping them.
//
// The hardware engines break stream order: nvjpegDecodeBatched on the
// hardware backend writes the outputs when it is called, not after the work
// already queued on its stream (meta-pytorch/torchcodec#1634: seen with
// nvJPEG 12.3 to 13.2; a cudaStreamWaitEvent does not help, a host wait
// does). An output block that the caching allocator recycled may still be
// read by a kernel queued on `stream` (a tensor freed while that kernel
// waits). So before the hardware decode, decode() waits on the host until
// `stream` is idle: the one host sync of a batch, and only of batches with
// images for the engines. Pass a stream that carries the loader's work only,
// never the training stream. The engines' own buffers (the hardware state's)
// come from nvJPEG's default allocator, cudaMalloc, which never hands out
// memory that queued work still uses; they grow to the largest batch and
// stay.
//
// The CUDA backend (decoupled API: host phase, transfer, device phase) keeps
// stream order. Each of its images takes a slot {decoder state, pinned
// buffer, event} in turn (kSlots of them); the slots share one device
// buffer, in stream order. The device buffer comes from the caching
// allocator through nvJPEG's stream-aware allocator (CachingDeviceMemory,
// nvjpeg_utils.h), or from cudaMalloc (NvjpegDecoderOptions); the pinned
// buffers from cudaHostAlloc (nvJPEG's default).
//
// Other host waits are on events of earlier work, normally done by then:
// a slot's previous image (kSlots images back), the batch before last (its
// bitstream handles: they are double-buffered across batches), the last
// hardware batch (its state). A batch on another stream than the last one
// first waits for the last one on the device, so that the shared buffers
// stay in order across streams.
//
// The encoded bytes: nvJPEG copies them to the device with cudaMemcpyAsync.
// From pageable memory such a copy is done when the call returns, from
// pinned memory it is not: keep `data` valid and unchanged until the work
// that decode() enqueued has run.

namespace {

constexpr size_t kSlots = 8;

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

// The CUDA backend's resources for one image in flight.
struct Slot {
  nvjpegJpegState_t state = nullptr;
  nvjpegBufferPinned_t pinned = nullptr;
  cudaEvent_t done = nullptr;
};

void release(Slot& s) {
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

} // namespace

struct NvjpegDecoder::Impl {
  c10::DeviceIndex device = 0;
  int max_batch_size = 0;
  NvjpegDecoderOptions options;
  nvjpegHandle_t handle = nullptr;
  bool hardware = false;
  int hardware_failures = 0; // batches in a row
  nvjpegJpegState_t hardware_state = nullptr;
  cudaEvent_t hardware_done = nullptr;
  nvjpegJpegDecoder_t decoder = nullptr;
  nvjpegDecodeParams_t params = nullptr;
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

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();
  void init();
  Slot& slot();
  void retire(Slot& s, cudaStream_t stream);
  void renew(nvjpegJpegStream_t& bitstream);
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
      std::vector<torch::Tensor>& out,
      cudaStream_t stream);
  void decode_cuda(
      nvjpegJpegStream_t& bitstream,
      const uint8_t* data,
      size_t size,
      const std::string& name,
      torch::Tensor& out,
      cudaStream_t stream);
};

void NvjpegDecoder::Impl::init() {
  nvjpegStatus_t status = NVJPEG_STATUS_ARCH_MISMATCH;
  if (options.hardware()) {
    status = nvjpegCreateEx(
        NVJPEG_BACKEND_HARDWARE,
        nullptr,
        nullptr,
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
    LAMP_NVJPEG_CHECK(nvjpegCreateEx(
        NVJPEG_BACKEND_DEFAULT,
        nullptr,
        nullptr,
        NVJPEG_FLAGS_DEFAULT,
        &handle));
  }
  if (hardware) {
    C10_CUDA_CHECK(
        cudaEventCreateWithFlags(&hardware_done, cudaEventDisableTiming));
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
    LAMP_NVJPEG_CHECK(
        nvjpegBufferDeviceCreate(handle, nullptr, &device_buffer));
  }
  for (int parity = 0; parity < 2; ++parity) {
    C10_CUDA_CHECK(
        cudaEventCreateWithFlags(&batch_done[parity], cudaEventDisableTiming));
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
  for (cudaEvent_t event : {hardware_done, batch_done[0], batch_done[1]}) {
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
      LAMP_NVJPEG_CHECK(nvjpegBufferPinnedCreate(handle, nullptr, &s.pinned));
      LAMP_NVJPEG_CHECK(nvjpegStateAttachPinnedBuffer(s.state, s.pinned));
      LAMP_NVJPEG_CHECK(nvjpegStateAttachDeviceBuffer(s.state, device_buffer));
      C10_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
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
  // The host barrier of Note [nvJPEG streams and threads]; then the last
  // hardware batch (perhaps on another stream) must be done with the state.
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  C10_CUDA_CHECK(cudaEventSynchronize(hardware_done));
  const char* call = "nvjpegDecodeBatchedInitialize";
  nvjpegStatus_t status = nvjpegDecodeBatchedInitialize(
      handle, hardware_state, int(ids.size()), 1, NVJPEG_OUTPUT_RGBI);
  if (status == NVJPEG_STATUS_SUCCESS) {
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
    torch::Tensor& out,
    cudaStream_t stream) {
  Slot* s = nullptr;
  try {
    LAMP_NVJPEG_CHECK_IMAGE(
        nvjpegJpegStreamParse(handle, data, size, 0, 0, bitstream), name);
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

NvjpegDecoder::NvjpegDecoder(
    c10::DeviceIndex device,
    int max_batch_size,
    NvjpegDecoderOptions options)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK_VALUE(
      max_batch_size > 0,
      "NvjpegDecoder: max_batch_size must be positive, got ",
      max_batch_size);
  TORCH_CHECK(
      device >= 0 && device < c10::cuda::device_count(),
      "NvjpegDecoder: no CUDA device ",
      int(device),
      " (this process sees ",
      int(c10::cuda::device_count()),
      "); pass the index of a visible device");
  impl_->device = device;
  impl_->max_batch_size = max_batch_size;
  impl_->options = options;
  c10::cuda::CUDAGuard guard(device);
  impl_->init(); // on failure, ~Impl releases what init() made
}

NvjpegDecoder::~NvjpegDecoder() = default;

std::vector<torch::Tensor> NvjpegDecoder::decode(
    const std::vector<const uint8_t*>& data,
    const std::vector<size_t>& sizes,
    const std::vector<std::string>& names,
    cudaStream_t stream,
    std::vector<std::optional<NvjpegFailure>>* failures) {
  Impl& d = *impl_;
  const size_t n = data.size();
  TORCH_CHECK(
      sizes.size() == n && names.size() == n,
      "NvjpegDecoder::decode: ",
      n,
      " data pointers, ",
      sizes.size(),
      " sizes and ",
      names.size(),
      " names; pass one of each per image");
  TORCH_CHECK(
      n <= size_t(d.max_batch_size),
      "NvjpegDecoder::decode: a batch of ",
      n,
      " images is larger than the decoder's max_batch_size (",
      d.max_batch_size,
      "); split the batch or make a decoder with a larger max_batch_size");
  d.hardware_count = 0;
  d.cuda_count = 0;
  if (n == 0) {
    return {};
  }
  c10::cuda::CUDAGuard device_guard(d.device);
  int stream_device = -1;
  C10_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
  TORCH_CHECK(
      stream_device == d.device,
      "NvjpegDecoder::decode: the stream is on cuda:",
      stream_device,
      " but the decoder on cuda:",
      int(d.device),
      "; pass a stream of the decoder's device");
  c10::cuda::CUDAStreamGuard stream_guard(
      c10::cuda::getStreamFromExternal(stream, d.device));
  if (d.memory) {
    d.memory->use_stream(stream);
  }
  if (stream != d.last_stream) {
    // See Note [nvJPEG streams and threads]: the shared buffers.
    C10_CUDA_CHECK(
        cudaStreamWaitEvent(stream, d.batch_done[1 - d.batch_parity], 0));
    d.last_stream = stream;
  }
  // The bitstream handles of the batch before last must be free again.
  const int parity = d.batch_parity;
  C10_CUDA_CHECK(cudaEventSynchronize(d.batch_done[parity]));
  auto& bitstreams = d.bitstreams[parity];
  // Whatever this batch enqueued, also when it throws, is behind
  // batch_done[parity]; the next batch takes the other handles.
  struct BatchEnd {
    Impl& d;
    int parity;
    cudaStream_t stream;
    ~BatchEnd() {
      cudaEventRecord(d.batch_done[parity], stream);
      d.batch_parity = 1 - parity;
    }
  } batch_end{d, parity, stream};

  if (failures != nullptr) {
    failures->assign(n, std::nullopt);
  }
  // Runs `step` for image i; with `failures`, a bad or unsupported image is
  // noted there instead of thrown. Returns whether the step succeeded.
  auto attempt = [&](size_t i, auto&& step) {
    try {
      step();
      return true;
    } catch (const c10::NotImplementedError& e) {
      if (failures == nullptr) {
        throw;
      }
      (*failures)[i] = NvjpegFailure{true, e.what_without_backtrace()};
    } catch (const c10::ValueError& e) {
      if (failures == nullptr) {
        throw;
      }
      (*failures)[i] = NvjpegFailure{false, e.what_without_backtrace()};
    }
    return false;
  };
  std::vector<ImageInfo> info(n);
  std::vector<char> failed(n, 0);
  for (size_t i = 0; i < n; ++i) {
    failed[i] = !attempt(i, [&] {
      try {
        info[i] = d.inspect(bitstreams[i], data[i], sizes[i], names[i]);
      } catch (...) {
        d.renew(bitstreams[i]);
        throw;
      }
    });
  }
  std::vector<torch::Tensor> out(n);
  std::vector<size_t> hardware_ids;
  std::vector<size_t> cuda_ids;
  for (size_t i = 0; i < n; ++i) {
    if (failed[i]) {
      continue;
    }
    out[i] = at::empty(
        {info[i].height, info[i].width, 3},
        at::TensorOptions().dtype(at::kByte).device(at::kCUDA, d.device));
    (info[i].hardware ? hardware_ids : cuda_ids).push_back(i);
  }
  bool hardware_failed = false;
  if (!hardware_ids.empty() &&
      !d.decode_hardware(hardware_ids, data, sizes, names, out, stream)) {
    hardware_failed = true;
    cuda_ids.insert(cuda_ids.begin(), hardware_ids.begin(), hardware_ids.end());
    hardware_ids.clear();
  }
  int64_t cuda_decoded = 0;
  for (size_t i : cuda_ids) {
    if (attempt(i, [&] {
          d.decode_cuda(
              bitstreams[i], data[i], sizes[i], names[i], out[i], stream);
        })) {
      ++cuda_decoded;
    } else {
      out[i] = at::Tensor();
    }
  }
  if (hardware_failed && ++d.hardware_failures == 3) {
    // NOTE: three batches in a row that the engines failed and the CUDA
    // backend decoded: the engines, not the files, are at fault.
    d.hardware = false;
    TORCH_WARN(
        "lamp: nvJPEG's hardware decoder failed on three batches in a row "
        "that its CUDA backend decoded; cuda:",
        int(d.device),
        " decodes with the CUDA backend from now on");
  }
  d.hardware_count = int64_t(hardware_ids.size());
  d.cuda_count = cuda_decoded;
  return out;
}

int64_t NvjpegDecoder::hardware_decoded() const {
  return impl_->hardware_count;
}

int64_t NvjpegDecoder::cuda_decoded() const {
  return impl_->cuda_count;
}

bool NvjpegDecoder::has_hardware() const {
  return impl_->hardware;
}

c10::DeviceIndex NvjpegDecoder::device() const {
  return impl_->device;
}

int NvjpegDecoder::max_batch_size() const {
  return impl_->max_batch_size;
}

bool nvjpeg_supports(const JpegLayout& layout) {
  return layout.problem.empty() && unsupported_reason(layout) == nullptr;
}

bool nvjpeg_available(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(device);
  if (it != known.end()) {
    return it->second;
  }
  bool ok = false;
  try {
    if (device >= 0 && device < c10::cuda::device_count()) {
      c10::cuda::CUDAGuard guard(device);
      nvjpegHandle_t handle = nullptr;
      if (nvjpegCreateEx(
              NVJPEG_BACKEND_DEFAULT,
              nullptr,
              nullptr,
              NVJPEG_FLAGS_DEFAULT,
              &handle) == NVJPEG_STATUS_SUCCESS) {
        ok = true;
        nvjpegDestroy(handle);
      }
    }
  } catch (const std::exception&) {
    ok = false;
  }
  known[device] = ok;
  return ok;
}

} // namespace lamp::data::detail
