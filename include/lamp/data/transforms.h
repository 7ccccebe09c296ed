#pragma once

// The ImageNet transforms of torchvision's reference training recipe, on
// uint8 RGB images [height, width, 3]: RandomResizedCrop + RandomHorizontalFlip
// for training, Resize + CenterCrop for evaluation. The random parameters are
// drawn exactly as torchvision 0.26 draws them (`torch.empty(1).uniform_`,
// `torch.randint`, `torch.rand`), from the generator given.

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <array>
#include <cstdint>

#include <lamp/export.h>

namespace lamp::data {

/// A crop of an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
};

/// torchvision's `RandomResizedCrop.get_params(img, scale, ratio)` for an
/// image of `height` x `width`: up to ten draws of an area fraction in
/// `scale` and a log-uniform aspect ratio in `ratio`, then a central crop.
/// With the same generator state the box equals Python's.
/// Defaults: scale (0.08, 1), ratio (3/4, 4/3).
///
/// Example:
/// \code
///   auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
///   lamp::data::CropBox box =
///       lamp::data::random_resized_crop_params(375, 500, gen);
/// \endcode
LAMP_API CropBox random_resized_crop_params(
    int64_t height,
    int64_t width,
    at::Generator& generator,
    std::array<double, 2> scale = {0.08, 1.0},
    std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});

/// torchvision's `RandomHorizontalFlip(p)` decision: `torch.rand(1) < p`.
LAMP_API bool random_flip(at::Generator& generator, double p = 0.5);

/// The size torchvision's `Resize(size)` (one int: the shorter side) gives an
/// image of `height` x `width`: {new_height, new_width}.
LAMP_API std::array<int64_t, 2> resize_shorter_side(
    int64_t height,
    int64_t width,
    int64_t size);

/// torchvision's `CenterCrop` box for an image at least as large as the crop
/// (offsets rounded half to even, as Python's `round`).
LAMP_API CropBox center_crop_box(
    int64_t height,
    int64_t width,
    int64_t crop_height,
    int64_t crop_width);

/// Crops `image` (uint8 [H, W, 3], CPU or CUDA) to `box`, resizes it to
/// `out_height` x `out_width` with antialiased bilinear interpolation
/// (`torch.nn.functional.interpolate(..., antialias=True)`, which on CPU
/// uint8 is Pillow's resampling) and mirrors it left-right if `flip`.
/// Returns uint8 [out_height, out_width, 3]; writes into `out` when given
/// (e.g. a row of a pinned batch).
LAMP_API torch::Tensor resized_crop(
    const torch::Tensor& image,
    const CropBox& box,
    int64_t out_height,
    int64_t out_width,
    bool flip,
    torch::Tensor out = {});

/// The evaluation transform `Resize(resize) + CenterCrop(crop)` on uint8
/// [H, W, 3]. Returns uint8 [crop, crop, 3]; writes into `out` when given.
LAMP_API torch::Tensor resize_center_crop(
    const torch::Tensor& image,
    int64_t resize,
    int64_t crop,
    torch::Tensor out = {});

} // namespace lamp::data
