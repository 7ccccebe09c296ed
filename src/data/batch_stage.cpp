#include "batch_stage.h"

#include <lamp/config.h>
#include <lamp/data/image_decoder.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "decode_split.h"
#include "image_decoder_detail.h"

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "resize_batch.h"
#endif
#if defined(LAMP_WITH_NVJPEG) && LAMP_WITH_NVJPEG
#include "jpeg_markers.h"
#include "nvjpeg_decoder.h"
#define LAMP_DATA_NVJPEG 1
#else
#define LAMP_DATA_NVJPEG 0
#endif

namespace lamp::data::detail {
namespace {

// Which row of the slot each output row shows: itself, or, for a bad row
// with replace_bad_images, the next good row (cyclically); bad rows are
// left out otherwise. `bad` gets the bad rows.
std::vector<int64_t> output_rows(
    const SlotRows& slot,
    int64_t rows,
    bool replace,
    int64_t batch,
    std::vector<int64_t>& bad) {
  std::vector<int64_t> source;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot.state[r] == RowState::kBad) {
      bad.push_back(r);
    }
  }
  if (bad.empty()) {
    for (int64_t r = 0; r < rows; ++r) {
      source.push_back(r);
    }
    return source;
  }
  TORCH_CHECK(
      !replace || static_cast<int64_t>(bad.size()) < rows,
      "lamp::data::ImageLoader: no image of batch ",
      batch,
      " could be decoded, so replace_bad_images has none to copy; the "
      "first: ",
      slot.problem[bad.front()]);
  for (int64_t r = 0; r < rows; ++r) {
    if (slot.state[r] != RowState::kBad) {
      source.push_back(r);
    } else if (replace) {
      int64_t s = (r + 1) % rows;
      while (slot.state[s] == RowState::kBad) {
        s = (s + 1) % rows;
      }
      source.push_back(s);
    }
  }
  return source;
}

} // namespace

// What one stage thread uses alone. See Note [ImageLoader threads and
// streams] in loader_pipeline.h.
struct Lane {
  torch::Tensor scratch; // CPU decode buffer (files nvJPEG turns down)
#if LAMP_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;
#endif
#if LAMP_DATA_NVJPEG
  std::unique_ptr<NvjpegDecoder> nvjpeg;
#endif
};

struct BatchStage::Impl {
  ImageLoaderOptions options;
  ImageDecode mode = ImageDecode::kCpu; // what `options.decode()` comes to
  torch::Tensor mean; // float32 [1, 3, 1, 1] (CPU device)
  torch::Tensor std;
  std::optional<DecodeSplit> split; // kAuto
  std::mutex split_mutex; // guards `split`: all threads use it
  std::vector<Lane> lanes; // one per stage thread

  // Whether sample `index` goes to the GPU, for a batch whose GPU share is
  // `share` (BatchStage::prepare).
  bool to_gpu(double share, int64_t index) const {
    if (!split || share >= 1) {
      return share > 0; // ImageDecode::kGpu: all
    }
    // NOTE: a hash of the sample's index, not the first or last rows of a
    // batch: the GPU gets an unbiased sample of sizes. Routing the costliest
    // images for the CPU to the GPU instead (by file size and crop height)
    // made ResNet-50 no faster (docs/design/image-loader.md).
    const uint64_t h = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
    return static_cast<double>(h >> 11) * 0x1.0p-53 < share;
  }

  torch::MemoryFormat format() const {
    return options.channels_last() ? torch::MemoryFormat::ChannelsLast
                                   : torch::MemoryFormat::Contiguous;
  }

  // uint8 [n, S, S, 3] -> the options' dtype, [n, 3, S, S], normalised as
  // torchvision's ToTensor + Normalize: (x / 255 - mean) / std in float32.
  torch::Tensor normalize(const torch::Tensor& pixels) const {
    auto x = pixels.permute({0, 3, 1, 2}).to(torch::kFloat);
    x.div_(255).sub_(mean).div_(std);
    return x.to(
        x.options().dtype(options.dtype()),
        /*non_blocking=*/false,
        /*copy=*/false,
        format());
  }

