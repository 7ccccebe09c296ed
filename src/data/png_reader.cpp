#include "png_reader.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <png.h>

namespace lamp::data::detail {
namespace {

// Where libpng reads from and where its error message goes.
struct Source {
  const uint8_t* data;
  size_t size;
  size_t offset;
  char* error;
  size_t error_size;
};

void read_bytes(png_structp png, png_bytep out, png_size_t count) {
  auto* source = static_cast<Source*>(png_get_io_ptr(png));
  if (source->size - source->offset < count) {
    png_error(png, "the file ends early (truncated)");
  }
  std::memcpy(out, source->data + source->offset, count);
  source->offset += count;
}

void on_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<Source*>(png_get_error_ptr(png));
  std::snprintf(source->error, source->error_size, "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {
  // Pillow ignores libpng's warnings (e.g. an unknown sRGB profile).
}

// Runs the whole read; `out` null reads the header only.
bool read(
    const uint8_t* data,
    size_t size,
    PngInfo* info,
    uint8_t* out,
    char* error,
    size_t error_size) {
  Source source{data, size, 0, error, error_size};
  png_structp png = png_create_read_struct(
      PNG_LIBPNG_VER_STRING, &source, &on_error, &on_warning);
  if (png == nullptr) {
    std::snprintf(error, error_size, "out of memory");
    return false;
  }
  png_infop png_info = png_create_info_struct(png);
  if (png_info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &png_info, nullptr);
    return false;
  }
  png_set_read_fn(png, &source, &read_bytes);
  png_read_info(png, png_info);
  const png_uint_32 width = png_get_image_width(png, png_info);
  const png_uint_32 height = png_get_image_height(png, png_info);
  if (info != nullptr) {
    info->width = width;
    info->height = height;
  }
  if (out != nullptr) {
    const int color = png_get_color_type(png, png_info);
    png_set_strip_16(png); // the high byte, as PIL's "RGB;16B" raw mode
    png_set_packing(png);
    if (color == PNG_COLOR_TYPE_PALETTE) {
      png_set_palette_to_rgb(png);
    }
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
      png_set_expand_gray_1_2_4_to_8(png);
      png_set_gray_to_rgb(png);
    }
    png_set_strip_alpha(png);
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, png_info);
    if (png_get_rowbytes(png, png_info) != static_cast<size_t>(width) * 3) {
      png_error(png, "unexpected row layout after conversion to RGB");
    }
    for (int pass = 0; pass < passes; ++pass) {
      for (png_uint_32 y = 0; y < height; ++y) {
        png_read_row(png, out + static_cast<size_t>(y) * width * 3, nullptr);
      }
    }
    png_read_end(png, nullptr);
  }
  png_destroy_read_struct(&png, &png_info, nullptr);
  return true;
}

} // namespace

bool png_read_info(
    const uint8_t* data,
    size_t size,
    PngInfo* info,
    char* error,
    size_t error_size) {
  return read(data, size, info, nullptr, error, error_size);
}

bool png_read_rgb(
    const uint8_t* data,
    size_t size,
    uint8_t* out,
    char* error,
    size_t error_size) {
  return read(data, size, nullptr, out, error, error_size);
}

} // namespace lamp::data::detail
