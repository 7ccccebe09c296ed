#pragma once

// A batched, multi-threaded image loader for lamp::data::ImageFolder: decode
// threads, pinned host batches, the copy to the GPU on a side stream and the
// uint8 -> fp32/fp16/bf16 normalisation on the GPU, a prefetch depth, and a
// position (epoch, batch) that a checkpoint can save and seek() restore.

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lamp/export.h>
#include <torch/arg.h>

namespace lamp::data {

class ImageFolder;

/// (min, max) of RandomResizedCrop's scale and ratio.
using Range = std::array<double, 2>;
/// A value per RGB channel.
using PerChannel = std::array<double, 3>;

/// Where an ImageLoader decodes JPEGs.
enum class ImageDecode {
  /// On the CPU (libjpeg-turbo), in the decode threads.
  kCpu,
  /// On the GPU (nvJPEG: the GPU's hardware JPEG engines where it has them,
  /// else its CUDA backend); needs a CUDA device and a lamp built with
  /// nvJPEG. PNGs and JPEGs nvJPEG cannot decode go to the CPU.
  kGpu,
  /// Both at once when the device is CUDA and lamp has nvJPEG: each batch is
  /// split between the GPU and the decode threads in proportion to their
  /// measured rates, so that both finish together; otherwise kCpu.
  kAuto,
};

/// Options of ImageLoader; defaults are those of torchvision's ImageNet
/// training recipe (RandomResizedCrop(224) + RandomHorizontalFlip +
/// ImageNet normalisation).
struct LAMP_API ImageLoaderOptions {
  /// Images per batch. Default: 256.
  TORCH_ARG(int64_t, batch_size) = 256;
  /// Training transform (RandomResizedCrop(image_size, scale, ratio) +
  /// horizontal flip with p = 0.5) if true; evaluation transform
  /// (Resize(resize_size) + CenterCrop(image_size)) if false. Default: true.
  TORCH_ARG(bool, train) = true;
  /// A new order every epoch (DistributedSampler's, from seed + epoch).
  /// Default: true.
  TORCH_ARG(bool, shuffle) = true;
  /// Seed of the order and of the random crops and flips. Default: 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Drop the last incomplete batch of an epoch (and, as
  /// DistributedSampler's drop_last, the tail that does not divide among the
  /// ranks). Default: false.
  TORCH_ARG(bool, drop_last) = false;
  /// This process's shard: DistributedSampler(size, rank, world_size).
  /// Defaults: 0 and 1.
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  /// Side of the square output images. Default: 224.
  TORCH_ARG(int64_t, image_size) = 224;
  /// Shorter side before the centre crop of the evaluation transform.
  /// Default: 256.
  TORCH_ARG(int64_t, resize_size) = 256;
  /// RandomResizedCrop's area and aspect-ratio ranges.
  /// Defaults: (0.08, 1) and (3/4, 4/3).
  TORCH_ARG(Range, scale) = {0.08, 1.0};
  TORCH_ARG(Range, ratio) = {3.0 / 4.0, 4.0 / 3.0};
  /// Per-channel mean and standard deviation on the 0..1 scale (the output
  /// is (x / 255 - mean) / std). Defaults: ImageNet's.
  TORCH_ARG(PerChannel, mean) = {0.485, 0.456, 0.406};
  TORCH_ARG(PerChannel, std) = {0.229, 0.224, 0.225};
  /// Where the batches are delivered. Default: CPU.
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// dtype of the images: kFloat, kHalf or kBFloat16. Default: kFloat.
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;
  /// Images in channels-last memory format (NHWC in memory, NCHW sizes)
  /// instead of contiguous NCHW. Default: false.
  TORCH_ARG(bool, channels_last) = false;
  /// Decode threads. Default: 8.
  TORCH_ARG(int64_t, num_threads) = 8;
  /// Batches prepared ahead of the one being used. Batches arrive unevenly
  /// (nvJPEG's engines finish a batch at once, the threads one row at a
  /// time): on an H200, ResNet-50 at bs256 waited 14 % of its step on
  /// photographs with 2 and 1.6 % with 4; on large photographs (the hard
  /// benchmark set) it ran 13-18 % slower than on synthetic data with 4
  /// and 2-6 % with 8. Each costs a pinned host batch and at most one device
  /// batch (bs256 224x224: 38.5 MB host, 77 MB fp16 on the device).
  /// Default: 8.
  TORCH_ARG(int64_t, prefetch) = 8;
  /// Keep decoding into the next epoch while the last batches of this one
  /// are used, so that the next epoch's first batches are ready when
  /// set_epoch(epoch() + 1) is called (it keeps them; any other position
  /// starts afresh). Without it every epoch started with an empty pipeline:
  /// on an H200, ResNet-50's first steps of an epoch waited 100-180 ms. An
  /// evaluation loader restarted at epoch 0 each time should turn it off
  /// (its look-ahead would be thrown away). Default: true.
  TORCH_ARG(bool, prefetch_next_epoch) = true;
  /// Threads that turn decoded rows into batches on the device, taking
  /// alternate batches; on CUDA each has its own stream and nvJPEG decoder.
  /// One nvJPEG decoder's host work (parsing, waiting for the hardware
  /// engines) keeps the engines idle between batches; two keep them busy
  /// (benchmarks/nvjpeg_decoder: 6.5k -> 8.9k img/s on an H200). A third
  /// made the loader alone ~4 % faster but ResNet-50 fed by it slower (its
  /// kernels share the GPU with the step), and costs another nvJPEG
  /// decoder's device memory. Default: 2.
  TORCH_ARG(int64_t, stage_threads) = 2;
  /// How much lower the decode threads' scheduling priority is than the
  /// thread that made the loader (Linux `nice`, 0..19): the stage threads
  /// and the training thread wait for the GPU and run briefly, and should
  /// get a core at once when they wake, not after a decode thread's time
  /// slice. On an H200 host with 16 decode threads on 16 cores, 5 made the
  /// loader alone 12-13 % faster (two stage threads). 0 keeps the priority.
  /// Default: 5.
  TORCH_ARG(int, decode_nice) = 5;
  /// Where JPEGs are decoded (ImageDecode). Default: kAuto.
  TORCH_ARG(ImageDecode, decode) = ImageDecode::kAuto;
  /// Training transform: decode only the part of a JPEG that the crop keeps,
  /// not the whole image: the decode threads its rows and columns (and a
  /// margin), nvJPEG the crop itself (its ROI decode); the pixels are the
  /// same. false decodes every image whole (for comparisons). Default: true.
  TORCH_ARG(bool, partial_decode) = true;
  /// Training transform: when a JPEG's crop is at least 2, 4 or 8 times
  /// image_size on both sides, the decode threads decode the image reduced
  /// that many times in the DCT domain (libjpeg's scaling, as Pillow's
  /// `draft()`; the largest factor that fits) and resize the reduced crop.
  /// Faster on large images, but a **difference from torchvision**: the
  /// pixels are those of a different (box-filtered) reduction, and the crop's
  /// edges move by up to half a reduced pixel. nvJPEG has no such scaling:
  /// under kAuto and kGpu the GPU's rows are decoded at full size. Default:
  /// false.
  TORCH_ARG(bool, dct_downscale) = false;
  /// Training transform on CUDA (with partial_decode): the decode threads
  /// decode a JPEG's crop and the GPU resizes it, in the kernel that already
  /// resizes nvJPEG's images, instead of the threads resizing it on the CPU.
  /// The loader alone gets faster (H200 host, 16 threads: 14.7k -> 15.9k
  /// images/s on photographs), but the resize then shares the GPU with the
  /// training step: ResNet-50 fp16 bs256 fed by it was 0.1-1.1 ms a step
  /// slower in 5 of 6 runs (docs/design/image-loader.md). Worth trying
  /// where the GPU waits for the CPU. The pixels are then those of the GPU's
  /// resize (in float, as for nvJPEG's images: within 2 levels of the CPU's
  /// fixed-point resize). Default: false.
  TORCH_ARG(bool, gpu_resize) = false;
  /// Skip images that cannot be decoded (a corrupt, truncated or unsupported
  /// file; counted, warned once) instead of throwing; the batch holding one
  /// is that much shorter. Reading a file (an I/O error) and everything else
  /// still throws. Default: false.
  TORCH_ARG(bool, skip_bad_images) = false;
  /// With skip_bad_images: a skipped image's row holds a copy of another
  /// image of the same batch (the next good one) with its target, so that
  /// every batch keeps its size (e.g. a CUDA graph's static input). A batch
  /// without any decodable image then throws. Default: false.
  TORCH_ARG(bool, replace_bad_images) = false;

