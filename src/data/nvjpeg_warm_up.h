#pragma once

// Internal: a new NvjpegDecoder decodes a few tiny JPEGs of every layout
// nvJPEG takes (each chroma sampling, greyscale, progressive; whole and a
// region), so that CUDA loads nvJPEG's kernels then and not in the first
// epoch. See Note [nvJPEG's kernels load early] in nvjpeg_warm_up.cpp.

#include <cstdint>
#include <vector>

namespace lamp::data::detail {

class NvjpegDecoder;

/// The tiny JPEGs (96x64 pixels, made with libjpeg), one per layout.
std::vector<std::vector<uint8_t>> warm_up_jpegs();

/// Decodes them with `decoder` on a stream of its own, whole and a region
/// of each, and waits for the work. Never throws for an image the decoder
/// refuses (a GPU without engines, say); throws for a CUDA error.
void warm_up(NvjpegDecoder& decoder);

} // namespace lamp::data::detail
