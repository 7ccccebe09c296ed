// ImageLoader's options, checked when a loader is made: each wrong value
// and a folder with files the loader cannot decode is an error that says
// what to do.

#include "loader_options.h"

#include <lamp/data/image_folder.h>
#include <lamp/data/image_loader.h>

#include "image_folder_detail.h"

namespace lamp::data::detail {

void check_loader_options(
    const ImageFolder& dataset,
    const ImageLoaderOptions& o) {
  TORCH_CHECK_VALUE(
      o.batch_size() > 0,
      "ImageLoader: batch_size must be "
      "positive, got ",
      o.batch_size());
  TORCH_CHECK_VALUE(
      o.num_threads() > 0 && o.prefetch() > 0,
      "ImageLoader: num_threads and prefetch must be positive, "
      "got ",
      o.num_threads(),
      " and ",
      o.prefetch());
  TORCH_CHECK_VALUE(
      o.decode_nice() >= 0 && o.decode_nice() <= 19,
      "ImageLoader: decode_nice must be in 0..19 (Linux nice values; 0 keeps "
      "the decode threads' priority), got ",
      o.decode_nice());
  TORCH_CHECK_VALUE(
      o.image_size() > 0 && o.resize_size() >= o.image_size(),
      "ImageLoader: need 0 < image_size <= resize_size, got ",
      o.image_size(),
      " and ",
      o.resize_size());
  TORCH_CHECK_VALUE(
      o.dtype() == torch::kFloat || o.dtype() == torch::kHalf ||
          o.dtype() == torch::kBFloat16,
      "ImageLoader: dtype must be float, half or bfloat16, got ",
      o.dtype());
  if (!o.skip_bad_images()) {
    // NOTE: a folder listed with torchvision's extensions may hold BMP,
    // TIFF or WebP files, which the decoders refuse: say so now, not when
    // the first of them comes up mid-epoch.
    const auto decodable = decodable_image_extensions();
    int64_t others = 0;
    const std::string* first = nullptr;
    for (const auto& sample : dataset.samples()) {
      if (!has_allowed_extension(sample.path, decodable)) {
        first = first == nullptr ? &sample.path : first;
        ++others;
      }
    }
    TORCH_CHECK_VALUE(
        others == 0,
        "ImageLoader: ",
        others,
        " of the folder's ",
        dataset.size(),
        " images are not JPEG or PNG by their extension (the first: ",
        first == nullptr ? std::string() : *first,
        "), and the loader decodes only those; convert them, list the folder "
        "without them (ImageFolderOptions().extensions(lamp::data::"
        "decodable_image_extensions())), or skip them while training "
        "(skip_bad_images(true))");
  }
}

} // namespace lamp::data::detail
