#pragma once

// Internal: a zip archive's central directory (each member's CRC-32, sizes
// and place), to read members without LibTorch's zip reader and to verify
// what it returns: its bundled miniz is built without CRC checks, so a
// flipped bit in a checkpoint would otherwise load silently.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace lamp::detail {

/// A member of a zip archive, from its central directory entry (zip64
/// sizes and offsets resolved).
struct ZipMember {
  uint32_t crc = 0;
  uint16_t method = 0; // 0: stored (torch.save stores every member)
  uint64_t header_offset = 0; // of its local header
  uint64_t compressed_size = 0;
  uint64_t size = 0;
};

/// Every member of the zip archive at `path`, by name with the archive's
/// top folder stripped ("archive/data/0" → "data/0"), as
/// PyTorchStreamReader names records. Throws `c10::Error` when the file has
/// no readable central directory.
std::map<std::string, ZipMember> zip_members(const std::string& path);

/// zlib's CRC-32 of `size` bytes.
uint32_t crc32_of(const void* data, size_t size);

} // namespace lamp::detail