  Staged run_cpu(SlotRows& slot, int64_t rows, int64_t batch);
#if LAMP_WITH_CUDA
  std::vector<torch::Tensor> decode_on_gpu(
      Lane& lane,
      SlotRows& slot,
      int64_t rows,
      const Recipe& recipe);
  Staged run_cuda(
      Lane& lane,
      SlotRows& slot,
      int64_t rows,
      int64_t batch,
      const Recipe& recipe);
#endif
};

BatchStage::BatchStage(const ImageLoaderOptions& options)
    : impl_(std::make_unique<Impl>()) {
  auto& impl = *impl_;
  impl.options = options;
  const auto device = options.device();
  TORCH_CHECK_VALUE(
      device.is_cpu() || device.is_cuda(),
      "ImageLoader: device must be CPU or CUDA, got ",
      device);
  TORCH_CHECK_VALUE(
      options.decode() != ImageDecode::kGpu || device.is_cuda(),
      "ImageLoader: decode(ImageDecode::kGpu) (gpu_decode) needs a CUDA "
      "device; got ",
      device);
  TORCH_CHECK(
      options.decode() != ImageDecode::kGpu || LAMP_DATA_NVJPEG,
      "ImageLoader: decode(ImageDecode::kGpu) (gpu_decode) needs lamp built "
      "with nvJPEG (LAMP_WITH_NVJPEG; pip install nvidia-nvjpeg or a CUDA "
      "toolkit with libnvjpeg); use ImageDecode::kCpu or kAuto");
  const auto m = options.mean();
  const auto s = options.std();
  impl.mean =
      torch::tensor({m[0], m[1], m[2]}, torch::kFloat).view({1, 3, 1, 1});
  impl.std =
      torch::tensor({s[0], s[1], s[2]}, torch::kFloat).view({1, 3, 1, 1});
  TORCH_CHECK_VALUE(
      options.stage_threads() > 0,
      "ImageLoader: stage_threads must be positive, got ",
      options.stage_threads());
  impl.lanes.resize(options.stage_threads());
  if (!device.is_cuda()) {
    return;
  }
#if LAMP_WITH_CUDA
  const auto index =
      device.has_index() ? device.index() : c10::cuda::current_device();
  impl.options.device(torch::Device(torch::kCUDA, index));
  // NOTE: high priority, so that the stage's few kernels a batch start as
  // soon as SMs free up rather than queue behind the training step's. On
  // an H200 it made no measurable difference to the step either way
  // (docs/design/image-loader.md).
  for (auto& lane : impl.lanes) {
    lane.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index);
  }
#if LAMP_DATA_NVJPEG
  if (options.decode() == ImageDecode::kGpu ||
      (options.decode() == ImageDecode::kAuto && nvjpeg_available(index))) {
    impl.mode = options.decode();
    for (auto& lane : impl.lanes) {
      lane.nvjpeg =
          std::make_unique<NvjpegDecoder>(index, options.batch_size());
    }
    if (impl.mode == ImageDecode::kAuto) {
      impl.split.emplace(options.num_threads(), options.stage_threads());
    }
  }
#endif
#else
  TORCH_CHECK(false, "ImageLoader: lamp was built without CUDA");
#endif
}

BatchStage::~BatchStage() = default;

int BatchStage::lanes() const {
  return static_cast<int>(impl_->lanes.size());
}

int64_t BatchStage::gpu_rows(int64_t rows) const {
  switch (impl_->mode) {
    case ImageDecode::kGpu:
      return rows;
    case ImageDecode::kAuto: {
      std::lock_guard<std::mutex> lock(impl_->split_mutex);
      return impl_->split->gpu_rows(rows);
    }
    case ImageDecode::kCpu:
      break;
  }
  return 0;
}

bool BatchStage::prepare(
    EncodedRow& row,
    std::vector<uint8_t>& bytes,
    const std::string& path,
    const Recipe& recipe,
    int64_t epoch,
    int64_t index,
    double gpu_share) const {
#if LAMP_DATA_NVJPEG
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
  if (impl_->split && layout.frame_type == 2) {
    return false;
  }
  if (!impl_->to_gpu(gpu_share, index)) {
    return false;
  }
  row.placement = place(recipe, epoch, index, header.height, header.width);
  row.path = path;
  row.bytes = std::move(bytes);
  return true;
#else
  (void)row, (void)bytes, (void)path, (void)recipe, (void)epoch, (void)index,
      (void)gpu_share;
  return false;
#endif
}

