// GPU JPEG decoding (src/data/nvjpeg_decoder.h) against the CPU decoder
// (lamp::data::decode_image), and the marker walker it relies on
// (src/data/jpeg_markers.h), on JPEGs that Pillow writes
// (tests/nvjpeg_oracle.py).

#include "data/jpeg_markers.h"
#include "support.h"

#include <lamp/config.h>
#include <lamp/data/image_decoder.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

#if LAMP_WITH_NVJPEG
#include "data/nvjpeg_decoder.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <iostream>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace nvjpeg_decoder_test {

namespace {

using lamp::data::detail::read_jpeg_layout;

// NOTE: no std::filesystem: libtorch.so exports a broken copy of it.

struct JpegFile {
  std::string name;
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> bytes;

  bool gray() const {
    return name.rfind("gray", 0) == 0;
  }
  bool progressive() const {
    return name.find("progressive") != std::string::npos;
  }
  // Files nvJPEG must refuse: CMYK, and RGB stored without YCbCr.
  bool for_cpu_only() const {
    return name.rfind("cmyk", 0) == 0 || name.rfind("rgb_colorspace", 0) == 0;
  }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The oracle's files, written once per test process into its own folder
// (ctest runs tests in parallel).
const std::vector<JpegFile>& oracle_files() {
  static const std::vector<JpegFile> files = [] {
    const std::string dir =
        testing::TempDir() + "lamp_nvjpeg_" + std::to_string(getpid());
    EXPECT_EQ(
        std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()),
        0);
    std::vector<JpegFile> out;
    for (const auto& f : lamp::test::split_lines(
             lamp::test::run_python_oracle("data/nvjpeg_oracle.py", dir))) {
      JpegFile file{f.at(0), std::stoll(f.at(1)), std::stoll(f.at(2)), {}};
      file.bytes = read_bytes(f.at(3));
      EXPECT_FALSE(file.bytes.empty()) << f.at(3);
      out.push_back(std::move(file));
    }
    std::system(("rm -rf '" + dir + "'").c_str());
    return out;
  }();
  return files;
}

const JpegFile& oracle_file(const std::string& name) {
  for (const auto& f : oracle_files()) {
    if (f.name == name) {
      return f;
    }
  }
  throw std::runtime_error("no oracle file " + name);
}

#define LAMP_SKIP_WITHOUT_PILLOW()                          \
  do {                                                      \
    if (!lamp::test::python_can_import("PIL")) {            \
      GTEST_SKIP() << "needs Pillow in the oracle python (" \
                   << LAMP_TEST_PYTHON << ")";              \
    }                                                       \
  } while (0)

// ---------------------------------------------------------------- markers

TEST(JpegMarkers, ReadsPillowFiles) {
  LAMP_SKIP_WITHOUT_PILLOW();
  ASSERT_FALSE(oracle_files().empty());
  for (const auto& f : oracle_files()) {
    SCOPED_TRACE(f.name);
    const auto layout = read_jpeg_layout(f.bytes.data(), f.bytes.size());
    EXPECT_EQ(layout.problem, "");
    EXPECT_EQ(layout.width, f.width);
    EXPECT_EQ(layout.height, f.height);
    EXPECT_EQ(layout.precision, 8);
    EXPECT_EQ(layout.frame_type, f.progressive() ? 2 : 0);
    const int components =
        f.gray() ? 1 : (f.name.rfind("cmyk", 0) == 0 ? 4 : 3);
    EXPECT_EQ(layout.components, components);
    EXPECT_EQ(layout.rgb, f.name.rfind("rgb_colorspace", 0) == 0);
  }
}

TEST(JpegMarkers, CutFilesAreTruncated) {
  LAMP_SKIP_WITHOUT_PILLOW();
  for (const char* name :
       {"rgb420_500x375",
        "rgb420_progressive_500x375",
        "gray_17x33",
        "rgb420_exif_thumbnail_160x120"}) {
    const auto& f = oracle_file(name);
    const size_t n = f.bytes.size();
    // In the JFIF segment, in the tables, in the (first) scan, just before
    // and inside the end marker. The EXIF file's thumbnail, with its own end
    // marker, sits before the main image's scan.
    for (size_t size : {size_t(20), size_t(150), n / 2, n - 2, n - 1}) {
      SCOPED_TRACE(std::string(name) + " cut to " + std::to_string(size));
      const auto layout = read_jpeg_layout(f.bytes.data(), size);
      EXPECT_NE(layout.problem.find("truncated"), std::string::npos)
          << layout.problem;
    }
  }
}

TEST(JpegMarkers, AcceptsBytesAfterTheEnd) {
  LAMP_SKIP_WITHOUT_PILLOW();
  auto bytes = oracle_file("rgb420_17x33").bytes;
  bytes.insert(bytes.end(), {0x00, 0x12, 0xFF, 0xD8, 0x34});
  EXPECT_EQ(read_jpeg_layout(bytes.data(), bytes.size()).problem, "");
}

TEST(JpegMarkers, RefusesWhatIsNotAJpeg) {
  EXPECT_NE(read_jpeg_layout(nullptr, 0).problem, "");
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  EXPECT_NE(
      read_jpeg_layout(png, sizeof(png)).problem.find("not a JPEG"),
      std::string::npos);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint8_t> bytes(1000);
    for (auto& b : bytes) {
      b = uint8_t(rng());
    }
    bytes[0] = 0xFF; // a JPEG's start, then noise
    bytes[1] = 0xD8;
    EXPECT_NE(read_jpeg_layout(bytes.data(), bytes.size()).problem, "");
  }
}

