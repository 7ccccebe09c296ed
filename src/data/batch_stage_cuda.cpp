#include "batch_stage_cuda.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <lamp/config.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "image_decoder_detail.h"
#include "resize_batch.h"

#if LAMP_WITH_NVJPEG
#include "jpeg_markers.h"
#include "nvjpeg_decoder.h"
#else
namespace lamp::data::detail {
class NvjpegDecoder; // never made without nvJPEG
} // namespace lamp::data::detail
#endif

namespace lamp::data::detail {

struct CudaLane {
  c10::cuda::CUDAStream stream;
  // ImageDecode::kGpu and kAuto. (shared_ptr: without nvJPEG the type is
  // incomplete here, and the pointer always null.)
  std::shared_ptr<NvjpegDecoder> nvjpeg;
  torch::Tensor scratch; // CPU decode buffer (files nvJPEG turns down)

  explicit CudaLane(c10::cuda::CUDAStream s) : stream(s) {}
};

namespace {

// ---- The nvJPEG part: with LAMP_WITH_NVJPEG only ----

#if LAMP_WITH_NVJPEG

bool nvjpeg_usable(const ImageLoaderOptions& options) {
  return options.decode() == ImageDecode::kGpu ||
      (options.decode() == ImageDecode::kAuto &&
       nvjpeg_available(options.device().index()));
}

std::shared_ptr<NvjpegDecoder> make_decoder(const ImageLoaderOptions& options) {
  return std::make_shared<NvjpegDecoder>(
      options.device().index(), options.batch_size());
}

// The rows left encoded, decoded by nvJPEG on the lane's stream (an
// undefined tensor for the others). A row nvJPEG cannot decode after all is
// decoded on the CPU here; a corrupt one becomes a bad row.
std::vector<torch::Tensor> decode_on_gpu(
    CudaLane& lane,
    const ImageLoaderOptions& options,
    SlotRows& slot,
    int64_t rows,
    const Recipe& recipe) {
  std::vector<torch::Tensor> decoded(rows);
  std::vector<int64_t> which;
  std::vector<const uint8_t*> data;
  std::vector<size_t> sizes;
  std::vector<std::string> names;
  std::vector<CropBox> regions;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot.state[r] == RowState::kEncoded) {
      which.push_back(r);
      data.push_back(slot.encoded[r].bytes.data());
      sizes.push_back(slot.encoded[r].bytes.size());
      names.push_back(slot.encoded[r].path);
      regions.push_back(slot.encoded[r].placement.box);
    }
  }
  if (which.empty()) {
    return decoded;
  }
  // Training: nvJPEG decodes only the crop (its ROI decode), as the decode
  // threads do (partial_decode); the evaluation transform needs it all.
  const bool roi = recipe.train && recipe.partial_decode;
  std::vector<std::optional<NvjpegFailure>> failures;
  auto images = lane.nvjpeg->decode(
      data,
      sizes,
      names,
      lane.stream.stream(),
      &failures,
      roi ? &regions : nullptr);
  for (size_t k = 0; k < which.size(); ++k) {
    const int64_t r = which[k];
    if (!failures[k]) {
      decoded[r] = std::move(images[k]);
      if (roi) {
        // The image is the crop now.
        slot.encoded[r].placement.box.top = 0;
        slot.encoded[r].placement.box.left = 0;
      }
      continue;
    }
    std::string problem = failures[k]->message;
    if (failures[k]->unsupported) {
      const auto& row = slot.encoded[r];
      problem = transform_placed_into(
          recipe,
          row.placement,
          row.bytes,
          row.path,
          lane.scratch,
          slot.pixels[r]);
    }
    if (problem.empty()) {
      slot.state[r] = RowState::kDecoded;
    } else {
      TORCH_CHECK(options.skip_bad_images(), problem, kSkipAdvice);
      slot.state[r] = RowState::kBad;
      slot.problem[r] = std::move(problem);
    }
  }
  return decoded;
}

#else // no nvJPEG: every row reaches the stage decoded

bool nvjpeg_usable(const ImageLoaderOptions&) {
  return false;
}

std::shared_ptr<NvjpegDecoder> make_decoder(const ImageLoaderOptions&) {
  return nullptr;
}

std::vector<torch::Tensor> decode_on_gpu(
    CudaLane&,
    const ImageLoaderOptions&,
    SlotRows&,
    int64_t rows,
    const Recipe&) {
  return std::vector<torch::Tensor>(rows);
}

#endif

} // namespace

bool nvjpeg_takes(
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    bool progressive_on_cpu,
    ImageSize* size) {
#if LAMP_WITH_NVJPEG
  ImageHeader header;
  // NOTE: anything but a JPEG whose header and markers nvJPEG takes goes to
  // the CPU, damaged JPEGs too: libjpeg decodes some of those (as Pillow
  // does) and otherwise says what is wrong.
  if (!read_image_header(bytes.data(), bytes.size(), path, &header).empty() ||
      header.format != ImageFormat::kJpeg) {
    return false;
  }
  const JpegLayout layout = read_jpeg_layout(bytes.data(), bytes.size());
  if (!nvjpeg_supports(layout)) {
    return false;
  }
  // NOTE: nvJPEG's engines take only sequential JPEGs; its CUDA backend
  // decodes a progressive one with the Huffman decoding on the calling
  // thread, the stage thread, one image after another while the batch
  // waits (a 400 kpx progressive JPEG costs libjpeg-turbo 2.7x a baseline
  // one). With kAuto the decode threads, side by side, take them.
  if (progressive_on_cpu && layout.frame_type == 2) {
    return false;
  }
  size->height = header.height;
  size->width = header.width;
  return true;
#else
  (void)bytes, (void)path, (void)progressive_on_cpu, (void)size;
  return false;
#endif
}

