#pragma once

// Internal: the delayed scales lamp::update_fp8_scales (lamp/fp8.h) updated
// ahead of their layers' forward calls. See Note [FP8 scales updated ahead]
// in fp8_update_scales.cpp.

#include "fp8_linear.h"

namespace lamp::nn::detail {

/// At a layer's forward call: true (once) if lamp::update_fp8_scales
/// updated `s` since its last call and nothing changed it since, so the
/// call skips its own update.
bool fp8_take_fresh_scales(const Fp8DelayedState& s);

} // namespace lamp::nn::detail
