#pragma once

// Internal: the tensor records of a checkpoint read in parallel, each
// checked against its CRC-32 as it is read, for read_torch_archive.
// LibTorch's zip reader reads one record a call under its lock, and the
// CRC-32 (zlib, ~1 GB/s a core) was the largest part of a load.

#include "zip_index.h"

#include <c10/core/Storage.h>

#include <map>
#include <string>
#include <vector>

namespace lamp::detail {

/// The members `names` of the zip archive at `path` (described by
/// `members`, from zip_members), each in a CPU storage of its size, read
/// by up to `threads` threads (fewer for little data) and checked against
/// its CRC-32. Members that are compressed are left out (the caller reads
/// them otherwise). Throws `c10::Error` naming a member that cannot be read
/// (the file ends early, a malformed local header) or fails its checksum
/// ("the data of data/0 fail their checksum (corrupt file)"); the other
/// threads stop at their next member.
std::map<std::string, c10::Storage> read_stored_members(
    const std::string& path,
    const std::map<std::string, ZipMember>& members,
    const std::vector<std::string>& names,
    int threads);

} // namespace lamp::detail
