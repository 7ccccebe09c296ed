#include <lamp/data/image_decoder.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <sys/stat.h>

#include <turbojpeg.h>
#include "png_reader.h"

namespace lamp::data {
namespace {

// One TurboJPEG decompressor per thread: a handle is not thread-safe and
// creating one per image costs more than decoding a small JPEG.
tjhandle thread_decompressor() {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h != nullptr) {
        tjDestroy(h);
      }
    }
  };
  thread_local Handle handle;
  TORCH_CHECK(
      handle.h != nullptr,
      "lamp::data: could not create a libjpeg-turbo decompressor: ",
      tjGetErrorStr2(nullptr));
  return handle.h;
}

struct JpegHeader {
  int width = 0;
  int height = 0;
  int colorspace = 0;
};

JpegHeader jpeg_header(
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  tjhandle tj = thread_decompressor();
  JpegHeader header;
  int subsampling = 0;
  const int rc = tjDecompressHeader3(
      tj,
      data,
      static_cast<unsigned long>(size),
      &header.width,
      &header.height,
      &subsampling,
      &header.colorspace);
  TORCH_CHECK(
      rc == 0,
      "lamp::data: '",
      name,
      "' is not a readable JPEG (libjpeg-turbo: ",
      tjGetErrorStr2(tj),
      "); replace or remove the file, or set skip_bad_images");
  return header;
}

torch::Tensor output_for(torch::Tensor out, int64_t height, int64_t width) {
  if (out.defined() && out.dtype() == torch::kUInt8 && out.is_cpu() &&
      out.is_contiguous() && out.dim() == 3 && out.size(0) == height &&
      out.size(1) == width && out.size(2) == 3) {
    return out;
  }
  return torch::empty({height, width, 3}, torch::kUInt8);
}

torch::Tensor decode_jpeg(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    torch::Tensor out) {
  const JpegHeader header = jpeg_header(data, size, name);
  TORCH_CHECK(
      header.colorspace != TJCS_CMYK && header.colorspace != TJCS_YCCK,
      "lamp::data: '",
      name,
      "' is a CMYK JPEG, which lamp does not decode; convert it to "
      "RGB (e.g. PIL's img.convert('RGB').save(...))");
  out = output_for(std::move(out), header.height, header.width);
  tjhandle tj = thread_decompressor();
  // Flags 0: accurate integer DCT and fancy upsampling, Pillow's defaults.
  const int rc = tjDecompress2(
      tj,
      data,
      static_cast<unsigned long>(size),
      out.data_ptr<uint8_t>(),
      header.width,
      /*pitch=*/0,
      header.height,
      TJPF_RGB,
      /*flags=*/0);
  if (rc != 0) {
    // NOTE: libjpeg-turbo reports some harmless oddities as warnings
    // ("extraneous bytes before marker") and still decodes every pixel;
    // Pillow accepts those too. A file that ends early is a warning as well
    // ("Premature end of JPEG file"), but there the missing rows are grey:
    // Pillow raises "image file is truncated" and so do we.
    const bool warning = tjGetErrorCode(tj) == TJERR_WARNING;
    const std::string what = tjGetErrorStr2(tj);
    TORCH_CHECK(
        warning && what.find("Premature end") == std::string::npos,
        "lamp::data: '",
        name,
        "' is a corrupt or truncated JPEG ",
        "(libjpeg-turbo: ",
        what,
        "); replace or remove the file, or set skip_bad_images");
  }
  return out;
}

detail::PngInfo png_header(
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  detail::PngInfo info;
  char error[256] = {0};
  TORCH_CHECK(
      detail::png_read_info(data, size, &info, error, sizeof(error)),
      "lamp::data: '",
      name,
      "' is not a readable PNG (libpng: ",
      error,
      "); replace or remove the file, or set skip_bad_images");
  return info;
}

torch::Tensor decode_png(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    torch::Tensor out) {
  const detail::PngInfo info = png_header(data, size, name);
  char error[256] = {0};
  out = output_for(std::move(out), info.height, info.width);
  TORCH_CHECK(
      detail::png_read_rgb(
          data, size, out.data_ptr<uint8_t>(), error, sizeof(error)),
      "lamp::data: '",
      name,
      "' is a corrupt or truncated PNG (libpng: ",
      error,
      "); replace or remove the file, or set skip_bad_images");
  return out;
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

namespace {
[[noreturn]] void unknown_format(const std::string& name) {
  TORCH_CHECK(
      false,
      "lamp::data: '",
      name,
      "' is neither a JPEG nor a PNG (judged by its first bytes), "
      "the formats lamp decodes; convert it, or leave its extension "
      "out of ImageFolderOptions::extensions");
}
} // namespace

ImageSize image_size(
    const uint8_t* data,
    size_t size,
    const std::string& name) {
  switch (image_format(data, size)) {
    case ImageFormat::kJpeg: {
      const JpegHeader header = jpeg_header(data, size, name);
      return {header.height, header.width};
    }
    case ImageFormat::kPng: {
      const detail::PngInfo info = png_header(data, size, name);
      return {info.height, info.width};
    }
    case ImageFormat::kUnknown:
      break;
  }
  unknown_format(name);
}

torch::Tensor decode_image(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    torch::Tensor out) {
  switch (image_format(data, size)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(data, size, name, std::move(out));
    case ImageFormat::kPng:
      return decode_png(data, size, name, std::move(out));
    case ImageFormat::kUnknown:
      break;
  }
  unknown_format(name);
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
