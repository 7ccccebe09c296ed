#pragma once

// Internal: the two steps of decoding an image file on the CPU (its header,
// then the pixels of a region), each returning what is wrong with the file
// as a message that names it and says what to do, instead of throwing. The
// loader uses them to tell an image it cannot decode (skipped with
// skip_bad_images) from every other failure (out of memory, a bad option,
// an I/O error), which throws; lamp/data/image_decoder.h's functions throw
// the message.

#include <lamp/data/image_decoder.h>
#include <lamp/data/transforms.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace lamp::data::detail {

/// What an image's header says.
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t height = 0;
  int64_t width = 0;
};

/// Reads the header of the image in `data` (file `name`). Returns "" or
/// what is wrong: not a JPEG or PNG, an unreadable header, or more pixels
/// than kMaxImagePixels.
std::string read_image_header(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    ImageHeader* header);

/// Decodes `region` of the image (inside it; for a PNG, the whole image) to
/// RGB rows of 3 * region.width bytes at `out`. `scale` 2, 4 or 8 (JPEGs
/// only) reduces the image that many times in the DCT domain first, as
/// Pillow's draft(); `region` then lies in the reduced image,
/// scaled_extent(header.height, scale) x scaled_extent(header.width, scale).
/// Returns "" or what is wrong.
std::string decode_image_region(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const ImageHeader& header,
    const CropBox& region,
    uint8_t* out,
    int scale = 1);

/// An image side of `extent` pixels reduced `scale` times in the DCT domain
/// (libjpeg rounds up).
inline int64_t scaled_extent(int64_t extent, int scale) {
  return (extent + scale - 1) / scale;
}

} // namespace lamp::data::detail
