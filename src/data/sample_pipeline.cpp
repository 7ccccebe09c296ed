#include "sample_pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <lamp/data/image_decoder.h>
#include <torch/torch.h>

namespace lamp::data::detail {
namespace {

// SplitMix64's finaliser: spreads nearby (seed, epoch, index) far apart.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

} // namespace

at::Generator sample_generator(uint64_t seed, int64_t epoch, int64_t index) {
  const uint64_t s =
      mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^
          static_cast<uint64_t>(index));
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

Placement place(
    const Recipe& recipe,
    int64_t epoch,
    int64_t index,
    int64_t height,
    int64_t width) {
  if (!recipe.train) {
    return {};
  }
  auto generator = sample_generator(recipe.seed, epoch, index);
  // NOTE: a thread-private generator; no lock needed (Python's transforms
  // take the generator's mutex because they share the global one).
  Placement p;
  p.box = random_resized_crop_params(
      height, width, generator, recipe.scale, recipe.ratio);
  p.flip = random_flip(generator);
  return p;
}

void transform_decoded_into(
    const Recipe& recipe,
    const Placement& placement,
    const torch::Tensor& image,
    torch::Tensor out) {
  if (recipe.train) {
    resized_crop(
        image,
        placement.box,
        recipe.image_size,
        recipe.image_size,
        placement.flip,
        std::move(out));
  } else {
    resize_center_crop(
        image, recipe.resize_size, recipe.image_size, std::move(out));
  }
}

void transform_into(
    const Recipe& recipe,
    int64_t epoch,
    int64_t index,
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    torch::Tensor& decoded,
    torch::Tensor out) {
  decoded = decode_image(bytes.data(), bytes.size(), path, decoded);
  const Placement placement =
      place(recipe, epoch, index, decoded.size(0), decoded.size(1));
  transform_decoded_into(recipe, placement, decoded, std::move(out));
}

} // namespace lamp::data::detail