void BatchStage::record_thread(bool decoded, double seconds) {
  if (impl_->split) {
    std::lock_guard<std::mutex> lock(impl_->split_mutex);
    impl_->split->record_thread(decoded, seconds);
  }
}

void BatchStage::wait_until_released(const SlotRows& slot) const {
  if (slot.released && slot.released->was_marked_for_recording()) {
    // NOTE: polled, not cudaEventSynchronize: with one CUDA context per
    // process CUDA spins in a host wait, and up to num_threads decode
    // threads reach a slot that the stage has just handed back together;
    // spinning, they would hold the cores that the stage threads (nvJPEG's
    // host work) and the training thread need. The copies take a few
    // hundred microseconds to a few milliseconds. See Note [ImageLoader
    // threads and streams].
    while (!slot.released->query()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

Staged BatchStage::Impl::run_cpu(SlotRows& slot, int64_t rows, int64_t b) {
  Staged out;
  const auto source =
      output_rows(slot, rows, options.replace_bad_images(), b, out.bad_rows);
  for (int64_t r = 0; r < rows; ++r) {
    out.cpu_decoded += slot.state[r] == RowState::kDecoded;
  }
  auto images = normalize(slot.pixels.narrow(0, 0, rows));
  auto targets = slot.targets.narrow(0, 0, rows).clone();
  if (!out.bad_rows.empty()) {
    const auto index = torch::tensor(source, torch::kLong);
    images = images.index_select(0, index).contiguous(format());
    targets = targets.index_select(0, index);
  }
  out.batch.images = images;
  out.batch.targets = targets;
  return out;
}

#if LAMP_WITH_CUDA
// The rows left encoded, decoded by nvJPEG on the lane's stream (an
// undefined tensor for the others). A row nvJPEG cannot decode after all is
// decoded on the CPU here; a corrupt one becomes a bad row.
std::vector<torch::Tensor> BatchStage::Impl::decode_on_gpu(
    Lane& lane,
    SlotRows& slot,
    int64_t rows,
    const Recipe& recipe) {
  std::vector<torch::Tensor> decoded(rows);
#if LAMP_DATA_NVJPEG
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
      lane.stream->stream(),
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
#else
  (void)lane, (void)slot, (void)recipe;
#endif
  return decoded;
}

Staged BatchStage::Impl::run_cuda(
    Lane& lane,
    SlotRows& slot,
    int64_t rows,
    int64_t batch,
    const Recipe& recipe) {
  const auto device = options.device();
  c10::cuda::CUDAGuard device_guard(device);
  auto& stream = *lane.stream;
  c10::cuda::CUDAStreamGuard stream_guard(stream);
  Staged out;
  const auto gpu_images = decode_on_gpu(lane, slot, rows, recipe);
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
  slot.released->record(stream);
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
      format());
  Normalization normalization{options.mean(), options.std()};
  write_rows(recipe, sources, &normalization, images);
  // The batch is ready once everything above has run.
  out.done.emplace(c10::DeviceType::CUDA);
  out.done->record(stream);
  out.batch.images = images;
  out.batch.targets = targets;
  return out;
}
#endif

Staged BatchStage::run(
    SlotRows& slot,
    int64_t rows,
    int64_t batch,
    const Recipe& recipe,
    int lane) {
  auto& impl = *impl_;
  TORCH_CHECK(
      lane >= 0 && lane < lanes(),
      "BatchStage::run: lane ",
      lane,
      " of ",
      lanes());
  const auto start = std::chrono::steady_clock::now();
  Staged out;
  if (!impl.options.device().is_cuda()) {
    out = impl.run_cpu(slot, rows, batch);
  } else {
#if LAMP_WITH_CUDA
    out = impl.run_cuda(impl.lanes[lane], slot, rows, batch, recipe);
#endif
  }
  if (impl.split) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::lock_guard<std::mutex> lock(impl.split_mutex);
    impl.split->record_stage(out.gpu_decoded, seconds);
  }
  for (int64_t r : out.bad_rows) {
    out.bad_reasons.push_back(slot.problem[r]);
  }
  return out;
}

void BatchStage::hand_over(Staged& staged) const {
#if LAMP_WITH_CUDA
  auto& batch = staged.batch;
  if (batch.images.is_cuda()) {
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
#else
  (void)staged;
#endif
}

} // namespace lamp::data::detail
