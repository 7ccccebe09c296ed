#include "member_reader.h"

#include "parallel_each.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace lamp::detail {
namespace {

// pread and CRC in pieces of this size, so that the CRC reads bytes that
// are still in the cache.
constexpr uint64_t kPiece = 1 << 20;

class File {
 public:
  explicit File(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    TORCH_CHECK(fd_ >= 0, "cannot open the file: ", std::strerror(errno));
  }
  ~File() {
    ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads exactly `size` bytes at `offset`, or says why not.
  void read(void* out, uint64_t size, uint64_t offset, const std::string& what)
      const {
    auto* p = static_cast<char*>(out);
    while (size > 0) {
      const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      TORCH_CHECK(
          n > 0,
          "the data of ",
          what,
          n == 0 ? " end early (truncated file?)" : " cannot be read: ",
          n == 0 ? "" : std::strerror(errno));
      p += n;
      size -= static_cast<uint64_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }

 private:
  int fd_;
};

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t(p[i]) << (8 * i);
  }
  return v;
}

c10::Storage read_member(
    const File& file,
    const std::string& name,
    const ZipMember& m) {
  // The local header's name and extra field (torch.save pads the extra
  // field to align the data) can differ in length from the directory's.
  unsigned char header[30];
  file.read(header, sizeof header, m.header_offset, name);
  TORCH_CHECK(
      le(header, 4) == 0x04034b50,
      "the data of ",
      name,
      " have no local zip header (corrupt file)");
  const uint64_t data =
      m.header_offset + 30 + le(header + 26, 2) + le(header + 28, 2);
  c10::Storage storage(
      c10::Storage::use_byte_size_t(),
      m.size,
      c10::GetCPUAllocator(),
      /*resizable=*/false);
  auto* out = static_cast<unsigned char*>(storage.mutable_data());
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t at = 0; at < m.size; at += kPiece) {
    const uint64_t n = std::min(kPiece, m.size - at);
    file.read(out + at, n, data + at, name);
    crc = crc32(crc, out + at, static_cast<uInt>(n));
  }
  TORCH_CHECK(
      static_cast<uint32_t>(crc) == m.crc,
      "the data of ",
      name,
      " fail their checksum (corrupt file)");
  return storage;
}

} // namespace

std::map<std::string, c10::Storage> read_stored_members(
    const std::string& path,
    const std::map<std::string, ZipMember>& members,
    const std::vector<std::string>& names,
    int threads) {
  File file(path);
  // Largest first, so that no thread is left with a big member at the end.
  std::vector<std::pair<const std::string*, const ZipMember*>> work;
  uint64_t bytes = 0;
  for (const auto& name : names) {
    const auto it = members.find(name);
    if (it != members.end() && it->second.method == 0 &&
        it->second.compressed_size == it->second.size) {
      work.emplace_back(&it->first, &it->second);
      bytes += it->second.size;
    }
  }
  std::sort(work.begin(), work.end(), [](const auto& a, const auto& b) {
    return a.second->size > b.second->size;
  });
  std::vector<c10::Storage> read(work.size());
  parallel_each(
      work.size(), std::min(threads, checkpoint_threads(bytes)), [&](size_t i) {
        read[i] = read_member(file, *work[i].first, *work[i].second);
      });
  std::map<std::string, c10::Storage> out;
  for (size_t i = 0; i < work.size(); ++i) {
    out.emplace(*work[i].first, std::move(read[i]));
  }
  return out;
}

} // namespace lamp::detail
