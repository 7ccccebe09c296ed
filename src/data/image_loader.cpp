// lamp::data::ImageLoader's public API over its pipeline
// (loader_pipeline.h).

#include <lamp/data/image_loader.h>

#include <lamp/data/image_folder.h>
#include <torch/torch.h>

#include <utility>

#include "loader_options.h"
#include "loader_pipeline.h"

namespace lamp::data {

namespace {

// The options, checked before Impl divides by the batch size.
ImageLoaderOptions checked(
    const ImageFolder& dataset,
    ImageLoaderOptions options) {
  detail::check_loader_options(dataset, options);
  return options;
}

} // namespace

ImageLoader::ImageLoader(const ImageFolder& dataset, ImageLoaderOptions options)
    : impl_(std::make_unique<Impl>(
          dataset,
          checked(dataset, std::move(options)))) {}

ImageLoader::~ImageLoader() {
  impl_->stop_and_join();
}

std::optional<ImageBatch> ImageLoader::next() {
  auto& impl = *impl_;
  if (impl.batch >= impl.num_batches) {
    return std::nullopt; // stays at the end until set_epoch()/seek()
  }
  if (!impl.running) {
    impl.start();
  }
  detail::ReadyBatch item;
  {
    std::unique_lock<std::mutex> lock(impl.mutex);
    impl.batch_ready.wait(
        lock, [&] { return impl.ready.count(impl.next_seq) != 0; });
    const auto it = impl.ready.find(impl.next_seq);
    item = std::move(it->second);
    impl.ready.erase(it);
    impl.slot_done.notify_all(); // room in the ready queue
  }
  if (item.error) {
    impl.stop_and_join();
    std::rethrow_exception(item.error);
  }
  auto& staged = item.staged;
  if (!item.skipped.empty()) {
    TORCH_WARN_ONCE(
        "lamp::data::ImageLoader skips images it cannot decode "
        "(skip_bad_images); the first: ",
        staged.bad_reasons.front());
  }
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.skipped.insert(
        impl.skipped.end(), item.skipped.begin(), item.skipped.end());
    impl.gpu_decoded += staged.gpu_decoded;
    impl.cpu_decoded += staged.cpu_decoded;
  }
  ++impl.batch;
  ++impl.next_seq;
  impl.stage->hand_over(staged);
  return std::move(staged.batch);
}

void ImageLoader::set_epoch(int64_t epoch) {
  seek(epoch, 0);
}

void ImageLoader::seek(int64_t epoch, int64_t batch) {
  TORCH_CHECK_VALUE(
      epoch >= 0 && batch >= 0,
      "ImageLoader::seek: epoch and batch must be >= 0, got ",
      epoch,
      " and ",
      batch);
  auto& impl = *impl_;
  // Where the running pipeline already is (the next epoch's first batch,
  // after the last one of this epoch): keep what it prepared.
  const bool keep = impl.running && batch < impl.num_batches &&
      epoch * impl.num_batches + batch == impl.next_seq &&
      impl.next_seq < impl.end_seq;
  if (!keep) {
    impl.stop_and_join();
  }
  impl_->epoch = epoch;
  impl_->batch = batch;
  impl_->skipped.clear();
}

int64_t ImageLoader::epoch() const {
  return impl_->epoch;
}

int64_t ImageLoader::batch() const {
  return impl_->batch;
}

int64_t ImageLoader::batches_per_epoch() const {
  return impl_->num_batches;
}

int64_t ImageLoader::skipped_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return static_cast<int64_t>(impl_->skipped.size());
}

std::vector<std::string> ImageLoader::skipped_paths() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->skipped;
}

int64_t ImageLoader::gpu_decoded_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->gpu_decoded;
}

int64_t ImageLoader::cpu_decoded_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cpu_decoded;
}

const ImageLoaderOptions& ImageLoader::options() const {
  return impl_->options;
}

} // namespace lamp::data