 public:
  /// The former switch: true is decode(ImageDecode::kGpu), false
  /// decode(ImageDecode::kCpu).
  ImageLoaderOptions& gpu_decode(bool on) {
    decode_ = on ? ImageDecode::kGpu : ImageDecode::kCpu;
    return *this;
  }
  /// Whether decode() is kGpu.
  bool gpu_decode() const {
    return decode_ == ImageDecode::kGpu;
  }
};

/// One batch: images [n, 3, S, S] on the options' device, dtype and memory
/// format, and their class indices (int64 [n], same device).
struct ImageBatch {
  torch::Tensor images;
  torch::Tensor targets;
  int64_t epoch = 0;
  int64_t index = 0; ///< the batch's index in its epoch
};

/// Loads batches of an ImageFolder, epoch by epoch.
///
/// Each sample's crop and flip come from a generator seeded by (seed, epoch,
/// dataset index): the batches do not depend on the number of threads, and a
/// run resumed with seek() sees the same images, crops and flips. Their
/// pixels are bit-for-bit reproducible with ImageDecode::kCpu; with kGpu
/// and kAuto nvJPEG's IDCT and the GPU's resize differ from the CPU's by a
/// few levels, and under kAuto which images the GPU decodes depends on the
/// measured rates. The order is
/// DistributedSampler's (identical to Python's for the same seed, epoch,
/// rank and world size). Batches on a CUDA device are ready on the stream
/// that is current when next() returns (the loader's copy stream is waited
/// for, not synchronised with the host). See Note [ImageLoader threads and
/// streams] in src/data/loader_pipeline.h.
///
/// Example:
/// \code
///   lamp::data::ImageFolder train("/data/imagenet/train");
///   lamp::data::ImageLoader loader(train, lamp::data::ImageLoaderOptions()
///       .device(torch::kCUDA).dtype(torch::kHalf).channels_last(true));
///   for (int64_t epoch = 0; epoch < 90; ++epoch) {
///     loader.set_epoch(epoch);
///     while (auto batch = loader.next()) {
///       train_step(batch->images, batch->targets);
///     }
///   }
/// \endcode
class LAMP_API ImageLoader {
 public:
  /// `dataset` must outlive the loader.
  explicit ImageLoader(
      const ImageFolder& dataset,
      ImageLoaderOptions options = {});
  ~ImageLoader();
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  /// The next batch of the current epoch, or nullopt at its end. Rethrows a
  /// decode error (naming the file) from the threads.
  std::optional<ImageBatch> next();

  /// Starts epoch `epoch` from its first batch (Python's
  /// `sampler.set_epoch(epoch)` before iterating). Right after an epoch's
  /// last batch, set_epoch(epoch() + 1) keeps the batches already prepared
  /// (prefetch_next_epoch).
  void set_epoch(int64_t epoch);

  /// Continues at batch `batch` of epoch `epoch`: what a resumed run calls
  /// with the position its checkpoint saved.
  void seek(int64_t epoch, int64_t batch);

  /// The current epoch, and the index of the batch next() returns next.
  int64_t epoch() const;
  int64_t batch() const;

  /// Batches in one epoch on this rank.
  int64_t batches_per_epoch() const;

  /// Images left out (skip_bad_images) of the batches that next() has
  /// returned in the current epoch, each counted once; set_epoch() and
  /// seek() start a new count.
  int64_t skipped_images() const;

  /// Their files, in the order their batches were returned.
  std::vector<std::string> skipped_paths() const;

  /// Of the images next() has returned since the loader was made, how many
  /// the GPU decoded (ImageDecode::kGpu or kAuto) and how many the CPU did.
  int64_t gpu_decoded_images() const;
  int64_t cpu_decoded_images() const;

  const ImageLoaderOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp::data
