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

#include "data/image_decoder_detail.h"
#include "data/sample_pipeline.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace image_decoder_test {

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
        lamp::test::run_python_oracle("data/image_oracle.py", "images " + dir_);
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
        "gray.jpg",
        "cmyk.jpg",
        "wide_4000.jpg"}) {
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

TEST_F(ImageDecoder, AFailedFileLeavesNothingBehind) {
  // One thread, as a decode thread: a file libjpeg refuses, then good ones.
  const auto good = read_file(path("q90_420.jpg"));
  const auto bogus = lamp::test::with_bogus_huffman_table(good);
  for (int k = 0; k < 3; ++k) {
    lamp::test::expect_error(
        [&] { decode_image(bogus.data(), bogus.size(), "bogus.jpg"); },
        "'bogus.jpg' is not a readable JPEG (libjpeg: Bogus Huffman table");
    lamp::test::expect_error(
        [&] { lamp::data::image_size(bogus.data(), bogus.size(), "b.jpg"); },
        "Bogus Huffman table");
    for (const char* name : {"q90_420.jpg", "progressive.jpg", "cmyk.jpg"}) {
      EXPECT_TRUE(torch::equal(decode_image(path(name)), expected(name)))
          << name << " after a bad file";
    }
    const std::vector<uint8_t> half(
        good.begin(), good.begin() + good.size() / 2);
    lamp::test::expect_error(
        [&] { decode_image(half.data(), half.size(), "half.jpg"); },
        "Premature end of JPEG file");
  }
}

// Any crop of a JPEG decoded alone equals the same crop of the whole
// decode: the loader decodes only a RandomResizedCrop's window. Also when
// the image is reduced 2, 4 or 8 times in the DCT domain (dct_downscale):
// there the whole is Pillow's draft(), bit for bit (same library, same
// scaled inverse DCT).
TEST_F(ImageDecoder, ARegionEqualsTheSameRegionOfTheWholeImageAtEveryScale) {
  using lamp::data::detail::decode_image_region;
  using lamp::data::detail::ImageHeader;
  using lamp::data::detail::read_image_header;
  using lamp::data::detail::scaled_extent;
  auto generator = at::detail::createCPUGenerator(5);
  int64_t regions = 0;
  for (const char* name :
       {"q90_420.jpg",
        "q75_444.jpg",
        "q95_422.jpg",
        "progressive.jpg",
        "odd_17x33.jpg",
        "gray.jpg",
        "cmyk.jpg",
        "wide_4000.jpg"}) {
    const auto bytes = read_file(path(name));
    ImageHeader header;
    ASSERT_EQ(read_image_header(bytes.data(), bytes.size(), name, &header), "");
    for (int scale : {1, 2, 4, 8}) {
      const auto whole = scale == 1
          ? expected(name)
          : expected(std::string(name) + "@" + std::to_string(scale));
      const int64_t height = scaled_extent(header.height, scale);
      const int64_t width = scaled_extent(header.width, scale);
      ASSERT_EQ(whole.size(0), height) << name << " @" << scale;
      ASSERT_EQ(whole.size(1), width) << name << " @" << scale;
      std::vector<lamp::data::CropBox> boxes = {
          {0, 0, height, width}, {0, 0, 1, 1}, {height - 1, width - 1, 1, 1}};
      for (int k = 0; k < (scale == 1 ? 40 : 10); ++k) {
        boxes.push_back(
            lamp::data::random_resized_crop_params(height, width, generator));
      }
      for (const auto& box : boxes) {
        SCOPED_TRACE(
            std::string(name) + " @" + std::to_string(scale) + " box " +
            std::to_string(box.top) + "," + std::to_string(box.left) + " " +
            std::to_string(box.height) + "x" + std::to_string(box.width));
        auto out = torch::full({box.height, box.width, 3}, 7, torch::kUInt8);
        ASSERT_EQ(
            decode_image_region(
                bytes.data(),
                bytes.size(),
                name,
                header,
                box,
                out.data_ptr<uint8_t>(),
                scale),
            "");
        const auto want = whole.slice(0, box.top, box.top + box.height)
                              .slice(1, box.left, box.left + box.width);
        ASSERT_TRUE(torch::equal(out, want))
            << "max difference "
            << (out.to(torch::kInt) - want.to(torch::kInt))
                   .abs()
                   .max()
                   .item<int>();
        ++regions;
      }
    }
  }
  EXPECT_EQ(regions, 8 * (43 + 3 * 13));
}

TEST_F(ImageDecoder, ACropForTheGpuIsTheSamplesCropOfTheWholeImage) {
  // decode_crop (the loader's crops for the GPU's resize): the crop that
  // place() draws for the sample, decoded into the memory `reserve` gives.
  using lamp::data::detail::decode_crop;
  using lamp::data::detail::place;
  lamp::data::detail::Recipe recipe; // training, partial decoding
  recipe.seed = 3;
  for (const char* name : {"q90_420.jpg", "progressive.jpg", "gray.jpg"}) {
    const auto bytes = read_file(path(name));
    const auto whole = expected(name);
    for (int64_t index = 0; index < 20; ++index) {
      SCOPED_TRACE(std::string(name) + " sample " + std::to_string(index));
      std::vector<uint8_t> memory;
      const auto crop =
          decode_crop(recipe, {1, index, bytes, name}, [&](int64_t n) {
            memory.assign(n, 7);
            return memory.data();
          });
      ASSERT_TRUE(crop.taken);
      ASSERT_EQ(crop.problem, "");
      const auto drawn = place(recipe, 1, index, whole.size(0), whole.size(1));
      EXPECT_EQ(crop.placement.flip, drawn.flip);
      EXPECT_EQ(crop.placement.box.top, 0);
      EXPECT_EQ(crop.placement.box.left, 0);
      ASSERT_EQ(crop.placement.box.height, drawn.box.height);
      ASSERT_EQ(crop.placement.box.width, drawn.box.width);
      ASSERT_EQ(int64_t(memory.size()), drawn.box.height * drawn.box.width * 3);
      const auto got = torch::from_blob(
          memory.data(), {drawn.box.height, drawn.box.width, 3}, torch::kUInt8);
      const auto want =
          whole.slice(0, drawn.box.top, drawn.box.top + drawn.box.height)
              .slice(1, drawn.box.left, drawn.box.left + drawn.box.width);
      EXPECT_TRUE(torch::equal(got, want));
    }
  }
  // No room, or not a training crop: left to the CPU's transform.
  const auto jpeg = read_file(path("q90_420.jpg"));
  EXPECT_FALSE(decode_crop(recipe, {0, 0, jpeg, "q90_420.jpg"}, [](int64_t) {
                 return static_cast<uint8_t*>(nullptr);
               }).taken);
  recipe.train = false; // the evaluation transform: the whole image
  std::vector<uint8_t> memory(1 << 24);
  EXPECT_FALSE(decode_crop(recipe, {0, 0, jpeg, "q90_420.jpg"}, [&](int64_t) {
                 return memory.data();
               }).taken);
  // A bad file says what is wrong.
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  const auto bad = decode_crop(
      recipe, {0, 0, text, "bad.jpg"}, [&](int64_t) { return memory.data(); });
  EXPECT_FALSE(bad.taken);
  EXPECT_NE(bad.problem, "");
}

TEST_F(ImageDecoder, AFullSizeRegionOfAReducedDecodeIsAnError) {
  using lamp::data::detail::ImageHeader;
  const auto bytes = read_file(path("q90_420.jpg"));
  ImageHeader header;
  ASSERT_EQ(
      lamp::data::detail::read_image_header(
          bytes.data(), bytes.size(), "q90_420.jpg", &header),
      "");
  std::vector<uint8_t> out(
      static_cast<size_t>(header.height * header.width * 3));
  EXPECT_THROW(
      lamp::data::detail::decode_image_region(
          bytes.data(),
          bytes.size(),
          "q90_420.jpg",
          header,
          {0, 0, header.height, header.width},
          out.data(),
          2),
      c10::Error);
}

TEST_F(ImageDecoder, ACutFileIsTruncatedWhateverTheRegion) {
  using lamp::data::detail::decode_image_region;
  using lamp::data::detail::ImageHeader;
  using lamp::data::detail::read_image_header;
  const auto bytes = read_file(path("q90_420.jpg"));
  const std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 100);
  ImageHeader header;
  ASSERT_EQ(read_image_header(cut.data(), cut.size(), "cut.jpg", &header), "");
  // The top rows are all there; the file still ends early.
  auto out = torch::empty({10, 10, 3}, torch::kUInt8);
  const auto problem = decode_image_region(
      cut.data(),
      cut.size(),
      "cut.jpg",
      header,
      {0, 0, 10, 10},
      out.data_ptr<uint8_t>());
  EXPECT_NE(
      problem.find("'cut.jpg' is a corrupt or truncated JPEG"),
      std::string::npos)
      << problem;
}

TEST_F(ImageDecoder, TooManyPixelsIsAnErrorNotAnAllocation) {
  auto bytes = read_file(path("q90_420.jpg"));
  // The frame header (SOF0: FF C0, length, precision, height, width) of a
  // 20000 x 20000 image: 400 M pixels, 1.2 GB of RGB.
  bool found = false;
  for (size_t i = 2; i + 9 < bytes.size(); ++i) {
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
      for (size_t k : {i + 5, i + 7}) {
        bytes[k] = 20000 >> 8;
        bytes[k + 1] = 20000 & 0xFF;
      }
      found = true;
      break;
    }
  }
  ASSERT_TRUE(found);
  lamp::test::expect_error(
      [&] { decode_image(bytes.data(), bytes.size(), "huge.jpg"); },
      "'huge.jpg' has 20000x20000 pixels, more than the 178956970");
}

} // namespace

} // namespace image_decoder_test