#if LAMP_WITH_NVJPEG

using lamp::data::detail::NvjpegDecoder;
using lamp::data::detail::NvjpegDecoderOptions;

// How far nvJPEG's pixels may be from libjpeg-turbo's. nvJPEG's IDCT and
// colour conversion round differently from libjpeg-turbo's accurate integer
// IDCT, and its chroma upsampling is not libjpeg-turbo's "fancy" (linear)
// one. Measured with libjpeg-turbo itself on these files: its fast IDCT
// differs by at most 5 (mean 1.0) and nearest-neighbour chroma by at most 7
// on the smooth pictures (mean 0.4) but by up to 85 at the edges of the
// coloured boxes ("edges": 0.9% of values by more than 8). So:
//   smooth pictures: max |difference| <= 10, mean <= 1.5 (the mean only
//     for at least 1000 values);
//   the picture with hard chroma edges: mean <= 2, at most 2% of values
//     off by more than 8.
// Gross errors (channel order, strides, orientation, garbage) give means in
// the tens.
constexpr int kMaxDiff = 10;
constexpr double kMeanDiff = 1.5;
constexpr double kEdgesMeanDiff = 2.0;
constexpr double kEdgesFarFraction = 0.02;

std::string backend(const NvjpegDecoder& decoder) {
  return decoder.hardware_decoded() ? "hardware" : "cuda";
}

// Checks one GPU-decoded image against the CPU decoder; prints the numbers.
void expect_close(
    const torch::Tensor& gpu,
    const JpegFile& f,
    const std::string& how) {
  SCOPED_TRACE(f.name + " (" + how + ")");
  ASSERT_TRUE(gpu.is_cuda());
  ASSERT_EQ(gpu.scalar_type(), torch::kByte);
  ASSERT_TRUE(gpu.is_contiguous());
  ASSERT_EQ(gpu.sizes(), torch::IntArrayRef({f.height, f.width, 3}));
  const torch::Tensor cpu =
      lamp::data::decode_image(f.bytes.data(), f.bytes.size(), f.name);
  const torch::Tensor diff =
      (gpu.cpu().to(torch::kInt) - cpu.to(torch::kInt)).abs();
  const int max = diff.max().item<int>();
  const double mean = diff.to(torch::kDouble).mean().item<double>();
  const double far = diff.gt(8).to(torch::kDouble).mean().item<double>();
  std::cout << "[ nvjpeg   ] " << f.name << " " << how << ": max " << max
            << ", mean " << mean << ", >8: " << 100 * far << "%\n";
  if (f.name.find("edges") != std::string::npos) {
    EXPECT_LE(mean, kEdgesMeanDiff);
    EXPECT_LE(far, kEdgesFarFraction);
    return;
  }
  EXPECT_LE(max, kMaxDiff);
  if (diff.numel() >= 1000) {
    EXPECT_LE(mean, kMeanDiff);
  }
}

