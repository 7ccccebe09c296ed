#include "batch_stage.h"

#include <lamp/config.h>
#include <lamp/data/image_decoder.h>
#include <torch/torch.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#if defined(LAMP_WITH_NVJPEG) && LAMP_WITH_NVJPEG
#include "nvjpeg_decoder.h"
#include "resize_batch.h"
#define LAMP_DATA_NVJPEG 1
#else
#define LAMP_DATA_NVJPEG 0
#endif

namespace lamp::data::detail {

struct BatchStage::Impl {
  ImageLoaderOptions options;
  torch::Tensor mean; // float32 [1, 3, 1, 1] on the device
  torch::Tensor std;
#if LAMP_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;
#endif
#if LAMP_DATA_NVJPEG
  std::unique_ptr<NvjpegDecoder> nvjpeg;
#endif

  // uint8 [n, S, S, 3] -> the options' dtype, [n, 3, S, S], normalised as
  // torchvision's ToTensor + Normalize: (x / 255 - mean) / std in float32.
  torch::Tensor normalize(const torch::Tensor& pixels) const {
    auto x = pixels.permute({0, 3, 1, 2}).to(torch::kFloat);
    x.div_(255).sub_(mean).div_(std);
    const auto format = options.channels_last()
        ? torch::MemoryFormat::ChannelsLast
        : torch::MemoryFormat::Contiguous;
    return x.to(
        x.options().dtype(options.dtype()),
        /*non_blocking=*/false,
        /*copy=*/false,
        format);
  }

  void decode_on_gpu(
      torch::Tensor& device_pixels,
      std::vector<char>& good,
      EncodedRows& encoded,
      const Recipe& recipe,
      std::vector<std::string>& bad_reason);
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
      !options.gpu_decode() || device.is_cuda(),
      "ImageLoader: gpu_decode needs a CUDA device; got ",
      device);
  TORCH_CHECK(
      !options.gpu_decode() || LAMP_DATA_NVJPEG,
      "ImageLoader: gpu_decode needs lamp built with nvJPEG "
      "(LAMP_WITH_NVJPEG; pip install nvidia-nvjpeg or a CUDA "
      "toolkit with libnvjpeg); leave gpu_decode off to decode on the "
      "CPU");
  const auto m = options.mean();
  const auto s = options.std();
  impl.mean =
      torch::tensor({m[0], m[1], m[2]}, torch::kFloat).view({1, 3, 1, 1});
  impl.std =
      torch::tensor({s[0], s[1], s[2]}, torch::kFloat).view({1, 3, 1, 1});
  if (device.is_cuda()) {
#if LAMP_WITH_CUDA
    const auto index =
        device.has_index() ? device.index() : c10::cuda::current_device();
    impl.options.device(torch::Device(torch::kCUDA, index));
    impl.mean = impl.mean.to(impl.options.device());
    impl.std = impl.std.to(impl.options.device());
    // NOTE: high priority, so that the stage's few kernels a batch start as
    // soon as SMs free up rather than queue behind the training step's. On
    // an H200 it made no measurable difference to the step either way
    // (benchmarks/README.md, issue 15).
    impl.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index);
#if LAMP_DATA_NVJPEG
    if (options.gpu_decode()) {
      impl.nvjpeg =
          std::make_unique<NvjpegDecoder>(index, options.batch_size());
    }
#endif
#else
    TORCH_CHECK(false, "ImageLoader: lamp was built without CUDA");
#endif
  }
}

BatchStage::~BatchStage() = default;

bool BatchStage::decodes_on_gpu(const std::vector<uint8_t>& bytes) const {
  return impl_->options.gpu_decode() &&
      image_format(bytes.data(), bytes.size()) == ImageFormat::kJpeg;
}

void BatchStage::prepare(
    EncodedRows& rows,
    int64_t row,
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    const Recipe& recipe,
    int64_t epoch,
    int64_t index) const {
  const auto size = image_size(bytes.data(), bytes.size(), path);
  auto& r = rows[row];
  r.pending = true;
  r.bytes = bytes;
  r.path = path;
  r.placement = place(recipe, epoch, index, size.height, size.width);
}

