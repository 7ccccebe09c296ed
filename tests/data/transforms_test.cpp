// lamp::data's transforms against torchvision (tests/image_oracle.py).

#include <lamp/data/image_decoder.h>
#include <lamp/data/transforms.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace transforms_test {

namespace {

using lamp::data::CropBox;

TEST(Transforms, CropBoxesAndFlipsAreTorchvisions) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  if (!lamp::test::python_can_import("torchvision")) {
    GTEST_SKIP() << "the oracle python has no torchvision";
  }
  for (int seed : {0, 3, 1234}) {
    const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
        "data/image_oracle.py", "crops " + std::to_string(seed)));
    ASSERT_EQ(lines.size(), 40u);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (size_t k = 0; k < lines.size(); ++k) {
      const auto& f = lines[k];
      const int64_t h = std::stoll(f[0]);
      const int64_t w = std::stoll(f[1]);
      const CropBox box = k < 32
          ? lamp::data::random_resized_crop_params(h, w, gen)
          : lamp::data::random_resized_crop_params(
                h, w, gen, {0.5, 0.9}, {0.5, 2.0});
      const bool flip = k < 32 && lamp::data::random_flip(gen);
      EXPECT_EQ(
          std::vector<int64_t>(
              {box.top, box.left, box.height, box.width, flip}),
          std::vector<int64_t>(
              {std::stoll(f[2]),
               std::stoll(f[3]),
               std::stoll(f[4]),
               std::stoll(f[5]),
               std::stoll(f[6])}))
          << "seed " << seed << ", draw " << k << " (" << h << "x" << w << ")";
    }
  }
}

TEST(Transforms, SizesAndCentreCropAreTorchvisions) {
  EXPECT_EQ(
      lamp::data::resize_shorter_side(375, 500, 256),
      (std::array<int64_t, 2>{256, 341}));
  EXPECT_EQ(
      lamp::data::resize_shorter_side(500, 375, 256),
      (std::array<int64_t, 2>{341, 256}));
  EXPECT_EQ(
      lamp::data::resize_shorter_side(300, 300, 256),
      (std::array<int64_t, 2>{256, 256}));
  // (257 - 224) / 2 = 16.5 rounds half to even: 16; (259 - 224) / 2 = 17.5
  // rounds to 18.
  EXPECT_EQ(lamp::data::center_crop_box(257, 259, 224, 224).top, 16);
  EXPECT_EQ(lamp::data::center_crop_box(257, 259, 224, 224).left, 18);
  lamp::test::expect_error(
      [] { lamp::data::center_crop_box(100, 300, 224, 224); },
      "larger than the image");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  lamp::test::expect_error(
      [&] { lamp::data::random_resized_crop_params(0, 10, gen); },
      "empty image");
}

TEST(Transforms, ResizedPixelsMatchTorchvision) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  if (!lamp::test::python_can_import("torchvision")) {
    GTEST_SKIP() << "the oracle python has no torchvision";
  }
  const std::string dir =
      testing::TempDir() + "lamp_transforms_" + std::to_string(getpid());
  lamp::test::run_python_oracle("data/image_oracle.py", "images " + dir);
  lamp::test::run_python_oracle(
      "data/image_oracle.py",
      "resize " + dir + "/q90_420.jpg " + dir + "/resized.pt");
  const auto bytes = lamp::data::read_file(dir + "/resized.pt");
  const auto want =
      torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()))
          .toGenericDict();
  const auto image = lamp::data::decode_image(dir + "/q90_420.jpg");
  std::system(("rm -rf '" + dir + "'").c_str());

  auto max_diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kInt) - b.to(torch::kInt)).abs().max().item<int>();
  };
  auto mean_diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat) - b.to(torch::kFloat))
        .abs()
        .mean()
        .item<double>();
  };
  const std::vector<CropBox> boxes = {
      {10, 20, 300, 400},
      {0, 0, 375, 500},
      {100, 50, 30, 40},
      {5, 7, 200, 100}};
  for (size_t k = 0; k < boxes.size(); ++k) {
    const auto got = lamp::data::resized_crop(image, boxes[k], 224, 224, false);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{224, 224, 3}));
    const auto key = "train" + std::to_string(k);
    // CPU uint8 antialiased bilinear is torch's port of Pillow's resampling:
    // both Pillow (torchvision on PIL images) and torchvision's tensor path
    // (which interpolates in float32) differ from it by rounding only.
    EXPECT_LE(max_diff(got, want.at(key + "_tensor").toTensor()), 1) << key;
    EXPECT_LE(max_diff(got, want.at(key + "_pil").toTensor()), 1) << key;
    EXPECT_LT(mean_diff(got, want.at(key + "_pil").toTensor()), 0.01) << key;
    const auto flipped =
        lamp::data::resized_crop(image, boxes[k], 224, 224, true);
    EXPECT_TRUE(torch::equal(flipped, got.flip({1})));
  }
  const auto eval = lamp::data::resize_center_crop(image, 256, 224);
  EXPECT_LE(max_diff(eval, want.at("eval_tensor").toTensor()), 1);
  EXPECT_LE(max_diff(eval, want.at("eval_pil").toTensor()), 1);

  auto out = torch::zeros({224, 224, 3}, torch::kUInt8);
  lamp::data::resized_crop(image, boxes[0], 224, 224, false, out);
  EXPECT_TRUE(torch::equal(
      out, lamp::data::resized_crop(image, boxes[0], 224, 224, false)));
  lamp::test::expect_error(
      [&] {
        lamp::data::resized_crop(image, {300, 0, 100, 10}, 224, 224, false);
      },
      "is not inside the image");
  lamp::test::expect_error(
      [&] {
        lamp::data::resized_crop(
            image.to(torch::kFloat), boxes[0], 224, 224, false);
      },
      "expected a uint8 RGB image");
}

} // namespace

} // namespace transforms_test