// Runs without a GPU too: a device past the last one visible.
TEST(NvjpegDecoder, RefusesAMissingDevice) {
  const auto missing = c10::cuda::device_count();
  EXPECT_FALSE(lamp::data::detail::nvjpeg_available(missing));
  EXPECT_FALSE(lamp::data::detail::nvjpeg_available(-1));
  lamp::test::expect_error(
      [&] { NvjpegDecoder decoder(missing, 8); }, "no CUDA device");
}

class NvjpegDecoderGpu : public lamp::test::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) {
      return;
    }
    if (!lamp::data::detail::nvjpeg_available(0)) {
      GTEST_SKIP() << "nvJPEG cannot make a handle on cuda:0";
    }
    LAMP_SKIP_WITHOUT_PILLOW();
  }

  static std::vector<const JpegFile*> decodable() {
    std::vector<const JpegFile*> out;
    for (const auto& f : oracle_files()) {
      if (!f.for_cpu_only()) {
        out.push_back(&f);
      }
    }
    return out;
  }

  // decode()'s arguments for `files`.
  struct Inputs {
    std::vector<const uint8_t*> data;
    std::vector<size_t> sizes;
    std::vector<std::string> names;
  };
  static Inputs inputs(const std::vector<const JpegFile*>& files) {
    Inputs in;
    for (const auto* f : files) {
      in.data.push_back(f->bytes.data());
      in.sizes.push_back(f->bytes.size());
      in.names.push_back(f->name + ".jpg");
    }
    return in;
  }

  static std::vector<torch::Tensor> decode(
      NvjpegDecoder& decoder,
      const std::vector<const JpegFile*>& files,
      cudaStream_t stream) {
    const Inputs in = inputs(files);
    auto out = decoder.decode(in.data, in.sizes, in.names, stream);
    EXPECT_EQ(
        decoder.hardware_decoded() + decoder.cuda_decoded(),
        int64_t(files.size()));
    return out;
  }
};

TEST_F(NvjpegDecoderGpu, MatchesTheCpuDecoder) {
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  NvjpegDecoder hardware(0, 4);
  NvjpegDecoder cuda(0, 4, NvjpegDecoderOptions().hardware(false));
  EXPECT_FALSE(cuda.has_hardware());
  for (const auto* f : decodable()) {
    for (NvjpegDecoder* decoder : {&hardware, &cuda}) {
      const auto out = decode(*decoder, {f}, stream.stream());
      ASSERT_EQ(out.size(), 1u);
      stream.synchronize();
      expect_close(out[0], *f, backend(*decoder));
    }
    if (hardware.has_hardware() && f->progressive()) {
      EXPECT_EQ(hardware.cuda_decoded(), 1) << f->name; // engines: baseline
    }
  }
  if (hardware.has_hardware()) {
    decode(hardware, {&oracle_file("rgb420_500x375")}, stream.stream());
    EXPECT_EQ(hardware.hardware_decoded(), 1);
  }
}

