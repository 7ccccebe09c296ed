#pragma once

// Internal: JPEG decoding on the CPU with libjpeg-turbo's libjpeg API, for
// lamp::data::decode_image() and the loader's decode threads: the header
// alone, or the pixels of one region of the image (a crop plus a margin: the
// loader decodes only what RandomResizedCrop keeps), to RGB as Pillow's
// `Image.open(f).convert("RGB")` gives them.
//
// NOTE: libjpeg reports errors by longjmp, so the functions here return what
// went wrong as a string (empty on success) instead of throwing; the caller
// names the file and decides whether it is an error.

#include <lamp/data/transforms.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace lamp::data::detail {

/// A JPEG's frame, from its header.
struct JpegInfo {
  int64_t height = 0;
  int64_t width = 0;
  /// 4 components (CMYK or YCCK): Pillow opens these as inverted ("Adobe")
  /// CMYK; decode_jpeg_region converts them to RGB as its convert("RGB").
  bool cmyk = false;
};

/// Reads the header of the JPEG in `data`. Returns "" or libjpeg's reason.
std::string read_jpeg_info(const uint8_t* data, size_t size, JpegInfo* info);

/// Decodes the pixels of `region` (inside the image) to RGB rows of
/// 3 * region.width bytes at `out`. Accurate integer DCT and fancy
/// upsampling (Pillow's defaults); only the region's columns go through the
/// inverse DCT, and decoding stops after its last row (libjpeg-turbo's
/// jpeg_crop_scanline and jpeg_skip_scanlines), with a margin around it so
/// that its pixels equal those of a whole decode. Returns "" or libjpeg's
/// reason. A file that ends before the region's last row is truncated;
/// warnings about damaged data that libjpeg decodes anyway are not errors
/// (Pillow accepts those files too).
///
/// `scale` 2, 4 or 8 decodes the image reduced that many times in the DCT
/// domain (libjpeg's scale_denom; ceil(height / scale) x ceil(width /
/// scale) pixels, as Pillow's `draft("RGB", (width // scale, height //
/// scale))`), and `region` lies in the reduced image.
std::string decode_jpeg_region(
    const uint8_t* data,
    size_t size,
    const CropBox& region,
    uint8_t* out,
    int scale = 1);

} // namespace lamp::data::detail
