#include "batch_stage.h"

#include <lamp/config.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "batch_stage_cuda.h"
#include "decode_split.h"

namespace lamp::data::detail {

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

struct BatchStage::Impl {
  ImageLoaderOptions options;
  torch::Tensor mean; // float32 [1, 3, 1, 1] (CPU device)
  torch::Tensor std;
  std::optional<DecodeSplit> split; // kAuto
  std::mutex split_mutex; // guards `split`: all threads use it
  CudaStage cuda; // a CUDA device: its lanes and decode mode

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

  // BatchStage::run for the CPU device.
  Staged run_cpu(SlotRows& slot, int64_t rows, int64_t batch);
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
      options.decode() != ImageDecode::kGpu || LAMP_WITH_NVJPEG,
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
  if (!device.is_cuda()) {
    return;
  }
  impl.cuda = make_cuda_stage(impl.options);
  if (impl.cuda.mode == ImageDecode::kAuto) {
    impl.split.emplace(options.num_threads(), options.stage_threads());
  }
}

BatchStage::~BatchStage() = default;

int BatchStage::lanes() const {
  return impl_->options.stage_threads();
}

int64_t BatchStage::gpu_rows(int64_t rows) const {
  switch (impl_->cuda.mode) {
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
  // NOTE: kAuto keeps progressive JPEGs on the CPU (nvjpeg_takes says why).
  ImageSize size;
  if (!impl_->to_gpu(gpu_share, index) ||
      !nvjpeg_takes(bytes, path, impl_->split.has_value(), &size)) {
    return false;
  }
  row.placement = place(recipe, epoch, index, size.height, size.width);
  row.path = path;
  row.bytes = std::move(bytes);
  return true;
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
  Staged out = impl.options.device().is_cuda()
      ? run_cuda(
            *impl.cuda.lanes[lane], impl.options, slot, rows, batch, recipe)
      : impl.run_cpu(slot, rows, batch);
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
  if (staged.batch.images.is_cuda()) {
    hand_over_cuda(staged);
  }
}

} // namespace lamp::data::detail
