#pragma once

// Internal: the checks lamp/data/transforms.h's functions make, shared with
// the loader's decoders and the batched GPU resize (defined in
// transforms.cpp).

#include <lamp/data/transforms.h>

#include <cstdint>

namespace lamp::data::detail {

// Throws c10::ValueError naming `who` unless `box` lies inside a `height` x
// `width` image (resized_crop's check, shared with the batched GPU path).
void check_box_inside(
    const CropBox& box,
    int64_t height,
    int64_t width,
    const char* who);

} // namespace lamp::data::detail
