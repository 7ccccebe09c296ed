#pragma once

// Internal: a whole batch of lamp::data's loader made on the GPU in one
// kernel launch (src/data/resize_kernel.cu): the training or evaluation
// transform of each GPU-decoded image, the rows the CPU decoded taken as
// they are, and, for the network's input, the normalisation, the cast and
// the memory format in the same pass (instead of LibTorch's per-image
// interpolate, about seven kernels an image, and a normalisation of four
// passes over the batch).

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <vector>

#include <lamp/export.h>

#include "sample_pipeline.h"

namespace lamp::data::detail {

// One row of a batch: `image` (uint8 [H, W, 3] contiguous, on the output's
// device, in use on the current stream) transformed by the recipe with
// `placement`, or, `as_is`, already the row's S x S pixels.
struct RowSource {
  torch::Tensor image;
  Placement placement;
  int64_t row = 0;
  bool as_is = false;
};

// (x / 255 - mean) / std per RGB channel.
struct Normalization {
  std::array<double, 3> mean{};
  std::array<double, 3> std{};
};

// Writes row `sources[k].row` of `out` for every k, on the current CUDA
// stream. `out`: uint8 [N, S, S, 3] contiguous (`normalization` null), or
// float, half or bfloat16 [N, 3, S, S] of any strides (NCHW or
// channels-last) holding the normalised pixels, equal to LibTorch's
// `x.div_(255).sub_(mean).div_(std)` on the uint8 rows, then cast.
// S = recipe.image_size. The transform equals LibTorch's CUDA
// interpolate(antialias=True) + round + clamp path up to float contraction
// (tests/data/resize_batch_test.cpp).
LAMP_API void write_rows(
    const Recipe& recipe,
    const std::vector<RowSource>& sources,
    const Normalization* normalization,
    torch::Tensor& out);

// write_rows to uint8 rows: image k to row rows[k] with placements[k].
LAMP_API void resize_into_rows(
    const Recipe& recipe,
    const std::vector<Placement>& placements,
    const std::vector<torch::Tensor>& images,
    const std::vector<int64_t>& rows,
    torch::Tensor& out);

} // namespace lamp::data::detail