TEST_F(NvjpegDecoderGpu, RegionsEqualTheWholeImageCropped) {
  // nvJPEG's ROI decode (the loader's training crops) on both backends, one
  // file at a time and as a batch: each region equals the whole image's
  // decode cropped, within one level (chroma upsampling at a region's edge
  // sees the same neighbours, as the whole decode does).
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  const auto files = decodable();
  const int n = static_cast<int>(files.size());
  NvjpegDecoder hardware(0, n);
  NvjpegDecoder cuda(0, n, NvjpegDecoderOptions().hardware(false));
  std::vector<lamp::data::CropBox> regions;
  for (const auto* f : files) {
    // Odd offsets and sizes: not on block boundaries.
    lamp::data::CropBox r;
    r.top = std::min<int64_t>(f->height / 5 + 1, f->height - 1);
    r.left = std::min<int64_t>(f->width / 3 + 3, f->width - 1);
    r.height = std::max<int64_t>((f->height - r.top) * 2 / 3, 1);
    r.width = std::max<int64_t>((f->width - r.left) * 3 / 5, 1);
    regions.push_back(r);
  }
  const Inputs in = inputs(files);
  const auto& data = in.data;
  const auto& sizes = in.sizes;
  const auto& names = in.names;
  for (NvjpegDecoder* decoder : {&hardware, &cuda}) {
    const auto whole = decoder->decode(data, sizes, names, stream.stream());
    const auto cropped =
        decoder->decode(data, sizes, names, stream.stream(), nullptr, &regions);
    EXPECT_EQ(
        decoder->hardware_decoded() + decoder->cuda_decoded(),
        int64_t(files.size()));
    stream.synchronize();
    for (size_t i = 0; i < files.size(); ++i) {
      SCOPED_TRACE(files[i]->name + " on " + backend(*decoder));
      const auto& r = regions[i];
      const auto expected = whole[i]
                                .narrow(0, r.top, r.height)
                                .narrow(1, r.left, r.width)
                                .to(torch::kInt);
      ASSERT_EQ(cropped[i].sizes(), torch::IntArrayRef({r.height, r.width, 3}));
      const int max =
          (cropped[i].to(torch::kInt) - expected).abs().max().item<int>();
      std::cout << "[ nvjpeg   ] region of " << files[i]->name << " on "
                << backend(*decoder) << ": max diff " << max << "\n";
      EXPECT_LE(max, 1);
    }
  }
  std::vector<lamp::data::CropBox> outside(files.size(), regions[0]);
  outside[0].top = files[0]->height;
  lamp::test::expect_error(
      [&] {
        hardware.decode(data, sizes, names, stream.stream(), nullptr, &outside);
      },
      "is not inside");
}

TEST_F(NvjpegDecoderGpu, UsesTheHardwareEnginesOfA100H100H200) {
  const std::string gpu = at::cuda::getDeviceProperties(0)->name;
  if (gpu.find("A100") == std::string::npos &&
      gpu.find("H100") == std::string::npos &&
      gpu.find("H200") == std::string::npos) {
    GTEST_SKIP() << gpu << " is not a GPU known to have JPEG engines";
  }
  NvjpegDecoder decoder(0, 4);
  EXPECT_TRUE(decoder.has_hardware()) << gpu;
}

TEST_F(NvjpegDecoderGpu, DecodesMixedBatches) {
  // 64 images of all sizes, twice as many as there are CUDA-backend slots
  // even on one backend, decoded twice, on two streams in turn.
  const auto files = decodable();
  std::vector<const JpegFile*> batch;
  for (size_t i = 0; batch.size() < 64; ++i) {
    batch.push_back(files[i % files.size()]);
  }
  const auto a = c10::cuda::getStreamFromPool(false, 0);
  const auto b = c10::cuda::getStreamFromPool(false, 0);
  NvjpegDecoder hardware(0, 64);
  NvjpegDecoder cuda(0, 64, NvjpegDecoderOptions().hardware(false));
  NvjpegDecoder cuda_malloc(
      0, 64, NvjpegDecoderOptions().hardware(false).caching_allocator(false));
  const auto first = decode(hardware, batch, a.stream());
  std::cout << "[ nvjpeg   ] batch of 64: " << hardware.hardware_decoded()
            << " on the engines, " << hardware.cuda_decoded()
            << " on the CUDA backend\n";
  const auto second = decode(hardware, batch, b.stream());
  const auto on_cuda = decode(cuda, batch, a.stream());
  EXPECT_EQ(cuda.cuda_decoded(), 64);
  const auto on_malloc = decode(cuda_malloc, batch, b.stream());
  a.synchronize();
  b.synchronize();
  for (size_t i = 0; i < batch.size(); ++i) {
    expect_close(first[i], *batch[i], "batch #" + std::to_string(i));
    EXPECT_TRUE(torch::equal(first[i], second[i])) << batch[i]->name;
    expect_close(on_cuda[i], *batch[i], "cuda batch #" + std::to_string(i));
    EXPECT_TRUE(torch::equal(on_cuda[i], on_malloc[i])) << batch[i]->name;
  }
}

