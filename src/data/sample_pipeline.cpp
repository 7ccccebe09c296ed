#include "sample_pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <lamp/data/image_decoder.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>

#include "image_decoder_detail.h"

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

int dct_scale(const CropBox& box, int64_t image_size) {
  const int64_t times = std::min(box.height, box.width) / image_size;
  for (int scale : {8, 4, 2}) {
    if (times >= scale) {
      return scale;
    }
  }
  return 1;
}

CropBox scaled_box(
    const CropBox& box,
    int scale,
    int64_t height,
    int64_t width) {
  // Reduced pixel i covers full-size pixels [i * scale, (i + 1) * scale):
  // the nearest reduced edge is off by at most half a reduced pixel.
  const auto edge = [scale](int64_t x) {
    return (2 * x + scale) / (2 * scale);
  };
  CropBox out;
  out.top = std::min(edge(box.top), height - 1);
  out.left = std::min(edge(box.left), width - 1);
  out.height = std::max<int64_t>(
      1, std::min(edge(box.top + box.height), height) - out.top);
  out.width = std::max<int64_t>(
      1, std::min(edge(box.left + box.width), width) - out.left);
  return out;
}

namespace {

// What a sample's decode is to be: the image's header, the region to
// decode (in the decoded image: reduced when scale > 1) and the placement of
// the crop in that region.
struct DecodePlan {
  ImageHeader full; // at full size
  CropBox region;
  Placement placement;
  int scale = 1;
};

// Reads the header, takes `given` or draws the sample's placement, and
// plans the decode of the part of the image that the placement needs.
std::string plan_decode(
    const Recipe& recipe,
    const Placement* given,
    const SampleRef& sample,
    DecodePlan& plan) {
  ImageHeader header;
  std::string problem = read_image_header(
      sample.bytes.data(), sample.bytes.size(), sample.path, &header);
  if (!problem.empty()) {
    return problem;
  }
  plan.full = header;
  plan.placement = given != nullptr
      ? *given
      : place(recipe, sample.epoch, sample.index, header.height, header.width);
  // A crop at least twice the output may be decoded reduced in the DCT
  // domain (off by default: the pixels differ from a full decode's resize).
  if (recipe.train && recipe.dct_downscale &&
      header.format == ImageFormat::kJpeg) {
    plan.scale = dct_scale(plan.placement.box, recipe.image_size);
    if (plan.scale > 1) {
      header.height = scaled_extent(header.height, plan.scale);
      header.width = scaled_extent(header.width, plan.scale);
      plan.placement.box = scaled_box(
          plan.placement.box, plan.scale, header.height, header.width);
    }
  }
  // The crop's window depends only on the image's size: a JPEG's other
  // rows and columns need not be decoded at all.
  plan.region = CropBox{0, 0, header.height, header.width};
  if (recipe.train && recipe.partial_decode &&
      header.format == ImageFormat::kJpeg) {
    plan.region = plan.placement.box;
    plan.placement.box.top = 0;
    plan.placement.box.left = 0;
  }
  return "";
}

std::string decode_planned(
    const DecodePlan& plan,
    const SampleRef& sample,
    uint8_t* pixels) {
  return decode_image_region(
      sample.bytes.data(),
      sample.bytes.size(),
      sample.path,
      plan.full,
      plan.region,
      pixels,
      plan.scale);
}

// Reads the header, takes `given` or draws the sample's placement, decodes
// the part of the image that the placement needs and transforms it into
// `out`.
std::string read_decode_transform(
    const Recipe& recipe,
    const Placement* given,
    const SampleRef& sample,
    torch::Tensor& decoded,
    torch::Tensor out) {
  DecodePlan plan;
  std::string problem = plan_decode(recipe, given, sample, plan);
  if (!problem.empty()) {
    return problem;
  }
  const CropBox& region = plan.region;
  const int64_t bytes_needed = region.height * region.width * 3;
  if (!decoded.defined() || decoded.numel() < bytes_needed) {
    decoded = torch::empty({bytes_needed}, torch::kUInt8);
  }
  auto image =
      decoded.narrow(0, 0, bytes_needed).view({region.height, region.width, 3});
  problem = decode_planned(plan, sample, image.data_ptr<uint8_t>());
  if (problem.empty()) {
    transform_decoded_into(recipe, plan.placement, image, std::move(out));
  }
  return problem;
}

} // namespace

std::string transform_into(
    const Recipe& recipe,
    const SampleRef& sample,
    torch::Tensor& decoded,
    torch::Tensor out) {
  return read_decode_transform(
      recipe, nullptr, sample, decoded, std::move(out));
}

std::string transform_placed_into(
    const Recipe& recipe,
    const Placement& placement,
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    torch::Tensor& decoded,
    torch::Tensor out) {
  // NOTE: the placement is given: the sample's epoch and index draw nothing.
  return read_decode_transform(
      recipe,
      &placement,
      SampleRef{0, 0, bytes, path},
      decoded,
      std::move(out));
}

CropDecode decode_crop(
    const Recipe& recipe,
    const SampleRef& sample,
    const std::function<uint8_t*(int64_t)>& reserve) {
  CropDecode out;
  DecodePlan plan;
  out.problem = plan_decode(recipe, nullptr, sample, plan);
  if (!out.problem.empty()) {
    return out;
  }
  // Only a region that is the crop itself (a JPEG's partial decoding).
  const CropBox& box = plan.placement.box;
  if (box.height != plan.region.height || box.width != plan.region.width) {
    return out;
  }
  uint8_t* pixels = reserve(plan.region.height * plan.region.width * 3);
  if (pixels == nullptr) {
    return out;
  }
  out.taken = true;
  out.placement = plan.placement;
  out.problem = decode_planned(plan, sample, pixels);
  return out;
}

} // namespace lamp::data::detail
