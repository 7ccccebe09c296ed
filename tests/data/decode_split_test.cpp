// lamp::data::detail::DecodeSplit (src/data/decode_split.h): how many images
// of a batch ImageDecode::kAuto gives the GPU, from the measured cost of each
// path, so that the decode threads and the stage threads finish a batch
// together, and which of its images (the CPU keeps those cheapest for it).
// Pure arithmetic: no images, no GPU.

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

// The share of `n` decisions that went to the GPU, for ratios drawn
// uniformly from [0, 1) (a fixed sequence), and the mean ratio of each side.
struct Routed {
  double gpu_share = 0;
  double gpu_mean = 0;
  double cpu_mean = 0;
};
Routed route(DecodeSplit& split, double share, int n, uint32_t& state) {
  int gpu = 0;
  double gpu_sum = 0;
  double cpu_sum = 0;
  for (int i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const double ratio = static_cast<double>(state >> 8) / (1 << 24);
    if (split.to_gpu(ratio, share)) {
      ++gpu;
      gpu_sum += ratio;
    } else {
      cpu_sum += ratio;
    }
  }
  return {
      static_cast<double>(gpu) / n,
      gpu > 0 ? gpu_sum / gpu : 0,
      n > gpu ? cpu_sum / (n - gpu) : 0};
}

TEST(DecodeSplit, TheGpuGetsItsShareOfTheCostliestImages) {
  DecodeSplit split(kThreads, kStages);
  uint32_t state = 1;
  route(split, 0.4, 256, state); // fills the window
  const Routed r = route(split, 0.4, 16384, state);
  EXPECT_NEAR(r.gpu_share, 0.4, 0.02);
  // The GPU's images are the top 40 % of the ratios: mean ~0.8 (uniform on
  // [0.6, 1)); the CPU's the rest, mean ~0.3.
  EXPECT_NEAR(r.gpu_mean, 0.8, 0.03);
  EXPECT_NEAR(r.cpu_mean, 0.3, 0.03);
}

TEST(DecodeSplit, RoutingFollowsAChangingShare) {
  DecodeSplit split(kThreads, kStages);
  uint32_t state = 7;
  route(split, 0.2, 4096, state);
  EXPECT_NEAR(route(split, 0.2, 8192, state).gpu_share, 0.2, 0.02);
  route(split, 0.7, 16, state); // the window is full: at once
  EXPECT_NEAR(route(split, 0.7, 8192, state).gpu_share, 0.7, 0.02);
}

TEST(DecodeSplit, EqualRatiosGoToTheGpuAtItsShare) {
  // Images of one size and crop: every ratio the same.
  DecodeSplit split(kThreads, kStages);
  for (const double share : {0.25, 0.5, 0.8}) {
    int gpu = 0;
    for (int i = 0; i < 1000; ++i) {
      gpu += split.to_gpu(0.02, share) ? 1 : 0;
    }
    EXPECT_NEAR(gpu / 1000.0, share, 0.01) << share;
  }
}

TEST(DecodeSplit, RoutingStartsWithTheFirstImages) {
  // Small files (ratios near 0) from the first decision on: no settling.
  DecodeSplit split(kThreads, kStages);
  int gpu = 0;
  for (int i = 0; i < 32; ++i) {
    gpu += split.to_gpu(0.01 + 0.001 * (i % 5), 0.5) ? 1 : 0;
  }
  EXPECT_GE(gpu, 12);
  EXPECT_LE(gpu, 20);
}

TEST(DecodeSplit, AllOrNoneAtTheEnds) {
  DecodeSplit split(kThreads, kStages);
  uint32_t state = 3;
  EXPECT_EQ(route(split, 1.0, 1000, state).gpu_share, 1.0);
  EXPECT_EQ(route(split, 0.0, 1000, state).gpu_share, 0.0);
}

TEST(DecodeSplit, CostRatioGrowsWithTheRowsAndTheFile) {
  using lamp::data::detail::cpu_gpu_cost_ratio;
  // Partial decoding: half the rows, half the CPU's work.
  EXPECT_NEAR(
      cpu_gpu_cost_ratio(200000, 0.5),
      cpu_gpu_cost_ratio(200000, 1.0) / 2,
      1e-12);
  // The GPU's fixed part weighs more on a small file.
  EXPECT_LT(cpu_gpu_cost_ratio(50000, 1.0), cpu_gpu_cost_ratio(500000, 1.0));
  EXPECT_GT(cpu_gpu_cost_ratio(500000, 1.0), 0.7);
  EXPECT_LT(cpu_gpu_cost_ratio(500000, 1.0), 1.0);
  EXPECT_EQ(cpu_gpu_cost_ratio(0, 1.0), 0.0);
  EXPECT_EQ(cpu_gpu_cost_ratio(100000, 2.0), cpu_gpu_cost_ratio(100000, 1.0));
}

} // namespace

} // namespace decode_split_test
