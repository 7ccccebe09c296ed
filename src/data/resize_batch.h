#pragma once

// Internal: the training and evaluation transforms of a whole batch of
// GPU-decoded images in one kernel launch (src/data/resize_kernel.cu),
// instead of LibTorch's per-image interpolate (about seven kernels an image).
// Built only with LAMP_WITH_NVJPEG, whose loader path is its one user.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include <lamp/export.h>

#include "sample_pipeline.h"

namespace lamp::data::detail {

// Writes transform_decoded_into(recipe, placements[k], images[k], ...) into
// out[rows[k]] for every k, on the current CUDA stream. `images`: uint8
// [H, W, 3] contiguous on out's device, in use on the current stream;
// `out`: uint8 [N, S, S, 3] contiguous, S = recipe.image_size. Equal to
// LibTorch's CUDA interpolate(antialias=True) + round + clamp path up to
// float contraction (tests/resize_batch_test.cpp).
LAMP_API void resize_into_rows(
    const Recipe& recipe,
    const std::vector<Placement>& placements,
    const std::vector<torch::Tensor>& images,
    const std::vector<int64_t>& rows,
    torch::Tensor& out);

} // namespace lamp::data::detail
