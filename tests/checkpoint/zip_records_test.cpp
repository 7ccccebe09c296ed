// The zip container of lamp's checkpoints: read_torch_archive's parallel
// reading of tensor records (src/checkpoint/member_reader.cpp: many records
// of many sizes, a corrupt or missing one among them, zip64 fields) and
// write_zip (src/checkpoint/zip_writer.cpp) against Python's zipfile.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "checkpoint/archive.h"
#include "checkpoint/zip_index.h"
#include "checkpoint/zip_writer.h"
#include "support.h"

// NOTE: a namespace of its own: lamp_tests is a unity build.
namespace zip_records_test {
namespace {

using lamp::detail::read_torch_archive;
using lamp::detail::write_torch_archive;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "lamp_member_reader_" + std::to_string(getpid()) +
      "_" + name;
}

void write_file(
    const std::string& path,
    const c10::IValue& value,
    bool force_zip64 = false) {
  std::ofstream out(path, std::ios::binary);
  write_torch_archive(
      value,
      [&](const void* p, size_t n) {
        out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
      },
      force_zip64);
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// 240 tensors from one element to 1.5 M (about 40 MB: several threads).
c10::impl::GenericDict many_tensors() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  torch::manual_seed(3);
  const torch::Dtype dtypes[] = {
      torch::kFloat,
      torch::kHalf,
      torch::kLong,
      torch::kBool,
      torch::kBFloat16};
  for (int i = 0; i < 240; ++i) {
    const int64_t n = i % 40 == 0 ? 1500000 : (i * 7919) % 20000 + 1;
    auto t = torch::randn({n}).mul(100).to(dtypes[i % 5]);
    d.insert("t" + std::to_string(i), t);
  }
  // Two views of one storage: one record, read once.
  auto base = torch::arange(100, torch::kFloat);
  d.insert("view_a", base.slice(0, 0, 50));
  d.insert("view_b", base.slice(0, 50, 100));
  return d;
}

void expect_same(const c10::IValue& got, const c10::impl::GenericDict& want) {
  ASSERT_TRUE(got.isGenericDict());
  const auto g = got.toGenericDict();
  ASSERT_EQ(g.size(), want.size());
  for (const auto& entry : want) {
    const auto& key = entry.key().toStringRef();
    ASSERT_TRUE(g.contains(key)) << key;
    const auto a = g.at(key).toTensor();
    const auto b = entry.value().toTensor();
    ASSERT_EQ(a.scalar_type(), b.scalar_type()) << key;
    ASSERT_TRUE(torch::equal(a, b)) << key;
  }
  EXPECT_EQ(
      g.at("view_a").toTensor().storage().data(),
      g.at("view_b").toTensor().storage().data());
}

TEST(MemberReader, ManyRecordsReadInParallelEqualWhatWasWritten) {
  const auto path = temp_path("many.pt");
  const auto want = many_tensors();
  write_file(path, want);
  for (int repeat = 0; repeat < 3; ++repeat) {
    expect_same(read_torch_archive(path), want);
  }
  std::remove(path.c_str());
}

TEST(MemberReader, ACorruptRecordAmongManyIsAnErrorNamingFileAndRecord) {
  const auto path = temp_path("corrupt.pt");
  write_file(path, many_tensors());
  auto bytes = bytes_of(path);
  // A byte in the middle of the file: inside one of the large records.
  bytes[bytes.size() / 2] = static_cast<char>(~bytes[bytes.size() / 2]);
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  for (int repeat = 0; repeat < 3; ++repeat) {
    try {
      read_torch_archive(path);
      ADD_FAILURE() << "a corrupt record was read";
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_EQ(what.rfind(path, 0), 0u) << what;
      EXPECT_NE(
          what.find("fail their checksum (corrupt file)"), std::string::npos)
          << what;
      EXPECT_NE(what.find("data/"), std::string::npos) << what;
    }
  }
  std::remove(path.c_str());
}

TEST(MemberReader, ARecordPastTheEndOfACutFileIsAnError) {
  const auto path = temp_path("cut.pt");
  write_file(path, many_tensors());
  auto bytes = bytes_of(path);
  // Keep the directory at the end but drop a stretch of data before it:
  // the members' offsets point past what is left.
  const auto members = lamp::detail::zip_members(path);
  uint64_t last = 0;
  for (const auto& [name, m] : members) {
    last = std::max(last, m.header_offset);
  }
  const std::string cut =
      bytes.substr(0, last / 2) + bytes.substr(bytes.size() - 4096);
  std::ofstream(path, std::ios::binary).write(cut.data(), cut.size());
  EXPECT_THROW(read_torch_archive(path), c10::Error);
  std::remove(path.c_str());
}

TEST(MemberReader, Zip64SizesAndOffsetsAreRead) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto src = temp_path("src.pt");
  const auto path = temp_path("zip64.pt");
  const auto want = many_tensors();
  write_file(src, want);
  lamp::test::run_python_oracle(
      "checkpoint/checkpoint_oracle.py",
      "zip64 \"" + src + "\" \"" + path + "\"");
  const auto members = lamp::detail::zip_members(path);
  ASSERT_GT(members.size(), 200u);
  expect_same(read_torch_archive(path), want);
  std::remove(src.c_str());
  std::remove(path.c_str());
}