void BatchStage::Impl::decode_on_gpu(
    torch::Tensor& device_pixels,
    std::vector<char>& good,
    EncodedRows& encoded,
    const Recipe& recipe,
    std::vector<std::string>& bad_reason) {
#if LAMP_DATA_NVJPEG
  std::vector<int64_t> rows;
  std::vector<const uint8_t*> data;
  std::vector<size_t> sizes;
  std::vector<std::string> names;
  for (size_t r = 0; r < encoded.size(); ++r) {
    if (encoded[r].pending && good[r]) {
      rows.push_back(static_cast<int64_t>(r));
      data.push_back(encoded[r].bytes.data());
      sizes.push_back(encoded[r].bytes.size());
      names.push_back(encoded[r].path);
    }
  }
  if (rows.empty()) {
    return;
  }
  const cudaStream_t cuda_stream = stream->stream();
  // One row's image on its own: for a batch nvJPEG rejects as a whole, to
  // find the image at fault. JPEGs nvJPEG does not support go to the CPU.
  auto one = [&](size_t k) {
    auto& row = encoded[rows[k]];
    try {
      auto image =
          nvjpeg->decode({data[k]}, {sizes[k]}, {names[k]}, cuda_stream)[0];
      transform_decoded_into(
          recipe, row.placement, image, device_pixels[rows[k]]);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      if (what.find("unsupported by nvJPEG") != std::string::npos) {
        const auto image = decode_image(data[k], sizes[k], names[k]);
        transform_decoded_into(
            recipe, row.placement, image, device_pixels[rows[k]]);
      } else if (options.skip_bad_images()) {
        good[rows[k]] = 0;
        bad_reason[rows[k]] = what;
      } else {
        throw;
      }
    }
  };
  std::vector<torch::Tensor> images;
  try {
    images = nvjpeg->decode(data, sizes, names, cuda_stream);
  } catch (const c10::Error&) {
    for (size_t k = 0; k < rows.size(); ++k) {
      one(k);
    }
    return;
  }
  // One kernel for the whole batch: the LibTorch ops it replaces (about
  // seven an image) made this thread, not the decoder, the nvJPEG path's
  // limit.
  std::vector<Placement> placements;
  for (auto r : rows) {
    placements.push_back(encoded[r].placement);
  }
  resize_into_rows(recipe, placements, images, rows, device_pixels);
  for (auto r : rows) {
    encoded[r].pending = false;
  }
#else
  (void)device_pixels, (void)good, (void)encoded, (void)recipe,
      (void)bad_reason;
#endif
}

ImageBatch BatchStage::run(
    const torch::Tensor& pixels,
    const torch::Tensor& targets,
    std::vector<char>& good,
    int64_t rows,
    EncodedRows& encoded,
    const Recipe& recipe,
    std::vector<std::string>& bad_reason) {
  auto& impl = *impl_;
  ImageBatch batch;
  auto host_pixels = pixels.narrow(0, 0, rows);
  auto host_targets = targets.narrow(0, 0, rows);
  auto keep = [&](const torch::Tensor& images, const torch::Tensor& t) {
    std::vector<int64_t> kept;
    for (int64_t r = 0; r < rows; ++r) {
      if (good[r]) {
        kept.push_back(r);
      }
    }
    if (static_cast<int64_t>(kept.size()) == rows) {
      batch.images = images;
      batch.targets = t;
      return;
    }
    const auto index = torch::tensor(kept, torch::kLong).to(images.device());
    batch.images = images.index_select(0, index);
    batch.targets = t.index_select(0, index);
  };
  if (!impl.options.device().is_cuda()) {
    keep(impl.normalize(host_pixels), host_targets.clone());
    return batch;
  }
#if LAMP_WITH_CUDA
  c10::cuda::CUDAGuard device_guard(impl.options.device());
  c10::cuda::CUDAStreamGuard stream_guard(*impl.stream);
  // Only the rows decoded on the CPU travel; the GPU writes the others.
  auto device_pixels = torch::empty(
      host_pixels.sizes(), host_pixels.options().device(impl.options.device()));
  for (int64_t r = 0; r < rows;) {
    auto on_gpu = [&](int64_t i) {
      return i < static_cast<int64_t>(encoded.size()) && encoded[i].pending;
    };
    int64_t end = r;
    while (end < rows && on_gpu(end) == on_gpu(r)) {
      ++end;
    }
    if (!on_gpu(r)) {
      device_pixels.narrow(0, r, end - r)
          .copy_(host_pixels.narrow(0, r, end - r), /*non_blocking=*/true);
    }
    r = end;
  }
  auto device_targets =
      host_targets.to(impl.options.device(), /*non_blocking=*/true);
  impl.decode_on_gpu(device_pixels, good, encoded, recipe, bad_reason);
  keep(impl.normalize(device_pixels), device_targets);
  // NOTE: a host sync, but on this background thread and this stream only:
  // the pinned slot may be refilled once its copy is done, and the caller
  // then need not wait for anything.
  impl.stream->synchronize();
#endif
  return batch;
}

void BatchStage::hand_over(ImageBatch& batch) const {
#if LAMP_WITH_CUDA
  if (batch.images.is_cuda()) {
    const auto current =
        c10::cuda::getCurrentCUDAStream(batch.images.device().index());
    // Allocated on the loader's stream: tell the caching allocator the
    // caller's stream uses them too.
    c10::cuda::CUDACachingAllocator::recordStream(
        batch.images.storage().data_ptr(), current);
    c10::cuda::CUDACachingAllocator::recordStream(
        batch.targets.storage().data_ptr(), current);
  }
#else
  (void)batch;
#endif
}

} // namespace lamp::data::detail
