#pragma once

// Internal: what a JPEG file's markers say about it, read without decoding
// (no library needed). The GPU decoder uses it to refuse truncated files and
// to send the JPEGs nvJPEG cannot decode (CMYK, RGB colour space, 12-bit,
// arithmetic coding) back to the CPU decoder.

#include <cstddef>
#include <cstdint>
#include <string>

#include <lamp/export.h>

namespace lamp::data::detail {

/// The frame and colour space of a JPEG file, and whether its bytes hold a
/// whole image.
struct JpegLayout {
  /// Why the bytes are not a whole JPEG ("not a JPEG ...", "corrupt ...",
  /// "truncated ..."); empty when the markers run from SOI through the
  /// frame header and at least one scan to EOI.
  std::string problem;
  /// The start-of-frame marker minus 0xC0: 0 baseline, 1 extended
  /// sequential, 2 progressive (all three Huffman-coded), 3 lossless,
  /// 5-7 hierarchical, 9-15 arithmetic-coded; -1 when there is none.
  int frame_type = -1;
  int precision = 0; ///< Bits per sample (8 for nearly every JPEG).
  int height = 0;
  int width = 0;
  int components = 0;
  /// Three components that hold R, G, B rather than Y, Cb, Cr: an Adobe
  /// marker with transform 0 and no JFIF marker, or component ids 'R', 'G',
  /// 'B' with neither (libjpeg's rule).
  bool rgb = false;
};

/// Walks the markers of `data`: segment lengths, the frame header, the
/// scans' entropy-coded data up to the next marker, and the end marker.
/// Bytes after EOI are ignored, as libjpeg ignores them; so are non-marker
/// bytes between segments. Costs one pass over the bytes (memchr speed).
LAMP_API JpegLayout read_jpeg_layout(const uint8_t* data, size_t size);

} // namespace lamp::data::detail
