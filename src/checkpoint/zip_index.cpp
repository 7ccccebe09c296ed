#include "zip_index.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <vector>

namespace lamp::detail {
namespace {

// Little-endian fields of the zip format (APPNOTE.TXT).
uint64_t field(const std::vector<char>& b, size_t at, size_t bytes) {
  TORCH_CHECK(at + bytes <= b.size(), "zip structure out of bounds");
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) {
    v |= uint64_t(static_cast<uint8_t>(b[at + i])) << (8 * i);
  }
  return v;
}

std::vector<char> read_at(std::ifstream& in, uint64_t offset, uint64_t size) {
  std::vector<char> out(size);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(size));
  TORCH_CHECK(
      in.gcount() == static_cast<std::streamsize>(size),
      "the file ends early (truncated?)");
  return out;
}

constexpr uint32_t kEnd = 0x06054b50; // end of central directory
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr uint32_t kEntry = 0x02014b50; // central directory entry

} // namespace

std::map<std::string, ZipMember> zip_members(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TORCH_CHECK(in, "cannot open the file");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  // The end record is 22 bytes plus a comment of up to 65535.
  const uint64_t tail_size = std::min<uint64_t>(size, 22 + 65535);
  const auto tail = read_at(in, size - tail_size, tail_size);
  int64_t end = -1;
  for (int64_t i = static_cast<int64_t>(tail_size) - 22; i >= 0; --i) {
    if (field(tail, i, 4) == kEnd) {
      end = i;
      break;
    }
  }
  TORCH_CHECK(end >= 0, "no zip end record (truncated file?)");
  uint64_t entries = field(tail, end + 10, 2);
  uint64_t dir_size = field(tail, end + 12, 4);
  uint64_t dir_offset = field(tail, end + 16, 4);
  if (dir_offset == 0xffffffff || entries == 0xffff) { // zip64
    TORCH_CHECK(
        end >= 20 && field(tail, end - 20, 4) == kEnd64Locator,
        "malformed zip64 end record");
    const auto at = field(tail, end - 20 + 8, 8);
    const auto record = read_at(in, at, 56);
    TORCH_CHECK(field(record, 0, 4) == kEnd64, "malformed zip64 end record");
    entries = field(record, 32, 8);
    dir_size = field(record, 40, 8);
    dir_offset = field(record, 48, 8);
  }
  TORCH_CHECK(
      dir_offset + dir_size <= size,
      "zip directory out of bounds (truncated?)");
  const auto dir = read_at(in, dir_offset, dir_size);
  std::map<std::string, ZipMember> out;
  size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    TORCH_CHECK(field(dir, at, 4) == kEntry, "malformed zip directory");
    ZipMember m;
    m.crc = static_cast<uint32_t>(field(dir, at + 16, 4));
    m.method = static_cast<uint16_t>(field(dir, at + 10, 2));
    m.compressed_size = field(dir, at + 20, 4);
    m.size = field(dir, at + 24, 4);
    m.header_offset = field(dir, at + 42, 4);
    const auto name_size = field(dir, at + 28, 2);
    const auto extra_size = field(dir, at + 30, 2);
    const auto comment_size = field(dir, at + 32, 2);
    TORCH_CHECK(
        at + 46 + name_size + extra_size <= dir.size(),
        "malformed zip directory");
    std::string name(dir.data() + at + 46, name_size);
    // Zip64: a field of all ones is in the extra field 0x0001, which holds
    // those fields only, in this order.
    for (size_t x = at + 46 + name_size;
         x + 4 <= at + 46 + name_size + extra_size;) {
      const auto id = field(dir, x, 2);
      const auto n = field(dir, x + 2, 2);
      if (id == 1) {
        size_t v = x + 4;
        for (uint64_t* f : {&m.size, &m.compressed_size, &m.header_offset}) {
          if (*f == 0xffffffff) {
            TORCH_CHECK(v + 8 <= x + 4 + n, "malformed zip64 extra field");
            *f = field(dir, v, 8);
            v += 8;
          }
        }
      }
      x += 4 + n;
    }
    const auto slash = name.find('/');
    out[slash == std::string::npos ? name : name.substr(slash + 1)] = m;
    at += 46 + name_size + extra_size + comment_size;
  }
  return out;
}

uint32_t crc32_of(const void* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  // NOTE: zlib takes at most a uInt (4 GiB) a call.
  while (size > 0) {
    const auto n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

} // namespace lamp::detail
