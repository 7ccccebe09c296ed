// lamp::data's CPU decoders against Pillow (tests/image_oracle.py).

#include <lamp/data/image_decoder.h>

#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "support.h"

namespace {

using lamp::data::decode_image;
using lamp::data::read_file;

// The oracle's images and Pillow's pixels, written once per process.
class ImageDecoder : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!lamp::test::have_python_oracle() ||
        !lamp::test::python_can_import("PIL")) {
      return;
    }
    dir_ = testing::TempDir() + "lamp_images_" + std::to_string(getpid());
    const auto names =
        lamp::test::run_python_oracle("image_oracle.py", "images " + dir_);
    const auto bytes = read_file(dir_ + "/expected.pt");
    expected_ = new c10::Dict<c10::IValue, c10::IValue>(
        torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()))
            .toGenericDict());
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) {
      std::system(("rm -rf '" + dir_ + "'").c_str());
    }
    delete expected_;
    expected_ = nullptr;
  }
  void SetUp() override {
    LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
    if (expected_ == nullptr) {
      GTEST_SKIP() << "the oracle python has no Pillow";
    }
  }
  static torch::Tensor expected(const std::string& name) {
    return expected_->at(name).toTensor();
  }
  static std::string path(const std::string& name) {
    return dir_ + "/" + name;
  }

  static std::string dir_;
  static c10::Dict<c10::IValue, c10::IValue>* expected_;
};
std::string ImageDecoder::dir_;
c10::Dict<c10::IValue, c10::IValue>* ImageDecoder::expected_ = nullptr;

TEST_F(ImageDecoder, JpegPixelsEqualPillows) {
  for (const char* name :
       {"q90_420.jpg",
        "q75_444.jpg",
        "q95_422.jpg",
        "progressive.jpg",
        "odd_17x33.jpg",
        "one_pixel.jpg",
        "gray.jpg"}) {
    const auto want = expected(name);
    const auto got = decode_image(path(name));
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    ASSERT_EQ(got.scalar_type(), torch::kUInt8);
    // Same library (libjpeg-turbo), same DCT and upsampling: bit for bit.
    EXPECT_TRUE(torch::equal(got, want))
        << name << ": max difference "
        << (got.to(torch::kInt) - want.to(torch::kInt)).abs().max().item<int>();
  }
}

TEST_F(ImageDecoder, PngPixelsEqualPillows) {
  for (const char* name :
       {"rgb.png",
        "rgba.png",
        "gray.png",
        "gray_alpha.png",
        "palette.png",
        "bilevel.png"}) {
    const auto want = expected(name);
    const auto got = decode_image(path(name));
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, want)) << name;
  }
}

TEST_F(ImageDecoder, SixteenBitGreyKeepsTheHighByte) {
  // Pillow opens 16-bit grey as mode I;16 and its convert("RGB") saturates
  // every value above 255; lamp keeps the high byte, as Pillow itself does
  // for 16-bit RGB. A deliberate difference.
  const auto got = decode_image(path("gray16.png"));
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{40, 30, 3}));
  const auto saturated = expected("gray16.png");
  EXPECT_TRUE(torch::equal(got.select(2, 0), got.select(2, 2)));
  EXPECT_FALSE(torch::equal(got, saturated));
}

TEST_F(ImageDecoder, SizeFromTheHeaderAndBufferReuse) {
  const auto bytes = read_file(path("q90_420.jpg"));
  const auto size =
      lamp::data::image_size(bytes.data(), bytes.size(), "q90_420.jpg");
  EXPECT_EQ(size.height, 375);
  EXPECT_EQ(size.width, 500);
  const auto png = read_file(path("palette.png"));
  EXPECT_EQ(lamp::data::image_size(png.data(), png.size(), "p").width, 500);
  auto buffer = torch::empty({375, 500, 3}, torch::kUInt8);
  const auto out = decode_image(bytes.data(), bytes.size(), "x", buffer);
  EXPECT_EQ(out.data_ptr(), buffer.data_ptr());
  EXPECT_TRUE(torch::equal(out, expected("q90_420.jpg")));
}

TEST_F(ImageDecoder, TruncatedAndCorruptFilesAreErrorsNamingTheFile) {
  for (const char* name : {"q90_420.jpg", "progressive.jpg", "rgb.png"}) {
    auto bytes = read_file(path(name));
    const std::vector<uint8_t> half(
        bytes.begin(), bytes.begin() + bytes.size() / 2);
    lamp::test::expect_error(
        [&] { decode_image(half.data(), half.size(), "half.img"); },
        "'half.img' is a corrupt or truncated");
    auto garbled = bytes;
    for (size_t i = 2; i < 64 && i < garbled.size(); ++i) {
      garbled[i] = 0x00; // overwrite the header after the signature
    }
    lamp::test::expect_error(
        [&] { decode_image(garbled.data(), garbled.size(), "garbled.img"); },
        "'garbled.img'");
  }
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  lamp::test::expect_error(
      [&] { decode_image(text.data(), text.size(), "notes.jpg"); },
      "'notes.jpg' is neither a JPEG nor a PNG");
  lamp::test::expect_error(
      [&] { decode_image(path("missing.jpg")); }, "cannot open");
  lamp::test::expect_error([&] { decode_image(dir_); }, "not a regular file");
}

} // namespace
