#include "nvjpeg_warm_up.h"

#include "nvjpeg_decoder.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <string>

// clang-format off
#include <jpeglib.h> // needs <cstdio> first
// clang-format on

namespace lamp::data::detail {

// Note [nvJPEG's kernels load early]
// CUDA loads a kernel when it first runs (lazy loading, the default since
// CUDA 12), and "loading kernels might require context synchronization"
// (CUDA C++ Programming Guide, Lazy Loading): a stage thread whose nvJPEG
// call meets a layout it has not decoded before may wait for the training
// step's queued work. nvJPEG has kernels per chroma sampling, per output
// region and per backend, and a set's rarer layouts turn up one by one
// through the first epoch. So each decoder decodes one tiny JPEG of every
// layout, whole and a region of it, when it is made, before training
// starts.

namespace {

constexpr int kWidth = 96;
constexpr int kHeight = 64;

struct Errors {
  jpeg_error_mgr pub; // first: libjpeg casts its pointer to ours
  std::jmp_buf jump;
};

void on_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<Errors*>(cinfo->err)->jump, 1);
}

struct Layout {
  int components; // 1 or 3
  int h; // the luma's sampling factors (chroma 1x1)
  int v;
  bool progressive;
};

// NOTE: libjpeg's errors longjmp back here, over libjpeg's frames only; the
// rows and the output live outside them.
bool encode(const Layout& layout, std::vector<uint8_t>& out) {
  std::vector<uint8_t> pixels(size_t(kWidth) * kHeight * layout.components);
  uint32_t state = 12345;
  for (size_t i = 0; i < pixels.size(); ++i) {
    state = state * 1664525u + 1013904223u; // texture, not a flat picture
    pixels[i] = uint8_t((i * 7 + (state >> 24)) & 0xFF);
  }
  jpeg_compress_struct cinfo{};
  Errors errors{};
  cinfo.err = jpeg_std_error(&errors.pub);
  errors.pub.error_exit = on_error;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = kWidth;
  cinfo.image_height = kHeight;
  cinfo.input_components = layout.components;
  cinfo.in_color_space = layout.components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  cinfo.comp_info[0].h_samp_factor = layout.h;
  cinfo.comp_info[0].v_samp_factor = layout.v;
  if (layout.progressive) {
    jpeg_simple_progression(&cinfo);
  }
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = pixels.data() +
        size_t(cinfo.next_scanline) * kWidth * layout.components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  out.assign(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return true;
}

} // namespace

std::vector<std::vector<uint8_t>> warm_up_jpegs() {
  // Greyscale; 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1; progressive ones (the
  // CUDA backend's).
  const Layout layouts[] = {
      {1, 1, 1, false},
      {3, 1, 1, false},
      {3, 2, 1, false},
      {3, 2, 2, false},
      {3, 1, 2, false},
      {3, 4, 1, false},
      {1, 1, 1, true},
      {3, 1, 1, true},
      {3, 2, 2, true},
  };
  std::vector<std::vector<uint8_t>> files;
  for (const Layout& layout : layouts) {
    std::vector<uint8_t> bytes;
    if (encode(layout, bytes)) {
      files.push_back(std::move(bytes));
    }
  }
  return files;
}

void warm_up(NvjpegDecoder& decoder) {
  static const std::vector<std::vector<uint8_t>> files = warm_up_jpegs();
  c10::cuda::CUDAGuard guard(decoder.device());
  const auto stream = c10::cuda::getStreamFromPool(false, decoder.device());
  const CropBox region{/*top=*/8, /*left=*/16, /*height=*/40, /*width=*/56};
  const size_t chunk = size_t(std::max(decoder.max_batch_size(), 1));
  for (bool cropped : {false, true}) {
    for (size_t first = 0; first < files.size(); first += chunk) {
      const size_t n = std::min(chunk, files.size() - first);
      std::vector<const uint8_t*> data;
      std::vector<size_t> sizes;
      std::vector<std::string> names;
      for (size_t i = first; i < first + n; ++i) {
        data.push_back(files[i].data());
        sizes.push_back(files[i].size());
        names.push_back("lamp's warm-up JPEG #" + std::to_string(i));
      }
      const std::vector<CropBox> regions(n, region);
      std::vector<std::optional<NvjpegFailure>> failures;
      decoder.decode(
          data,
          sizes,
          names,
          stream.stream(),
          &failures,
          cropped ? &regions : nullptr);
    }
  }
  stream.synchronize();
}

} // namespace lamp::data::detail
