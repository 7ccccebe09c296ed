#pragma once

// Internal: the zip container of a torch.save archive, written with the
// members' CRC-32s computed by several threads first. LibTorch's
// PyTorchStreamWriter computes them on the writing thread as it goes
// (~2 GB/s), which was most of a save that did not wait for the disk.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lamp::detail {

struct ZipRecord {
  std::string name; // inside the archive's folder: "data.pkl", "data/0"
  const void* data;
  size_t size;
};

/// Writes `records`, in order, as a zip archive of stored members named
/// "archive/<name>", through `write` (which must write all it is given or
/// throw). As LibTorch's writer and Python's torch.save lay it out: each
/// member's data starts at a multiple of 64 bytes (the local header's extra
/// field is padded, id "FB"), so `torch.load(mmap=True)` can map it. Each
/// local header holds its member's CRC-32 and sizes (no data descriptors).
/// Zip64 fields and end records where a size, an offset or the number of
/// members needs them, or everywhere with `force_zip64` (for tests).
void write_zip(
    const std::vector<ZipRecord>& records,
    const std::function<void(const void*, size_t)>& write,
    bool force_zip64 = false);

} // namespace lamp::detail
