#pragma once

// What a decode thread of lamp::data::ImageLoader does to one sample: its
// random parameters, and its decode + transform into a row of a batch.

#include <ATen/core/Generator.h>
#include <lamp/data/transforms.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lamp::data::detail {

// The transform of every sample of a loader.
struct Recipe {
  bool train = true;
  int64_t image_size = 224;
  int64_t resize_size = 256;
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  uint64_t seed = 0;
  // Training: decode only the crop of a JPEG (and a margin), not all of it.
  bool partial_decode = true;
  // Training: decode a JPEG reduced 2, 4 or 8 times in the DCT domain when
  // its crop is at least that many times the output (as Pillow's draft()).
  bool dct_downscale = false;
  // Training on CUDA (ImageLoaderOptions::gpu_resize): the decode threads
  // hand the decoded crops of JPEGs to the GPU, which resizes them with
  // nvJPEG's (decode_crop).
  bool gpu_resize = false;
};

// The DCT-domain reduction (1, 2, 4 or 8) for a crop `box` resized to
// `image_size`: Pillow's draft() rule for that crop, the largest of 8, 4, 2
// that is at most min(box.height, box.width) / image_size.
int dct_scale(const CropBox& box, int64_t image_size);

// `box` of an image in the image reduced `scale` times (whose sides are
// `height` x `width`): its edges divided by `scale` and rounded, at least a
// pixel.
CropBox scaled_box(
    const CropBox& box,
    int scale,
    int64_t height,
    int64_t width);

// The generator of sample `index` (dataset index) in `epoch`: a fixed
// function of (seed, epoch, index), so crops and flips do not depend on
// which thread draws them or on where a run resumed.
at::Generator sample_generator(uint64_t seed, int64_t epoch, int64_t index);

// A sample's crop and flip, drawn for an image of `height` x `width` (the
// evaluation transform draws nothing).
struct Placement {
  CropBox box;
  bool flip = false;
};
Placement place(
    const Recipe& recipe,
    int64_t epoch,
    int64_t index,
    int64_t height,
    int64_t width);

// A sample as its decode sees it: which one it is (its epoch and dataset
// index, which its crop and flip follow: sample_generator) and its file's
// bytes and path (for messages). Refers to them; lives as long as the call.
struct SampleRef {
  int64_t epoch = 0;
  int64_t index = 0;
  const std::vector<uint8_t>& bytes;
  const std::string& path;
};

// Decodes `sample` and writes the transformed image into `out`, uint8
// [S, S, 3] (a row of a pinned batch); `decoded` is the calling thread's
// buffer, grown as needed. Returns "" or what is wrong with the image (an
// image that cannot be decoded); throws for anything else.
std::string transform_into(
    const Recipe& recipe,
    const SampleRef& sample,
    torch::Tensor& decoded,
    torch::Tensor out);

// transform_into for a sample whose placement was drawn already (a row the
// GPU could not decode after all).
std::string transform_placed_into(
    const Recipe& recipe,
    const Placement& placement,
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    torch::Tensor& decoded,
    torch::Tensor out);

// For the GPU's resize (Recipe::gpu_resize): decodes the
// crop of a JPEG (training with partial decoding: the region decoded is the
// crop) into `reserve(bytes)`, uint8 [h, w, 3], and returns the crop's
// placement in it (box {0, 0, h, w}, flip). `taken` false (nothing
// decoded) when the sample is not for this path (not a JPEG, no partial
// decoding) or `reserve` returned null (no room): transform it on the CPU.
// `problem`: what is wrong with the image ("" if nothing).
struct CropDecode {
  bool taken = false;
  Placement placement;
  std::string problem;
};
CropDecode decode_crop(
    const Recipe& recipe,
    const SampleRef& sample,
    const std::function<uint8_t*(int64_t)>& reserve);

// The transform of an already decoded uint8 [H, W, 3] image (CPU or CUDA).
void transform_decoded_into(
    const Recipe& recipe,
    const Placement& placement,
    const torch::Tensor& image,
    torch::Tensor out);

} // namespace lamp::data::detail
