#include "jpeg_decoder.h"

#include "jpeg_markers.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// clang-format off
#include <jpeglib.h> // needs <cstdio> first
#include <jerror.h>
// clang-format on

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "lamp::data needs libjpeg-turbo's libjpeg (jpeg_crop_scanline)"
#endif

namespace lamp::data::detail {
namespace {

// Rows and columns decoded beyond the region on each side (where the image
// has them): libjpeg's upsampling of the chroma planes treats the edge of a
// cropped scanline as the image's edge, which changes the two luma pixels
// next to it; 16 (an iMCU of 4:2:0) keeps those pixels out of the region.
constexpr int64_t kMargin = 16;

// Note [libjpeg errors and the per-thread decompressor]
// libjpeg calls error_exit on an error, which must not return: it longjmps
// back to the setjmp in run(), over libjpeg's own frames only (the functions
// between setjmp and longjmp keep no C++ objects with destructors). The
// decompressor is then in an unknown state, and reusing it made every later
// file on the same thread fail ("Bogus Huffman table definition" after one
// bad table): so after any error it is destroyed and made anew. After a
// success, jpeg_abort_decompress resets it for the next file; its memory
// pools stay. One per thread (thread_local): libjpeg objects are not
// thread-safe, and making one per file costs more than a small file's
// decode.
struct Errors {
  jpeg_error_mgr pub; // first: libjpeg casts its pointer to ours
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool ended_early; // "Premature end of JPEG file"
};

void on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<Errors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  // Warnings only (level -1); trace messages (level >= 0) are ignored.
  if (level < 0) {
    auto* errors = reinterpret_cast<Errors*>(cinfo->err);
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
      errors->ended_early = true;
    }
    cinfo->err->num_warnings++;
  }
}

struct Decompressor {
  jpeg_decompress_struct cinfo{};
  Errors errors{};
  bool made = false;

  Decompressor() {
    make();
  }
  ~Decompressor() {
    if (made) {
      jpeg_destroy_decompress(&cinfo);
    }
  }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;

  void make() {
    cinfo.err = jpeg_std_error(&errors.pub);
    errors.pub.error_exit = &on_error;
    errors.pub.emit_message = &on_message;
    // jpeg_create_decompress reports running out of memory through
    // error_exit as well.
    if (setjmp(errors.jump)) {
      made = false;
      return;
    }
    jpeg_create_decompress(&cinfo);
    made = true;
  }

  // After an error: see Note [libjpeg errors and the per-thread
  // decompressor].
  void remake() {
    if (made) {
      jpeg_destroy_decompress(&cinfo);
      made = false;
    }
    cinfo = jpeg_decompress_struct{};
    errors = Errors{};
    make();
  }
};

Decompressor& thread_decompressor() {
  thread_local Decompressor d;
  if (!d.made) {
    d.remake();
  }
  return d;
}