TEST(ZipWriter, PythonsZipfileReadsItAlignedWithAndWithoutZip64) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  std::vector<std::string> payloads = {
      "", "x", std::string(100000, 'a'), std::string(63, 'b'), "tail"};
  for (size_t i = 0; i < payloads.size(); ++i) {
    payloads[i] += std::to_string(i); // distinct CRCs
  }
  std::vector<lamp::detail::ZipRecord> records;
  const char* names[] = {"data/0", "data/1", "data/2", "data.pkl", "version"};
  for (size_t i = 0; i < payloads.size(); ++i) {
    records.push_back({names[i], payloads[i].data(), payloads[i].size()});
  }
  for (bool force : {false, true}) {
    SCOPED_TRACE(force ? "zip64" : "zip32");
    const auto path = temp_path(force ? "w64.zip" : "w32.zip");
    {
      std::ofstream out(path, std::ios::binary);
      lamp::detail::write_zip(
          records,
          [&](const void* p, size_t n) {
            out.write(
                static_cast<const char*>(p), static_cast<std::streamsize>(n));
          },
          force);
    }
    const auto listing = lamp::test::run_python_oracle(
        "checkpoint/checkpoint_oracle.py", "zipcheck \"" + path + "\"");
    std::ostringstream want;
    for (size_t i = 0; i < payloads.size(); ++i) {
      want << "archive/" << names[i] << " " << payloads[i].size() << " 0\n";
    }
    EXPECT_EQ(listing, want.str());
    // And lamp's own directory reader agrees.
    const auto members = lamp::detail::zip_members(path);
    ASSERT_EQ(members.size(), payloads.size());
    for (size_t i = 0; i < payloads.size(); ++i) {
      const auto& m = members.at(names[i]);
      EXPECT_EQ(m.size, payloads[i].size()) << names[i];
      EXPECT_EQ(
          m.crc, lamp::detail::crc32_of(payloads[i].data(), payloads[i].size()))
          << names[i];
    }
    std::remove(path.c_str());
  }
}

// lamp's archive with zip64 fields everywhere (as one over 4 GiB): lamp
// and Python's torch.load (LibTorch's miniz reader) read it.
TEST(ZipWriter, AZip64ArchiveLoadsInLampAndInPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto path = temp_path("forced64.pt");
  const auto want = many_tensors();
  write_file(path, want, /*force_zip64=*/true);
  expect_same(read_torch_archive(path), want);
  const auto out = lamp::test::run_python_oracle(
      "checkpoint/checkpoint_oracle.py", "summary \"" + path + "\"");
  // Python's sum of every tensor as float64, and lamp's.
  double sum = 0;
  for (const auto& entry : want) {
    sum += entry.value().toTensor().to(torch::kDouble).sum().item<double>();
  }
  EXPECT_NEAR(
      std::stod(out.substr(out.find(' ') + 1)), sum, 1e-6 * std::abs(sum))
      << out;
  EXPECT_EQ(out.substr(0, out.find(' ')), std::to_string(want.size()));
  std::remove(path.c_str());
}

} // namespace
} // namespace zip_records_test
