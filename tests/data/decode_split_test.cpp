// lamp::data::detail::DecodeSplit (src/data/decode_split.h): how many images
// of a batch ImageDecode::kAuto gives the GPU, from the measured cost of each
// path, so that the decode threads and the stage threads finish a batch
// together. Pure arithmetic: no images, no GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "data/decode_split.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace decode_split_test {

namespace {

using lamp::data::detail::DecodeSplit;

constexpr int64_t kThreads = 16;
constexpr int64_t kStages = 2;

// Seconds the decode threads and the stage threads spend on a batch of
// `rows` with `gpu` of them for the GPU: each image costs `cpu` decoded on
// a thread, `read` read there for the GPU, `stage` on a stage thread.
double thread_seconds(int64_t rows, int64_t gpu, double cpu, double read) {
  return (static_cast<double>(rows - gpu) * cpu +
          static_cast<double>(gpu) * read) /
      kThreads;
}
double stage_seconds(int64_t gpu, double stage) {
  return static_cast<double>(gpu) * stage / kStages;
}

// A split that has seen these steady costs.
DecodeSplit measured(double cpu, double read, double stage) {
  DecodeSplit split(kThreads, kStages);
  split.record_thread(/*decoded=*/true, cpu);
  split.record_thread(/*decoded=*/false, read);
  split.record_stage(/*gpu_images=*/100, 100 * stage);
  return split;
}

TEST(DecodeSplit, HalfABatchUntilBothSidesAreMeasured) {
  DecodeSplit split(kThreads, kStages);
  EXPECT_EQ(split.gpu_rows(256), 128);
  split.record_thread(/*decoded=*/true, 4e-3);
  EXPECT_EQ(split.gpu_rows(256), 128) << "the GPU is not measured yet";
  split.record_stage(/*gpu_images=*/0, 1.0);
  EXPECT_EQ(split.gpu_rows(256), 128)
      << "a batch without GPU images measures nothing";
  EXPECT_EQ(split.gpu_rows(0), 0);
}

TEST(DecodeSplit, BothSidesFinishABatchTogether) {
  // Photograph-like costs on an H200 host: 4 ms of a core to decode an
  // image, 0.2 ms to read one for the GPU, 0.5 ms of a stage thread an
  // image the GPU decodes; and two others.
  const double costs[][3] = {
      {4e-3, 0.2e-3, 0.5e-3}, {2e-3, 0.1e-3, 1e-3}, {8e-3, 0.3e-3, 0.3e-3}};
  for (const auto& c : costs) {
    const DecodeSplit split = measured(c[0], c[1], c[2]);
    const int64_t gpu = split.gpu_rows(256);
    ASSERT_GT(gpu, 0);
    ASSERT_LT(gpu, 256);
    // One image more or fewer for the GPU moves the two times apart by at
    // most one image's share of each side.
    const double slack = c[0] / kThreads + c[2] / kStages;
    EXPECT_LE(
        std::abs(
            thread_seconds(256, gpu, c[0], c[1]) - stage_seconds(gpu, c[2])),
        slack)
        << "cpu " << c[0] << ", read " << c[1] << ", stage " << c[2] << ": "
        << gpu << " images for the GPU";
  }
  // The first case in numbers: 256 * (4e-3 / 16) / (0.5e-3 / 2 +
  // (4e-3 - 0.2e-3) / 16) = 131.3.
  EXPECT_EQ(measured(4e-3, 0.2e-3, 0.5e-3).gpu_rows(256), 131);
}

TEST(DecodeSplit, TheSlowerSideGetsFewerImages) {
  const int64_t base = measured(4e-3, 0.2e-3, 0.5e-3).gpu_rows(256);
  EXPECT_GT(measured(6e-3, 0.2e-3, 0.5e-3).gpu_rows(256), base)
      << "slower CPU decoding";
  EXPECT_LT(measured(4e-3, 0.2e-3, 0.8e-3).gpu_rows(256), base)
      << "a slower GPU path";
}

TEST(DecodeSplit, EachSideKeepsAThirtySecondOfABatch) {
  // So that both go on being measured.
  EXPECT_EQ(measured(4e-3, 0.2e-3, 1e-9).gpu_rows(256), 256 - 8);
  EXPECT_EQ(measured(1e-9, 1e-9, 1.0).gpu_rows(256), 8);
  EXPECT_EQ(measured(1e-9, 1e-9, 1.0).gpu_rows(16), 1);
}

TEST(DecodeSplit, CostsAreRunningAverages) {
  // A thread's cost moves 1 % towards each new image's, the stage's 20 %
  // towards each new batch's: one odd image or batch barely moves the split.
  DecodeSplit split = measured(4e-3, 0.2e-3, 0.5e-3);
  const int64_t before = split.gpu_rows(256);
  split.record_thread(/*decoded=*/true, 40e-3); // one image 10x as slow
  const int64_t after_image = split.gpu_rows(256);
  EXPECT_GT(after_image, before);
  EXPECT_LE(after_image, before + 12);
  for (int i = 0; i < 2000; ++i) {
    split.record_thread(/*decoded=*/true, 4e-3);
  }
  EXPECT_EQ(split.gpu_rows(256), before) << "back once it passed";
  split.record_stage(/*gpu_images=*/128, 128 * 1e-3); // one batch 2x slower
  const int64_t after_batch = split.gpu_rows(256);
  EXPECT_LT(after_batch, before);
  for (int i = 0; i < 100; ++i) {
    split.record_stage(/*gpu_images=*/128, 128 * 0.5e-3);
  }
  EXPECT_EQ(split.gpu_rows(256), before);
}

} // namespace

} // namespace decode_split_test
