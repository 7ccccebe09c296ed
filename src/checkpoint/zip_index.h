#pragma once

// Internal: the CRC-32 that a zip archive's central directory records for
// each member, to verify what LibTorch's zip reader returns: its bundled
// miniz is built without CRC checks, so a flipped bit in a checkpoint
// would otherwise load silently.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace lamp::detail {

/// The CRC-32 of every member of the zip archive at `path`, by name with
/// the archive's top folder stripped ("archive/data/0" → "data/0"), as
/// PyTorchStreamReader names records. Handles zip64. Throws `c10::Error`
/// when the file has no readable central directory.
std::map<std::string, uint32_t> zip_crcs(const std::string& path);

/// zlib's CRC-32 of `size` bytes.
uint32_t crc32_of(const void* data, size_t size);

} // namespace lamp::detail
