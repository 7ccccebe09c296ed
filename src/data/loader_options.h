#pragma once

// Internal: the checks lamp::data::ImageLoader makes of its options and its
// folder before it starts.

namespace lamp::data {
class ImageFolder;
struct ImageLoaderOptions;
} // namespace lamp::data

namespace lamp::data::detail {

// Throws c10::ValueError naming the option and its value (or the first file
// the loader cannot decode, without skip_bad_images) and what to do.
void check_loader_options(
    const ImageFolder& dataset,
    const ImageLoaderOptions& options);

} // namespace lamp::data::detail
