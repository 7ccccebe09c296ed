#pragma once

// Internal: what lamp::checkpoint tells the FP8 path (lamp/fp8.h).

namespace lamp::nn::detail {

/// True while this thread runs a lamp::checkpoint recompute: delayed FP8
/// scales are used as the forward call left them, not updated again (and
/// lamp::is_recomputing() reads it).
bool& fp8_recomputing();

} // namespace lamp::nn::detail