TEST_F(NvjpegDecoderGpu, CropsOfRandomSizesNeedNoNewDeviceMemory) {
  // The loader's crops change size every batch. The outputs of a batch are
  // views of one block of the largest size so far, so once the whole
  // images have been decoded the caching allocator makes no new segment
  // (no cudaMalloc, which a training step beside it would wait for).
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  const auto files = decodable();
  NvjpegDecoder decoder(0, static_cast<int>(files.size()));
  const Inputs in = inputs(files);
  const auto& data = in.data;
  const auto& sizes = in.sizes;
  const auto& names = in.names;
  const auto segments = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
        .segment[0] // StatType::AGGREGATE
        .allocated;
  };
  std::mt19937 rng(5);
  std::vector<torch::Tensor> out =
      decoder.decode(data, sizes, names, stream.stream());
  int64_t after_two = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<lamp::data::CropBox> regions;
    for (const auto* f : files) {
      lamp::data::CropBox r;
      r.height = 1 + static_cast<int64_t>(rng() % f->height);
      r.width = 1 + static_cast<int64_t>(rng() % f->width);
      r.top = static_cast<int64_t>(rng() % (f->height - r.height + 1));
      r.left = static_cast<int64_t>(rng() % (f->width - r.width + 1));
      regions.push_back(r);
    }
    out =
        decoder.decode(data, sizes, names, stream.stream(), nullptr, &regions);
    ASSERT_EQ(out.size(), files.size());
    for (size_t i = 0; i < files.size(); ++i) {
      EXPECT_EQ(
          out[i].sizes(),
          torch::IntArrayRef({regions[i].height, regions[i].width, 3}));
      EXPECT_TRUE(out[i].is_contiguous());
    }
    if (round == 1) {
      after_two = segments();
    }
  }
  stream.synchronize();
  EXPECT_EQ(segments(), after_two);
  // One block: the outputs share their storage.
  EXPECT_TRUE(out.front().storage().is_alias_of(out.back().storage()));
}

TEST_F(NvjpegDecoderGpu, BuffersThatGrowKeepDecodingRight) {
  // Batches of larger and larger files, on two streams in turn, without
  // waiting in between: nvJPEG frees its smaller buffers and allocates
  // larger ones while the work of the batches before may still be queued
  // (its pinned ones go back to LibTorch's caching host allocator, to be
  // handed out again once that work is done). Every output must still be
  // the file's pixels, and the counts must add up.
  auto files = decodable();
  std::sort(files.begin(), files.end(), [](const auto* x, const auto* y) {
    return x->bytes.size() < y->bytes.size();
  });
  const auto a = c10::cuda::getStreamFromPool(false, 0);
  const auto b = c10::cuda::getStreamFromPool(false, 0);
  NvjpegDecoder hardware(0, 32);
  NvjpegDecoder cuda(0, 32, NvjpegDecoderOptions().hardware(false));
  std::vector<
      std::pair<std::vector<torch::Tensor>, std::vector<const JpegFile*>>>
      decoded;
  for (int round = 0; round < 2; ++round) {
    for (size_t n = 1; n <= 32; n *= 2) {
      std::vector<const JpegFile*> batch;
      for (size_t i = 0; i < n; ++i) {
        // The n-th batch ends with the largest files.
        batch.push_back(files[(files.size() - n + i) % files.size()]);
      }
      for (NvjpegDecoder* decoder : {&hardware, &cuda}) {
        const auto& stream = (n + round) % 2 ? a : b;
        decoded.emplace_back(decode(*decoder, batch, stream.stream()), batch);
      }
    }
  }
  a.synchronize();
  b.synchronize();
  for (const auto& [out, batch] : decoded) {
    ASSERT_EQ(out.size(), batch.size());
    for (size_t i = 0; i < out.size(); ++i) {
      expect_close(out[i], *batch[i], "batch of " + std::to_string(out.size()));
    }
  }
  for (NvjpegDecoder* decoder : {&hardware, &cuda}) {
    const auto counts = decoder->allocations();
    std::cout << "[ nvjpeg   ] " << (decoder == &cuda ? "cuda" : "hardware")
              << ": pinned " << counts.pinned_allocations << " allocated, "
              << counts.pinned_frees << " freed; device "
              << counts.device_allocations << " allocated, "
              << counts.device_frees << " freed\n";
    EXPECT_GT(counts.pinned_allocations, 0);
    EXPECT_LE(counts.pinned_frees, counts.pinned_allocations);
    EXPECT_LE(counts.device_frees, counts.device_allocations);
    EXPECT_GE(counts.pinned_bytes, counts.pinned_allocations);
  }
}

