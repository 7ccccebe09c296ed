#pragma once

// PNG decoding with libpng's low-level API, behind a C-style interface.
//
// NOTE: libpng reports errors by longjmp. Jumping over a C++ object with a
// destructor is undefined behaviour, so these functions keep only plain
// locals and write into memory the caller allocated; the caller turns the
// returned `false` and `error` into an exception.

#include <cstddef>
#include <cstdint>

namespace lamp::data::detail {

struct PngInfo {
  int64_t width = 0;
  int64_t height = 0;
};

// Reads the header. Returns false (and a message in `error`) for a file
// libpng rejects.
bool png_read_info(
    const uint8_t* data,
    size_t size,
    PngInfo* info,
    char* error,
    size_t error_size);

// Decodes to 8-bit RGB rows of 3 * width bytes into `out` (height * width *
// 3 bytes), as PIL's `convert("RGB")` does: palette expanded, grey
// replicated, alpha and transparency dropped, 16-bit samples reduced to their
// high byte, no gamma correction.
bool png_read_rgb(
    const uint8_t* data,
    size_t size,
    uint8_t* out,
    char* error,
    size_t error_size);

} // namespace lamp::data::detail