// Pillow's convert("RGB") of a CMYK image (libImaging's cmyk2rgb); the file
// holds inverted ("Adobe") values, which Pillow inverts when it reads them
// (rawmode "CMYK;I"), so c, m, y, k here are 255 minus Pillow's.
inline uint8_t cmyk_channel(int inverted_ink, int inverted_k) {
  const int ink = 255 - inverted_ink;
  const int nk = inverted_k; // 255 - Pillow's k
  const int t = ink * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

void store_row(const JSAMPLE* in, int components, int64_t width, uint8_t* out) {
  if (components == 3) {
    std::memcpy(out, in, static_cast<size_t>(width) * 3);
    return;
  }
  for (int64_t x = 0; x < width; ++x) {
    const JSAMPLE* p = in + 4 * x;
    out[3 * x + 0] = cmyk_channel(p[0], p[3]);
    out[3 * x + 1] = cmyk_channel(p[1], p[3]);
    out[3 * x + 2] = cmyk_channel(p[2], p[3]);
  }
}

struct Request {
  const uint8_t* data;
  size_t size;
  JpegInfo* info; // header only when region is null
  const CropBox* region;
  uint8_t* out;
  int scale; // 1, 2, 4 or 8: libjpeg's scale_denom
  bool stopped_early; // out: rows after the region were not decoded
};

// The whole libjpeg conversation; false on an error (message in `d`).
// NOTE: only trivially destructible locals between setjmp and the end (see
// the Note above).
bool run(Decompressor& d, Request& r) {
  if (!d.made) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "out of memory");
    return false;
  }
  jpeg_decompress_struct* c = &d.cinfo;
  d.errors.ended_early = false;
  if (setjmp(d.errors.jump)) {
    return false;
  }
  jpeg_mem_src(c, r.data, static_cast<unsigned long>(r.size));
  jpeg_read_header(c, TRUE);
  const bool cmyk = c->num_components == 4;
  if (r.region == nullptr) {
    r.info->height = c->image_height;
    r.info->width = c->image_width;
    r.info->cmyk = cmyk;
    jpeg_abort_decompress(c);
    return true;
  }
  // CMYK and YCCK files come out as CMYK (libjpeg converts YCCK), the rest
  // as RGB (grey replicated, as Pillow's L -> RGB).
  c->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  c->dct_method = JDCT_ISLOW;
  c->do_fancy_upsampling = TRUE;
  // Pillow's draft() sets only the scale too (its decoder's draft flag, which
  // would pick the fast DCT, stays off).
  c->scale_num = 1;
  c->scale_denom = static_cast<unsigned int>(r.scale);
  jpeg_start_decompress(c);
  const CropBox& want = *r.region;
  const int64_t height = c->output_height;
  const int64_t width = c->output_width;
  const int64_t top = std::max<int64_t>(0, want.top - kMargin);
  const int64_t left = std::max<int64_t>(0, want.left - kMargin);
  const int64_t right = std::min(width, want.left + want.width + kMargin);
  JDIMENSION x0 = static_cast<JDIMENSION>(left);
  JDIMENSION columns = static_cast<JDIMENSION>(right - left);
  if (left > 0 || right < width) {
    // Moves x0 left to an iMCU boundary and widens `columns` to match.
    jpeg_crop_scanline(c, &x0, &columns);
  }
  if (top > 0) {
    jpeg_skip_scanlines(c, static_cast<JDIMENSION>(top));
  }
  const int components = c->output_components;
  JSAMPARRAY row = (*c->mem->alloc_sarray)(
      reinterpret_cast<j_common_ptr>(c),
      JPOOL_IMAGE,
      c->output_width * static_cast<JDIMENSION>(components),
      1);
  const int64_t skip_columns = want.left - static_cast<int64_t>(x0);
  for (int64_t y = top; y < want.top + want.height; ++y) {
    jpeg_read_scanlines(c, row, 1);
    if (y >= want.top) {
      store_row(
          row[0] + skip_columns * components,
          components,
          want.width,
          r.out + (y - want.top) * want.width * 3);
    }
  }
  r.stopped_early = want.top + want.height < height;
  // NOTE: abort, not finish: finish would decode the rows after the region.
  jpeg_abort_decompress(c);
  return true;
}

} // namespace

std::string read_jpeg_info(const uint8_t* data, size_t size, JpegInfo* info) {
  Decompressor& d = thread_decompressor();
  Request r{data, size, info, nullptr, nullptr, 1, false};
  if (!run(d, r)) {
    std::string message = d.errors.message;
    d.remake();
    return message;
  }
  return {};
}

std::string decode_jpeg_region(
    const uint8_t* data,
    size_t size,
    const CropBox& region,
    uint8_t* out,
    int scale) {
  TORCH_CHECK(
      scale == 1 || scale == 2 || scale == 4 || scale == 8,
      "decode_jpeg_region: scale must be 1, 2, 4 or 8, got ",
      scale);
  Decompressor& d = thread_decompressor();
  Request r{data, size, nullptr, &region, out, scale, false};
  if (!run(d, r)) {
    std::string message = d.errors.message;
    d.remake();
    return message;
  }
  // libjpeg fills the rows of a file that ends early with grey and warns;
  // Pillow raises "image file is truncated", and so do we. When decoding
  // stopped after the region, the markers tell whether the file is whole,
  // so that the answer does not depend on the crop.
  if (d.errors.ended_early ||
      (r.stopped_early &&
       read_jpeg_layout(data, size).problem.rfind("truncated", 0) == 0)) {
    return "Premature end of JPEG file";
  }
  return {};
}

} // namespace lamp::data::detail