TEST_F(NvjpegDecoderGpu, CorruptFilesNameTheFile) {
  const auto& good = oracle_file("rgb420_500x375");
  const auto& progressive = oracle_file("rgb420_progressive_500x375");
  std::mt19937 rng(11);
  std::vector<uint8_t> noise(2000);
  for (auto& b : noise) {
    b = uint8_t(rng());
  }
  std::vector<uint8_t> noisy_jpeg = noise;
  noisy_jpeg[0] = 0xFF;
  noisy_jpeg[1] = 0xD8;
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> cases = {
      {"half_baseline.jpg",
       {good.bytes.begin(), good.bytes.begin() + good.bytes.size() / 2}},
      {"half_progressive.jpg",
       {progressive.bytes.begin(),
        progressive.bytes.begin() + progressive.bytes.size() / 2}},
      {"headers_only.jpg", {good.bytes.begin(), good.bytes.begin() + 300}},
      {"noise.jpg", noise},
      {"noise_after_soi.jpg", noisy_jpeg},
  };
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  for (bool hardware : {true, false}) {
    NvjpegDecoder decoder(0, 8, NvjpegDecoderOptions().hardware(hardware));
    for (const auto& [name, bytes] : cases) {
      SCOPED_TRACE(name);
      // Alone, and third in a batch of good files.
      lamp::test::expect_error(
          [&] {
            decoder.decode(
                {bytes.data()}, {bytes.size()}, {name}, stream.stream());
          },
          name);
      lamp::test::expect_error(
          [&] {
            decoder.decode(
                {good.bytes.data(), good.bytes.data(), bytes.data()},
                {good.bytes.size(), good.bytes.size(), bytes.size()},
                {"good.jpg", "good.jpg", name},
                stream.stream());
          },
          name);
    }
    const std::vector<uint8_t> empty;
    lamp::test::expect_error(
        [&] {
          decoder.decode({empty.data()}, {0}, {"empty.jpg"}, stream.stream());
        },
        "empty.jpg");
    // The decoder still works after the errors.
    const auto out = decode(decoder, {&good, &progressive}, stream.stream());
    stream.synchronize();
    expect_close(out[0], good, "after errors");
    expect_close(out[1], progressive, "after errors");
  }
}

