#pragma once

// Decoding image files to RGB pixels on the CPU: JPEG with libjpeg-turbo,
// PNG with libpng. lamp::data::ImageLoader decodes with the same code on its
// decode threads; these functions are also usable alone.

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lamp/export.h>

namespace lamp::data {

/// The image formats lamp decodes.
enum class ImageFormat { kJpeg, kPng, kUnknown };

/// The format of an encoded image, from its first bytes (its signature), not
/// from its file name: a JPEG starts with FF D8 FF, a PNG with 89 'PNG'.
LAMP_API ImageFormat image_format(const uint8_t* data, size_t size);

/// The most pixels (height x width) lamp decodes in one image: Pillow's
/// decompression-bomb error threshold (2 x Image.MAX_IMAGE_PIXELS). A larger
/// image is an error rather than an allocation of gigabytes.
constexpr int64_t kMaxImagePixels = 2 * 89478485;

/// The width and height of an encoded JPEG or PNG, read from its header
/// without decoding the pixels. `name` (e.g. the file's path) appears in the
/// error thrown for a corrupt, truncated or unsupported image.
struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
};
LAMP_API ImageSize
image_size(const uint8_t* data, size_t size, const std::string& name);

/// Decodes an encoded JPEG or PNG held in memory to RGB: a uint8 CPU tensor
/// of shape [height, width, 3] (the layout of a PIL image's
/// `np.asarray(img.convert("RGB"))`). Grayscale, palette, CMYK and YCCK
/// images are converted to RGB as `convert("RGB")` converts them; PNG alpha
/// is dropped (what `convert("RGB")` does) and 16-bit PNG samples are
/// reduced to 8 bits.
///
/// JPEG uses libjpeg-turbo's accurate integer DCT and fancy upsampling,
/// Pillow's defaults, so the pixels equal Pillow's when both link the same
/// libjpeg-turbo. `out`, if defined, is reused when it is a contiguous uint8
/// CPU tensor of the right size (e.g. a decode thread's buffer).
///
/// Throws `c10::Error` naming `name` for a corrupt or truncated image, for
/// an image of more than kMaxImagePixels pixels and for formats other than
/// JPEG and PNG (convert those, or leave them out of the folder with
/// ImageFolderOptions::extensions). A failure leaves nothing behind: the
/// next image decodes as if it were the first.
///
/// Example:
/// \code
///   auto bytes = lamp::data::read_file("cat.jpg");
///   torch::Tensor rgb =
///       lamp::data::decode_image(bytes.data(), bytes.size(), "cat.jpg");
/// \endcode
LAMP_API torch::Tensor decode_image(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    torch::Tensor out = {});

/// Reads a whole file and decodes it with decode_image().
LAMP_API torch::Tensor decode_image(const std::string& path);

/// The bytes of a file; throws `c10::Error` naming the file (and errno's
/// reason) when it cannot be read.
LAMP_API std::vector<uint8_t> read_file(const std::string& path);

} // namespace lamp::data
