#include "zip_writer.h"

#include "parallel_each.h"
#include "zip_index.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

namespace lamp::detail {
namespace {

constexpr uint64_t kAlignment = 64;
constexpr uint64_t kMax32 = 0xffffffff;
constexpr char kFolder[] = "archive/";

// Little-endian fields (APPNOTE.TXT).
class Bytes {
 public:
  Bytes& u16(uint64_t v) {
    return put(v, 2);
  }
  Bytes& u32(uint64_t v) {
    return put(v, 4);
  }
  Bytes& u64(uint64_t v) {
    return put(v, 8);
  }
  Bytes& text(const std::string& s) {
    b_.append(s);
    return *this;
  }
  const std::string& str() const {
    return b_;
  }
  size_t size() const {
    return b_.size();
  }

 private:
  Bytes& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) {
      b_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
    return *this;
  }
  std::string b_;
};

// The CRC-32 of every record, largest first over the threads.
std::vector<uint32_t> crcs_of(const std::vector<ZipRecord>& records) {
  std::vector<size_t> order(records.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return records[a].size > records[b].size;
  });
  uint64_t bytes = 0;
  for (const auto& r : records) {
    bytes += r.size;
  }
  std::vector<uint32_t> crcs(records.size());
  parallel_each(order.size(), checkpoint_threads(bytes), [&](size_t i) {
    const auto& r = records[order[i]];
    crcs[order[i]] = crc32_of(r.data, r.size);
  });
  return crcs;
}

} // namespace

void write_zip(
    const std::vector<ZipRecord>& records,
    const std::function<void(const void*, size_t)>& write,
    bool force_zip64) {
  const auto crcs = crcs_of(records);
  uint64_t at = 0;
  Bytes directory;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    const std::string name = kFolder + r.name;
    TORCH_CHECK(name.size() < 0xffff, "zip member name too long: ", name);
    const bool big = force_zip64 || r.size >= kMax32;
    const bool far = force_zip64 || at >= kMax32;
    // Local header: sizes in a zip64 extra field when they need it, then
    // the padding that puts the data at a multiple of kAlignment.
    Bytes extra;
    if (big) {
      extra.u16(1).u16(16).u64(r.size).u64(r.size);
    }
    const uint64_t unpadded = at + 30 + name.size() + extra.size() + 4;
    const uint64_t pad = (kAlignment - unpadded % kAlignment) % kAlignment;
    extra.u16(0x4246).u16(pad).text(std::string(pad, 'Z')); // "FB"
    Bytes local;
    local.u32(0x04034b50)
        .u16(big ? 45 : 20) // version needed
        .u16(0) // flags
        .u16(0) // stored
        .u16(0)
        .u16(0) // time, date
        .u32(crcs[i])
        .u32(big ? kMax32 : r.size)
        .u32(big ? kMax32 : r.size)
        .u16(name.size())
        .u16(extra.size())
        .text(name)
        .text(extra.str());
    write(local.str().data(), local.size());
    if (r.size > 0) {
      write(r.data, r.size);
    }
    // Its central directory entry; the zip64 field holds, in this order,
    // the sizes and the offset that do not fit.
    Bytes extra64;
    if (big || far) {
      Bytes fields;
      if (big) {
        fields.u64(r.size).u64(r.size);
      }
      if (far) {
        fields.u64(at);
      }
      extra64.u16(1).u16(fields.size()).text(fields.str());
    }
    directory.u32(0x02014b50)
        .u16(0x031e) // made by: Unix, 3.0
        .u16(big || far ? 45 : 20)
        .u16(0)
        .u16(0)
        .u16(0)
        .u16(0)
        .u32(crcs[i])
        .u32(big ? kMax32 : r.size)
        .u32(big ? kMax32 : r.size)
        .u16(name.size())
        .u16(extra64.size())
        .u16(0) // comment
        .u16(0) // disk
        .u16(0) // internal attributes
        .u32(0) // external attributes
        .u32(far ? kMax32 : at)
        .text(name)
        .text(extra64.str());
    at += local.size() + r.size;
  }
  const uint64_t dir_at = at;
  const uint64_t dir_size = directory.size();
  const uint64_t n = records.size();
  const bool zip64 =
      force_zip64 || n >= 0xffff || dir_at >= kMax32 || dir_size >= kMax32;
  Bytes end;
  if (zip64) {
    end.u32(0x06064b50)
        .u64(44) // the record's size after this field
        .u16(0x031e)
        .u16(45)
        .u32(0)
        .u32(0) // disks
        .u64(n)
        .u64(n)
        .u64(dir_size)
        .u64(dir_at);
    end.u32(0x07064b50).u32(0).u64(dir_at + dir_size).u32(1); // locator
  }
  end.u32(0x06054b50)
      .u16(0)
      .u16(0)
      .u16(zip64 ? 0xffff : n)
      .u16(zip64 ? 0xffff : n)
      .u32(zip64 ? kMax32 : dir_size)
      .u32(zip64 ? kMax32 : dir_at)
      .u16(0); // comment
  write(directory.str().data(), directory.size());
  write(end.str().data(), end.size());
}

} // namespace lamp::detail