// With `failures`, a bad file in a batch fails alone: the others decode,
// and so does every later batch (nvJPEG's states are made anew).
TEST_F(NvjpegDecoderGpu, ABadFileInABatchFailsAlone) {
  using lamp::data::detail::NvjpegFailure;
  const auto& good = oracle_file("rgb420_500x375");
  const auto& progressive = oracle_file("rgb420_progressive_500x375");
  const auto& cmyk = oracle_file("cmyk_64x48");
  const auto bogus = lamp::test::with_bogus_huffman_table(good.bytes);
  const std::vector<uint8_t> half(
      good.bytes.begin(), good.bytes.begin() + good.bytes.size() / 2);
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  for (bool hardware : {true, false}) {
    SCOPED_TRACE(hardware ? "hardware" : "cuda");
    NvjpegDecoder decoder(0, 8, NvjpegDecoderOptions().hardware(hardware));
    for (int round = 0; round < 3; ++round) {
      std::vector<std::optional<NvjpegFailure>> failures;
      const auto out = decoder.decode(
          {good.bytes.data(),
           bogus.data(),
           progressive.bytes.data(),
           half.data(),
           cmyk.bytes.data(),
           good.bytes.data()},
          {good.bytes.size(),
           bogus.size(),
           progressive.bytes.size(),
           half.size(),
           cmyk.bytes.size(),
           good.bytes.size()},
          {"a.jpg", "bogus.jpg", "b.jpg", "half.jpg", "cmyk.jpg", "c.jpg"},
          stream.stream(),
          &failures);
      ASSERT_EQ(failures.size(), 6u);
      for (int i : {0, 2, 5}) {
        EXPECT_FALSE(failures[i].has_value()) << failures[i]->message;
      }
      ASSERT_TRUE(failures[1] && failures[3] && failures[4]);
      EXPECT_FALSE(failures[1]->unsupported);
      EXPECT_NE(failures[1]->message.find("bogus.jpg"), std::string::npos);
      EXPECT_FALSE(failures[3]->unsupported);
      EXPECT_NE(failures[3]->message.find("half.jpg"), std::string::npos);
      EXPECT_TRUE(failures[4]->unsupported);
      EXPECT_FALSE(out[1].defined() || out[3].defined() || out[4].defined());
      EXPECT_EQ(decoder.hardware_decoded() + decoder.cuda_decoded(), 3);
      stream.synchronize();
      expect_close(out[0], good, "beside bad files");
      expect_close(out[2], progressive, "beside bad files");
      expect_close(out[5], good, "after bad files");
      // Alone, after them.
      const auto next = decode(decoder, {&good, &progressive}, stream.stream());
      stream.synchronize();
      expect_close(next[0], good, "the batch after");
      expect_close(next[1], progressive, "the batch after");
    }
  }
}

TEST_F(NvjpegDecoderGpu, UnsupportedFilesSaySo) {
  NvjpegDecoder decoder(0, 2);
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  for (const char* name : {"cmyk_64x48", "rgb_colorspace_64x48"}) {
    const auto& f = oracle_file(name);
    const std::string file = std::string(name) + ".jpg";
    for (const std::string& needle :
         {file, std::string("unsupported by nvJPEG")}) {
      lamp::test::expect_error_of<c10::NotImplementedError>(
          [&] {
            decoder.decode(
                {f.bytes.data()}, {f.bytes.size()}, {file}, stream.stream());
          },
          needle);
    }
  }
}

TEST_F(NvjpegDecoderGpu, RefusesBadArguments) {
  NvjpegDecoder decoder(0, 2);
  const auto& f = oracle_file("gray_1x1");
  const auto stream = c10::cuda::getStreamFromPool(false, 0);
  lamp::test::expect_error(
      [&] {
        decoder.decode(
            {f.bytes.data(), f.bytes.data(), f.bytes.data()},
            {f.bytes.size(), f.bytes.size(), f.bytes.size()},
            {"a", "b", "c"},
            stream.stream());
      },
      "max_batch_size");
  lamp::test::expect_error(
      [&] { decoder.decode({f.bytes.data()}, {}, {"a"}, stream.stream()); },
      "one of each per image");
  EXPECT_TRUE(decoder.decode({}, {}, {}, stream.stream()).empty());
}

#else

TEST(NvjpegDecoderGpu, NotBuilt) {
  GTEST_SKIP() << "lamp was built without nvJPEG (LAMP_WITH_NVJPEG=OFF)";
}

#endif

} // namespace

} // namespace nvjpeg_decoder_test
