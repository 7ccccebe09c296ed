#include "jpeg_markers.h"

#include <cstring>

namespace lamp::data::detail {
namespace {

constexpr uint8_t kSoi = 0xD8;
constexpr uint8_t kEoi = 0xD9;
constexpr uint8_t kSos = 0xDA;
constexpr uint8_t kApp0 = 0xE0;
constexpr uint8_t kApp14 = 0xEE;

bool is_frame_marker(uint8_t m) {
  // SOF0-SOF15 less DHT (C4), JPG (C8) and DAC (CC).
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

// Markers without a length: TEM and the restart markers.
bool is_standalone(uint8_t m) {
  return m == 0x01 || (m >= 0xD0 && m <= 0xD7);
}

int be16(const uint8_t* p) {
  return (p[0] << 8) | p[1];
}

} // namespace

JpegLayout read_jpeg_layout(const uint8_t* data, size_t size) {
  JpegLayout out;
  if (data == nullptr || size < 4 || data[0] != 0xFF || data[1] != kSoi) {
    out.problem = "not a JPEG (it does not start with an SOI marker)";
    return out;
  }
  bool jfif = false;
  int adobe_transform = -1;
  uint8_t ids[3] = {0, 0, 0};
  bool scan_seen = false;
  size_t pos = 2;
  while (true) {
    // NOTE: like libjpeg, skip stray bytes before a marker and fill bytes.
    while (pos < size && data[pos] != 0xFF) {
      ++pos;
    }
    while (pos < size && data[pos] == 0xFF) {
      ++pos;
    }
    if (pos >= size) {
      out.problem = "truncated: the data ends before its EOI marker";
      return out;
    }
    const uint8_t marker = data[pos++];
    if (marker == kEoi) {
      break;
    }
    if (is_standalone(marker)) {
      continue;
    }
    if (marker == kSoi || marker == 0x00) {
      out.problem = "corrupt: a misplaced SOI marker or stuffed byte";
      return out;
    }
    if (pos + 2 > size) {
      out.problem = "truncated: the data ends inside a marker segment";
      return out;
    }
    const size_t length = be16(data + pos);
    if (length < 2) {
      out.problem = "corrupt: a marker segment shorter than its length field";
      return out;
    }
    if (pos + length > size) {
      out.problem = "truncated: the data ends inside a marker segment";
      return out;
    }
    const uint8_t* body = data + pos + 2;
    const size_t body_size = length - 2;
    pos += length;
    if (is_frame_marker(marker)) {
      if (out.frame_type >= 0) {
        out.problem = "corrupt: two frame headers";
        return out;
      }
      if (body_size < 6 || body_size < 6 + 3 * size_t(body[5])) {
        out.problem = "corrupt: a frame header too short for its components";
        return out;
      }
      out.frame_type = marker - 0xC0;
      out.precision = body[0];
      out.height = be16(body + 1);
      out.width = be16(body + 3);
      out.components = body[5];
      for (int c = 0; c < 3 && c < out.components; ++c) {
        ids[c] = body[6 + 3 * c];
      }
    } else if (marker == kApp0) {
      jfif |= body_size >= 5 && std::memcmp(body, "JFIF\0", 5) == 0;
    } else if (marker == kApp14) {
      if (body_size >= 12 && std::memcmp(body, "Adobe", 5) == 0) {
        adobe_transform = body[11];
      }
    } else if (marker == kSos) {
      if (out.frame_type < 0) {
        out.problem = "corrupt: a scan before the frame header";
        return out;
      }
      scan_seen = true;
      // Entropy-coded data runs to the next marker other than a stuffed
      // byte (FF 00), a fill byte or a restart marker.
      while (true) {
        const auto* p = static_cast<const uint8_t*>(
            std::memchr(data + pos, 0xFF, size - pos));
        if (p == nullptr || p + 1 >= data + size) {
          out.problem = "truncated: the data ends inside a scan";
          return out;
        }
        pos = static_cast<size_t>(p - data);
        const uint8_t next = p[1];
        if (next == 0xFF) {
          pos += 1;
        } else if (next == 0x00 || is_standalone(next)) {
          pos += 2;
        } else {
          break;
        }
      }
    }
  }
  if (!scan_seen) {
    out.problem = "corrupt: an EOI marker before any scan";
    return out;
  }
  if (out.components == 3 && !jfif) {
    out.rgb = adobe_transform == 0 ||
        (adobe_transform < 0 && ids[0] == 'R' && ids[1] == 'G' &&
         ids[2] == 'B');
  }
  return out;
}

} // namespace lamp::data::detail
