#include <lamp/data/image_decoder.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <sys/stat.h>

#include "image_decoder_detail.h"
#include "jpeg_decoder.h"
#include "png_reader.h"
#include "sample_pipeline.h"
#include "transforms_detail.h"

namespace lamp::data {
namespace detail {
namespace {

std::string bad_file(
    const std::string& name,
    const char* what,
    const char* library,
    const std::string& why) {
  return c10::str(
      "lamp::data: '",
      name,
      "' is ",
      what,
      " (",
      library,
      ": ",
      why,
      "); replace or remove the file");
}

} // namespace

std::string read_image_header(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    ImageHeader* header) {
  header->format = image_format(data, size);
  switch (header->format) {
    case ImageFormat::kJpeg: {
      JpegInfo info;
      const std::string why = read_jpeg_info(data, size, &info);
      if (!why.empty()) {
        return bad_file(name, "not a readable JPEG", "libjpeg", why);
      }
      header->height = info.height;
      header->width = info.width;
      break;
    }
    case ImageFormat::kPng: {
      PngInfo info;
      char error[256] = {0};
      if (!png_read_info(data, size, &info, error, sizeof(error))) {
        return bad_file(name, "not a readable PNG", "libpng", error);
      }
      header->height = info.height;
      header->width = info.width;
      break;
    }
    case ImageFormat::kUnknown:
      return c10::str(
          "lamp::data: '",
          name,
          "' is neither a JPEG nor a PNG (judged by its first bytes), "
          "the formats lamp decodes; convert it, or leave its extension "
          "out of ImageFolderOptions::extensions");
  }
  // NOTE: in double: two 16-bit JPEG sides, or two 31-bit PNG sides, do not
  // fit an int64 product check otherwise.
  const double pixels =
      static_cast<double>(header->height) * static_cast<double>(header->width);
  if (pixels > static_cast<double>(kMaxImagePixels)) {
    return c10::str(
        "lamp::data: '",
        name,
        "' has ",
        header->height,
        "x",
        header->width,
        " pixels, more than the ",
        kMaxImagePixels,
        " lamp decodes (Pillow's decompression-bomb limit); shrink the "
        "image, or remove it");
  }
  return {};
}

std::string decode_image_region(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const ImageHeader& header,
    const CropBox& region,
    uint8_t* out,
    int scale) {
  TORCH_CHECK(
      scale == 1 || header.format == ImageFormat::kJpeg,
      "decode_image_region: only a JPEG can be decoded reduced");
  check_box_inside(
      region,
      scaled_extent(header.height, scale),
      scaled_extent(header.width, scale),
      "decode_image_region");
  if (header.format == ImageFormat::kJpeg) {
    const std::string why = decode_jpeg_region(data, size, region, out, scale);
    return why.empty()
        ? why
        : bad_file(name, "a corrupt or truncated JPEG", "libjpeg", why);
  }
  TORCH_INTERNAL_ASSERT(
      header.format == ImageFormat::kPng && region.top == 0 &&
          region.left == 0 && region.height == header.height &&
          region.width == header.width,
      "decode_image_region: a PNG is decoded whole");
  char error[256] = {0};
  if (!png_read_rgb(data, size, out, error, sizeof(error))) {
    return bad_file(name, "a corrupt or truncated PNG", "libpng", error);
  }
  return {};
}

} // namespace detail

namespace {

detail::ImageHeader header_or_throw(
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  detail::ImageHeader header;
  const std::string problem =
      detail::read_image_header(data, size, name, &header);
  TORCH_CHECK(problem.empty(), problem);
  return header;
}

} // namespace

ImageFormat image_format(const uint8_t* data, size_t size) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    return ImageFormat::kJpeg;
  }
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) {
    return ImageFormat::kPng;
  }
  return ImageFormat::kUnknown;
}

ImageSize image_size(
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  const auto header = header_or_throw(data, size, name);
  return {header.height, header.width};
}

torch::Tensor decode_image(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    torch::Tensor out) {
  const auto header = header_or_throw(data, size, name);
  if (!(out.defined() && out.dtype() == torch::kUInt8 && out.is_cpu() &&
        out.is_contiguous() && out.dim() == 3 && out.size(0) == header.height &&
        out.size(1) == header.width && out.size(2) == 3)) {
    out = torch::empty({header.height, header.width, 3}, torch::kUInt8);
  }
  const std::string problem = detail::decode_image_region(
      data,
      size,
      name,
      header,
      CropBox{0, 0, header.height, header.width},
      out.data_ptr<uint8_t>());
  TORCH_CHECK(problem.empty(), problem);
  return out;
}

torch::Tensor decode_image(const std::string& path) {
  const auto bytes = read_file(path);
  return decode_image(bytes.data(), bytes.size(), path);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(
      std::fopen(path.c_str(), "rb"), &std::fclose);
  TORCH_CHECK(
      file != nullptr,
      "lamp::data: cannot open '",
      path,
      "': ",
      std::strerror(errno));
  struct stat st {};
  TORCH_CHECK(
      fstat(fileno(file.get()), &st) == 0 && S_ISREG(st.st_mode),
      "lamp::data: '",
      path,
      "' is not a regular file");
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  const size_t n = std::fread(bytes.data(), 1, bytes.size(), file.get());
  TORCH_CHECK(
      n == bytes.size() && !std::ferror(file.get()),
      "lamp::data: cannot read '",
      path,
      "' (",
      n,
      " of ",
      bytes.size(),
      " bytes): ",
      std::strerror(errno));
  return bytes;
}

} // namespace lamp::data
