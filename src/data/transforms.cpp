#include <lamp/data/transforms.h>

#include "sample_pipeline.h"
#include "transforms_detail.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace lamp::data {
namespace {

// Python's int(round(x)): round half to even (the default FP rounding mode).
int64_t py_round(double x) {
  return static_cast<int64_t>(std::nearbyint(x));
}

// One float32 drawn as `torch.empty(1).uniform_(from, to)`, as a double
// (Python's `.item()`).
double uniform(at::Generator& generator, double from, double to) {
  return torch::empty({1}).uniform_(from, to, generator).item<double>();
}

int64_t randint(at::Generator& generator, int64_t high) {
  return torch::randint(0, high, {1}, generator).item<int64_t>();
}

void check_image(const torch::Tensor& image) {
  TORCH_CHECK(
      image.dim() == 3 && image.size(2) == 3 &&
          image.scalar_type() == torch::kUInt8,
      "lamp::data: expected a uint8 RGB image [height, width, 3], got ",
      image.scalar_type(),
      " ",
      image.sizes());
}

// Antialiased bilinear resize of uint8 HWC to [out_h, out_w, 3]. CPU uint8
// has a native kernel (Pillow's); CUDA interpolates in float and rounds back.
torch::Tensor resize(const torch::Tensor& hwc, int64_t out_h, int64_t out_w) {
  namespace F = torch::nn::functional;
  const auto options = F::InterpolateFuncOptions()
                           .size(std::vector<int64_t>{out_h, out_w})
                           .mode(torch::kBilinear)
                           .align_corners(false)
                           .antialias(true);
  auto nchw = hwc.permute({2, 0, 1}).unsqueeze(0);
  if (hwc.is_cpu()) {
    return F::interpolate(
               nchw.contiguous(torch::MemoryFormat::ChannelsLast), options)
        .squeeze(0)
        .permute({1, 2, 0});
  }
  return F::interpolate(nchw.to(torch::kFloat), options)
      .round_()
      .clamp_(0, 255)
      .to(torch::kUInt8)
      .squeeze(0)
      .permute({1, 2, 0});
}

torch::Tensor into(torch::Tensor result, torch::Tensor out) {
  if (!out.defined()) {
    return result.contiguous();
  }
  TORCH_CHECK(
      out.sizes() == result.sizes() && out.scalar_type() == torch::kUInt8,
      "lamp::data: the output must be uint8 ",
      result.sizes(),
      ", got ",
      out.scalar_type(),
      " ",
      out.sizes());
  out.copy_(result);
  return out;
}

} // namespace

CropBox random_resized_crop_params(
    int64_t height,
    int64_t width,
    at::Generator& generator,
    std::array<double, 2> scale,
    std::array<double, 2> ratio) {
  TORCH_CHECK_VALUE(
      height > 0 && width > 0,
      "random_resized_crop_params: empty image ",
      height,
      "x",
      width);
  TORCH_CHECK_VALUE(
      scale[0] <= scale[1] && ratio[0] <= ratio[1],
      "random_resized_crop_params: scale and ratio should be of "
      "kind (min, max)");
  const double area = static_cast<double>(height * width);
  // torch.log(torch.tensor(ratio)): float32.
  const auto log_ratio =
      torch::log(torch::tensor({ratio[0], ratio[1]}, torch::kFloat));
  const double log_lo = log_ratio[0].item<double>();
  const double log_hi = log_ratio[1].item<double>();
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(generator, scale[0], scale[1]);
    // torch.exp of a float32 tensor, then .item().
    const double aspect_ratio = torch::empty({1})
                                    .uniform_(log_lo, log_hi, generator)
                                    .exp_()
                                    .item<double>();
    const int64_t w = py_round(std::sqrt(target_area * aspect_ratio));
    const int64_t h = py_round(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = randint(generator, height - h + 1);
      const int64_t left = randint(generator, width - w + 1);
      return {top, left, h, w};
    }
  }
  // The central crop torchvision falls back to.
  const double in_ratio =
      static_cast<double>(width) / static_cast<double>(height);
  const double lo = std::min(ratio[0], ratio[1]);
  const double hi = std::max(ratio[0], ratio[1]);
  int64_t w = width;
  int64_t h = height;
  if (in_ratio < lo) {
    h = py_round(static_cast<double>(w) / lo);
  } else if (in_ratio > hi) {
    w = py_round(static_cast<double>(h) * hi);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

bool random_flip(at::Generator& generator, double p) {
  return torch::rand({1}, generator).item<float>() < p;
}

std::array<int64_t, 2> resize_shorter_side(
    int64_t height,
    int64_t width,
    int64_t size) {
  TORCH_CHECK_VALUE(
      height > 0 && width > 0 && size > 0,
      "resize_shorter_side: sizes must be positive, got ",
      height,
      "x",
      width,
      " to ",
      size);
  // torchvision's _compute_resized_output_size: int() truncates.
  if (width <= height) {
    return {
        static_cast<int64_t>(static_cast<double>(size) * height / width), size};
  }
  return {
      size, static_cast<int64_t>(static_cast<double>(size) * width / height)};
}

CropBox center_crop_box(
    int64_t height,
    int64_t width,
    int64_t crop_height,
    int64_t crop_width) {
  TORCH_CHECK_VALUE(
      crop_height <= height && crop_width <= width,
      "center_crop_box: the crop ",
      crop_height,
      "x",
      crop_width,
      " is larger than the image ",
      height,
      "x",
      width,
      " (torchvision would pad; lamp does not)");
  return {
      py_round((height - crop_height) / 2.0),
      py_round((width - crop_width) / 2.0),
      crop_height,
      crop_width};
}

torch::Tensor resized_crop(
    const torch::Tensor& image,
    const CropBox& box,
    int64_t out_height,
    int64_t out_width,
    bool flip,
    torch::Tensor out) {
  check_image(image);
  detail::check_box_inside(box, image.size(0), image.size(1), "resized_crop");
  auto crop = image.slice(0, box.top, box.top + box.height)
                  .slice(1, box.left, box.left + box.width);
  auto result = resize(crop, out_height, out_width);
  if (flip) {
    result = result.flip({1});
  }
  return into(std::move(result), std::move(out));
}

torch::Tensor resize_center_crop(
    const torch::Tensor& image,
    int64_t resize_to,
    int64_t crop,
    torch::Tensor out) {
  check_image(image);
  const auto size =
      resize_shorter_side(image.size(0), image.size(1), resize_to);
  auto resized = resize(image, size[0], size[1]);
  const CropBox box = center_crop_box(size[0], size[1], crop, crop);
  return into(
      resized.slice(0, box.top, box.top + crop)
          .slice(1, box.left, box.left + crop),
      std::move(out));
}

namespace detail {

void check_box_inside(
    const CropBox& box,
    int64_t height,
    int64_t width,
    const char* who) {
  TORCH_CHECK_VALUE(
      box.top >= 0 && box.left >= 0 && box.height > 0 && box.width > 0 &&
          box.top + box.height <= height && box.left + box.width <= width,
      who,
      ": the box (top ",
      box.top,
      ", left ",
      box.left,
      ", ",
      box.height,
      "x",
      box.width,
      ") is not inside the image ",
      height,
      "x",
      width);
}

} // namespace detail
} // namespace lamp::data
