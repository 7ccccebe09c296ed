#pragma once

// resnet50_amp --data DIR: DIR/train and DIR/val as ImageFolders, read with
// lamp::data::ImageLoader (torchvision's ImageNet transforms), sharded over
// the DDP ranks with the DistributedSampler, with top-1/top-5 validation at
// the end of every epoch.

#include <lamp/data.h>
#include <lamp/lamp.h>

#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "training.h"

namespace examples {

struct DataOptions {
  std::string dir; // empty: synthetic data
  int64_t epochs = 1;
  int64_t workers = 8; // decode threads per process
  int64_t prefetch = 8; // batches prepared ahead (the loader's default)
  // The loader's defaults: stage threads (lanes), decode threads' nice.
  int64_t stage_threads = lamp::data::ImageLoaderOptions().stage_threads();
  int decode_nice = lamp::data::ImageLoaderOptions().decode_nice();
  std::string decode = "auto"; // cpu, gpu or auto
  bool skip_bad_images = false;
  bool prefetch_next_epoch = true;
  bool dct_downscale = false;
  bool gpu_resize = false;
};

/// The --data flags, in the help's "Data" group.
inline void add_data_flags(CLI::App& app, DataOptions& o) {
  app.add_option(
         "--data",
         o.dir,
         "train on real images: DIR/train and DIR/val, one folder per class "
         "(torchvision's ImageFolder); without it, synthetic data")
      ->group(examples::kDataGroup);
  app.add_option("--epochs", o.epochs, "--data: epochs (replaces --steps)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_option("--workers", o.workers, "--data: decode threads per process")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_option("--prefetch", o.prefetch, "--data: batches prepared ahead")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kDataGroup);
  // NOTE: two flags, not CLI11's "--a,!--no-a" pair, whose help line reads
  // "{false}" beside a default that is on.
  auto* next = app.add_flag(
                      "--prefetch-next-epoch",
                      o.prefetch_next_epoch,
                      "--data: prepare the next epoch's first batches while "
                      "this one ends (and during validation); the default")
                   ->group(examples::kDataGroup);
  app.add_flag_callback(
         "--no-prefetch-next-epoch",
         [&o] { o.prefetch_next_epoch = false; },
         "--data: do not")
      ->excludes(next)
      ->group(examples::kDataGroup);
  app.add_option(
         "--stage-threads",
         o.stage_threads,
         "--data: threads that make batches on the device, each with its own "
         "stream and nvJPEG decoder")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_option(
         "--decode-nice",
         o.decode_nice,
         "--data: how much lower the decode threads' priority is (nice)")
      ->check(CLI::Range(0, 19))
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_option(
         "--decode",
         o.decode,
         "--data: where JPEGs are decoded: cpu (libjpeg-turbo in the decode "
         "threads), gpu (nvJPEG) or auto (both at once, each batch split by "
         "their measured rates; cpu without a GPU or nvJPEG)")
      ->check(CLI::IsMember({"cpu", "gpu", "auto"}))
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_flag_callback(
         "--gpu-decode",
         [&o] { o.decode = "gpu"; },
         "--data: the same as --decode gpu")
      ->group(examples::kDataGroup);
  app.add_flag(
         "--dct-downscale",
         o.dct_downscale,
         "--data: decode a JPEG whose crop is >= 2x the input reduced in the "
         "DCT domain (as Pillow's draft(); faster on large images, pixels "
         "differ from torchvision's)")
      ->group(examples::kDataGroup);
  app.add_flag(
         "--gpu-resize",
         o.gpu_resize,
         "--data: the GPU resizes the decode threads' JPEG crops (a faster "
         "loader, a slightly slower step; pixels within 2 levels)")
      ->group(examples::kDataGroup);
  app.add_flag(
         "--skip-bad-images",
         o.skip_bad_images,
         "--data: skip images that cannot be decoded (counted and listed per "
         "epoch) instead of stopping; in training another image of the batch "
         "takes a skipped one's place, so batches keep their size")
      ->group(examples::kDataGroup);
}

/// Top-1 and top-5 accuracy in percent.
struct Accuracy {
  double top1 = 0;
  double top5 = 0;
  int64_t skipped = 0; // validation images that could not be decoded
  std::vector<std::string> skipped_paths; // their files
};

class ImageData {
 public:
  ImageData(
      const DataOptions& o,
      int64_t batch_size,
      int64_t image_size,
      const torch::Device& device,
      torch::Dtype dtype,
      bool channels_last,
      int64_t seed,
      const std::shared_ptr<lamp::dist::ProcessGroup>& pg)
      : pg_(pg), train_set_(o.dir + "/train"), val_set_(o.dir + "/val") {
    const int64_t rank = pg ? pg->rank() : 0;
    const int64_t world = pg ? pg->world_size() : 1;
    auto base =
        lamp::data::ImageLoaderOptions()
            .batch_size(batch_size)
            .image_size(image_size)
            .resize_size(image_size * 256 / 224)
            .device(device)
            .dtype(dtype)
            .channels_last(channels_last)
            .num_threads(o.workers)
            .prefetch(o.prefetch)
            .prefetch_next_epoch(o.prefetch_next_epoch)
            .stage_threads(o.stage_threads)
            .decode_nice(o.decode_nice)
            .decode(
                o.decode == "cpu"       ? lamp::data::ImageDecode::kCpu
                    : o.decode == "gpu" ? lamp::data::ImageDecode::kGpu
                                        : lamp::data::ImageDecode::kAuto)
            .skip_bad_images(o.skip_bad_images)
            .dct_downscale(o.dct_downscale)
            .gpu_resize(o.gpu_resize)
            .rank(rank)
            .world_size(world)
            .seed(static_cast<uint64_t>(seed));
    // NOTE: full batches only in training (drop_last, and a skipped
    // image's row holding another image of the batch), so that every step
    // takes one batch and the loader's position follows the step, a CUDA
    // graph's static inputs keep their size, and no skipped image leaves
    // BatchNorm a batch of one; validation sees every image.
    train_.emplace(
        train_set_,
        lamp::data::ImageLoaderOptions(base).drop_last(true).replace_bad_images(
            true));
    // Validation starts again at epoch 0 each time: nothing to prepare
    // ahead of it.
    val_.emplace(
        val_set_,
        lamp::data::ImageLoaderOptions(base)
            .train(false)
            .shuffle(false)
            .prefetch_next_epoch(false));
    TORCH_CHECK(
        train_->batches_per_epoch() > 0,
        "--data: ",
        train_set_.size(),
        " training images make no batch of ",
        batch_size,
        " per process; lower --batch-size");
    TORCH_CHECK(
        val_set_.classes() == train_set_.classes(),
        "--data: DIR/train and DIR/val must have the same class folders");
  }

  int64_t num_classes() const {
    return static_cast<int64_t>(train_set_.classes().size());
  }
  int64_t steps_per_epoch() const {
    return train_->batches_per_epoch();
  }
  int64_t train_images() const {
    return static_cast<int64_t>(train_set_.size());
  }
  int64_t val_images() const {
    return static_cast<int64_t>(val_set_.size());
  }

  /// Continues after `step` training steps (a resumed run).
  void start_at(int64_t step) {
    train_->seek(step / steps_per_epoch(), step % steps_per_epoch());
  }

  /// The next training batch (the next epoch's first after the last).
  lamp::data::ImageBatch next() {
    while (true) {
      auto batch = train_->next();
      if (batch) {
        return std::move(*batch);
      }
      train_->set_epoch(train_->epoch() + 1);
    }
  }

  /// Training images skipped in the current epoch, as cannot be decoded.
  // Training images this rank's loader has delivered, decoded by the GPU
  // and by the CPU (the step records' `gpu_decoded` / `cpu_decoded`).
  int64_t gpu_decoded() const {
    return train_->gpu_decoded_images();
  }
  int64_t cpu_decoded() const {
    return train_->cpu_decoded_images();
  }

  int64_t skipped() const {
    return train_->skipped_images();
  }
  /// Their files.
  std::vector<std::string> skipped_paths() const {
    return train_->skipped_paths();
  }

  /// Accuracy of `forward` (logits) on the validation set, over all ranks.
  Accuracy evaluate(
      const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
    torch::NoGradGuard no_grad;
    const int64_t k = std::min<int64_t>(5, num_classes());
    torch::Tensor counts; // [top1, top5, total]
    val_->set_epoch(0);
    while (auto batch = val_->next()) {
      const auto logits = forward(batch->images).to(torch::kFloat);
      const auto top = std::get<1>(logits.topk(k, 1));
      const auto hit = top.eq(batch->targets.unsqueeze(1));
      const auto n = torch::full(
          {}, batch->targets.size(0), hit.options().dtype(torch::kLong));
      const auto c = torch::stack(std::vector<torch::Tensor>{
          hit.select(1, 0).sum(), hit.any(1).sum(), n});
      counts = counts.defined() ? counts + c : c;
    }
    if (!counts.defined()) {
      return {0, 0, val_->skipped_images(), val_->skipped_paths()};
    }
    counts = counts.to(torch::kDouble);
    if (pg_) {
      pg_->allreduce(counts, lamp::dist::ReduceOp::kSum);
    }
    const auto c = counts.cpu();
    const double total = c[2].item<double>();
    return {
        100.0 * c[0].item<double>() / total,
        100.0 * c[1].item<double>() / total,
        val_->skipped_images(),
        val_->skipped_paths()};
  }

 private:
  std::shared_ptr<lamp::dist::ProcessGroup> pg_;
  lamp::data::ImageFolder train_set_;
  lamp::data::ImageFolder val_set_;
  std::optional<lamp::data::ImageLoader> train_;
  std::optional<lamp::data::ImageLoader> val_;
};

} // namespace examples
