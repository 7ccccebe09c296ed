#include "decode_split.h"

#include <algorithm>
#include <cmath>

namespace lamp::data::detail {
namespace {

// The running averages' weights of a new measurement: images vary, so a
// thread's cost is averaged over ~100 images, the stage's over ~5 batches.
constexpr double kImageWeight = 0.01;
constexpr double kBatchWeight = 0.2;

void update(double& average, double value, double weight) {
  average = average < 0 ? value : average + weight * (value - average);
}

} // namespace

DecodeSplit::DecodeSplit(int64_t threads, int64_t stages)
    : threads_(static_cast<double>(std::max<int64_t>(threads, 1))),
      stages_(static_cast<double>(std::max<int64_t>(stages, 1))) {}

int64_t DecodeSplit::gpu_rows(int64_t rows) const {
  if (rows <= 0) {
    return 0;
  }
  const int64_t least =
      std::min<int64_t>(std::max<int64_t>(rows / 32, 1), rows);
  if (cpu_ < 0 || gpu_ < 0) {
    return rows / 2;
  }
  const double read = read_ < 0 ? 0 : std::min(read_, cpu_);
  const double g = static_cast<double>(rows) * cpu_ / threads_ /
      (gpu_ / stages_ + (cpu_ - read) / threads_);
  const auto share = static_cast<int64_t>(std::llround(g));
  return std::clamp<int64_t>(share, least, std::max(rows - least, least));
}

void DecodeSplit::record_thread(bool decoded, double seconds) {
  update(decoded ? cpu_ : read_, seconds, kImageWeight);
}

void DecodeSplit::record_stage(int64_t gpu_images, double seconds) {
  if (gpu_images > 0) {
    update(gpu_, seconds / static_cast<double>(gpu_images), kBatchWeight);
  }
}

} // namespace lamp::data::detail
