#include "nvjpeg_decoder.h"

#include "nvjpeg_impl.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <nvjpeg.h>

#include <algorithm>
#include <chrono>
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
// come from LibTorch's caching allocator with `stream` current, as views of
// one block a batch, so they belong to `stream`: use them there, or record
// them on another stream (Tensor::record_stream) before dropping them.
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
// never the training stream. The engines' own device buffers (the hardware
// state's) come from cudaMalloc, which never hands out memory that queued
// work still uses, their pinned buffers from LibTorch's caching host
// allocator (Note [nvJPEG's own memory], nvjpeg_memory.cpp); they grow to
// the largest batch and stay.
//
// The CUDA backend (decoupled API: host phase, transfer, device phase) keeps
// stream order. Each of its images takes a slot {decoder state, pinned
// buffer, event} in turn (kSlots of them); the slots share one device
// buffer, in stream order. The device buffer comes from the caching
// allocator through nvJPEG's stream-aware allocator (CachingDeviceMemory,
// nvjpeg_utils.h), or from cudaMalloc (NvjpegDecoderOptions); the pinned
// buffers from LibTorch's caching host allocator (Note [nvJPEG's own
// memory], nvjpeg_memory.cpp).
//
// Other host waits are on events of earlier work, normally done by then:
// a slot's previous image (kSlots images back), the batch before last (its
// bitstream handles: they are double-buffered across batches), the last
// hardware batch (its state). Every event a thread waits on is made with
// cudaEventBlockingSync (wait_event_flags()): with one context per process
// CUDA spins in a wait by default, and a spinning stage thread holds a core
// that the decode threads could use (one A/B call: within noise either
// way, docs/design/image-loader.md; a wait should not hold a core). A batch
// on another stream than the last one first waits for the last one on the
// device, so that the shared buffers stay in order across streams.
//
// The encoded bytes: nvJPEG copies them to the device with cudaMemcpyAsync.
// From pageable memory such a copy is done when the call returns, from
// pinned memory it is not: keep `data` valid and unchanged until the work
// that decode() enqueued has run.

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
    std::vector<std::optional<NvjpegFailure>>* failures,
    const std::vector<CropBox>* regions) {
  Impl& d = *impl_;
  const size_t n = data.size();
  TORCH_CHECK(
      sizes.size() == n && names.size() == n &&
          (regions == nullptr || regions->size() == n),
      "NvjpegDecoder::decode: ",
      n,
      " data pointers, ",
      sizes.size(),
      " sizes, ",
      names.size(),
      " names and ",
      regions == nullptr ? n : regions->size(),
      " regions; pass one of each per image");
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
  d.own_memory->use_stream(stream);
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
  std::vector<std::pair<int64_t, int64_t>> shapes(n, {0, 0});
  for (size_t i = 0; i < n; ++i) {
    if (failed[i]) {
      continue;
    }
    int64_t height = info[i].height;
    int64_t width = info[i].width;
    if (regions != nullptr) {
      const CropBox& r = (*regions)[i];
      TORCH_CHECK(
          r.top >= 0 && r.left >= 0 && r.height > 0 && r.width > 0 &&
              r.top + r.height <= height && r.left + r.width <= width,
          "NvjpegDecoder::decode: region (top ",
          r.top,
          ", left ",
          r.left,
          ", ",
          r.height,
          " x ",
          r.width,
          ") is not inside ",
          names[i],
          " (",
          height,
          " x ",
          width,
          ")");
      height = r.height;
      width = r.width;
    }
    shapes[i] = {height, width};
    (info[i].hardware ? hardware_ids : cuda_ids).push_back(i);
  }
  d.allocate_outputs(shapes, failed, out);
  bool hardware_failed = false;
  if (!hardware_ids.empty() &&
      !d.decode_hardware(
          hardware_ids, data, sizes, names, regions, out, stream)) {
    hardware_failed = true;
    cuda_ids.insert(cuda_ids.begin(), hardware_ids.begin(), hardware_ids.end());
    hardware_ids.clear();
  }
  int64_t cuda_decoded = 0;
  const auto cuda_start = std::chrono::steady_clock::now();
  for (size_t i : cuda_ids) {
    if (attempt(i, [&] {
          d.decode_cuda(
              bitstreams[i],
              data[i],
              sizes[i],
              names[i],
              regions == nullptr ? nullptr : &(*regions)[i],
              out[i],
              stream);
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
  d.cuda_seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - cuda_start)
                       .count();
  return out;
}

void NvjpegDecoder::Impl::allocate_outputs(
    const std::vector<std::pair<int64_t, int64_t>>& shapes,
    const std::vector<char>& failed,
    std::vector<at::Tensor>& out) {
  const auto options =
      at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device);
  // NOTE: 256-byte aligned offsets, as cudaMalloc's.
  constexpr int64_t kAlign = 256;
  std::vector<int64_t> offsets(shapes.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (failed[i]) {
      continue;
    }
    const int64_t bytes = shapes[i].first * shapes[i].second * 3;
    offsets[i] = total;
    total += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) {
    return;
  }
  // NOTE: one allocation a batch instead of one an image, and always of
  // the largest size so far (in 2 MiB steps), so that the caching
  // allocator hands the same blocks back batch after batch: crops of random
  // sizes otherwise make it cudaMalloc new segments for a whole pass over
  // the data (a first-pass cost). Views share the block, so the caller's
  // record_stream on any of them protects it all.
  constexpr int64_t kStep = int64_t(2) << 20;
  largest_outputs =
      std::max(largest_outputs, (total + kStep - 1) / kStep * kStep);
  const at::Tensor block = at::empty({largest_outputs}, options);
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!failed[i]) {
      out[i] =
          block.narrow(0, offsets[i], shapes[i].first * shapes[i].second * 3)
              .view({shapes[i].first, shapes[i].second, 3});
    }
  }
}

int64_t NvjpegDecoder::hardware_decoded() const {
  return impl_->hardware_count;
}

int64_t NvjpegDecoder::cuda_decoded() const {
  return impl_->cuda_count;
}

double NvjpegDecoder::cuda_seconds() const {
  return impl_->cuda_seconds;
}

NvjpegAllocations NvjpegDecoder::allocations() const {
  return impl_->own_memory->counts();
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