CudaStage make_cuda_stage(ImageLoaderOptions& options) {
  const auto device = options.device();
  const auto index =
      device.has_index() ? device.index() : c10::cuda::current_device();
  options.device(torch::Device(torch::kCUDA, index));
  CudaStage stage;
  const bool nvjpeg = nvjpeg_usable(options);
  if (nvjpeg) {
    stage.mode = options.decode();
  }
  // NOTE: high priority, so that the stage's few kernels a batch start as
  // soon as SMs free up rather than queue behind the training step's. On
  // an H200 it made no measurable difference to the step either way
  // (docs/design/image-loader.md).
  for (int k = 0; k < options.stage_threads(); ++k) {
    auto lane = std::make_shared<CudaLane>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index));
    if (nvjpeg) {
      lane->nvjpeg = make_decoder(options);
    }
    stage.lanes.push_back(std::move(lane));
  }
  return stage;
}

Staged run_cuda(
    CudaLane& lane,
    const ImageLoaderOptions& options,
    SlotRows& slot,
    int64_t rows,
    int64_t batch,
    const Recipe& recipe) {
  const auto device = options.device();
  c10::cuda::CUDAGuard device_guard(device);
  c10::cuda::CUDAStreamGuard stream_guard(lane.stream);
  Staged out;
  const auto gpu_images = decode_on_gpu(lane, options, slot, rows, recipe);
  const auto source = output_rows(
      slot, rows, options.replace_bad_images(), batch, out.bad_rows);
  // Only the rows decoded on the CPU travel, in runs of consecutive rows.
  auto host = slot.pixels.narrow(0, 0, rows);
  torch::Tensor pixels;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot.state[r] == RowState::kDecoded) {
      pixels = torch::empty(host.sizes(), host.options().device(device));
      break;
    }
  }
  for (int64_t r = 0; r < rows;) {
    const bool copy = slot.state[r] == RowState::kDecoded;
    int64_t end = r;
    while (end < rows && (slot.state[end] == RowState::kDecoded) == copy) {
      ++end;
    }
    if (copy) {
      pixels.narrow(0, r, end - r)
          .copy_(host.narrow(0, r, end - r), /*non_blocking=*/true);
      out.cpu_decoded += end - r;
    }
    r = end;
  }
  // The crops for the GPU's resize (Recipe::gpu_resize), in one copy.
  torch::Tensor crops;
  int64_t crops_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot.state[r] == RowState::kCropped) {
      const CropBox& box = slot.encoded[r].placement.box;
      crops_end =
          std::max(crops_end, slot.crop_offset[r] + box.height * box.width * 3);
      ++out.cpu_decoded;
    }
  }
  if (crops_end > 0) {
    crops = torch::empty({crops_end}, slot.crops.options().device(device));
    crops.copy_(slot.crops.narrow(0, 0, crops_end), /*non_blocking=*/true);
  }
  torch::Tensor targets;
  if (out.bad_rows.empty()) {
    targets = slot.targets.narrow(0, 0, rows)
                  .to(device, /*non_blocking=*/true, /*copy=*/true);
  } else {
    const auto index = torch::tensor(source, torch::kLong);
    targets = slot.targets.narrow(0, 0, rows).index_select(0, index).to(device);
  }
  // The slot's host rows and targets are free once the copies above have
  // run (the kernel below reads their device copies).
  if (!slot.released) {
    slot.released.emplace(c10::DeviceType::CUDA);
  }
  slot.released->record(lane.stream);
  const int64_t n = static_cast<int64_t>(source.size());
  std::vector<RowSource> sources(n);
  for (int64_t o = 0; o < n; ++o) {
    const int64_t r = source[o];
    sources[o].row = o;
    if (slot.state[r] == RowState::kDecoded) {
      sources[o].image = pixels[r];
      sources[o].as_is = true;
    } else if (slot.state[r] == RowState::kCropped) {
      const Placement& p = slot.encoded[r].placement;
      sources[o].image =
          crops.narrow(0, slot.crop_offset[r], p.box.height * p.box.width * 3)
              .view({p.box.height, p.box.width, 3});
      sources[o].placement = p;
    } else {
      sources[o].image = gpu_images[r];
      sources[o].placement = slot.encoded[r].placement;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    out.gpu_decoded += gpu_images[r].defined();
  }
  const int64_t size = options.image_size();
  auto images = torch::empty(
      {n, 3, size, size},
      torch::TensorOptions().dtype(options.dtype()).device(device),
      options.channels_last() ? torch::MemoryFormat::ChannelsLast
                              : torch::MemoryFormat::Contiguous);
  Normalization normalization{options.mean(), options.std()};
  write_rows(recipe, sources, &normalization, images);
  // The batch is ready once everything above has run.
  out.done.emplace(c10::DeviceType::CUDA);
  out.done->record(lane.stream);
  out.batch.images = images;
  out.batch.targets = targets;
  return out;
}

void hand_over_cuda(Staged& staged) {
  auto& batch = staged.batch;
  const auto current =
      c10::cuda::getCurrentCUDAStream(batch.images.device().index());
  // The caller's stream waits for the loader's (no host sync), and the
  // caching allocator learns that the caller's stream uses the tensors,
  // which were allocated on the loader's.
  if (staged.done) {
    staged.done->block(current);
  }
  c10::cuda::CUDACachingAllocator::recordStream(
      batch.images.storage().data_ptr(), current);
  c10::cuda::CUDACachingAllocator::recordStream(
      batch.targets.storage().data_ptr(), current);
}

} // namespace lamp::data::detail
