// lamp::data::TokenDataset: llm.c's .bin token files memory-mapped and cut
// into windows; batches as a function of (epoch, index), ranks disjoint,
// reshuffled each epoch; a file from tools/make_tokens.py; and a clear error
// for every kind of bad file.

#include <lamp/data/token_dataset.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace token_dataset_test {

namespace {

using lamp::data::TokenDataset;
using lamp::data::TokenDatasetOptions;
using lamp::test::expect_error;
using lamp::test::expect_error_of;

// A token file of `tokens` with llm.c's header (fields overridable).
std::string write_tokens(
    const std::string& path,
    const std::vector<uint16_t>& tokens,
    int32_t magic = 20240520,
    int32_t version = 1,
    int64_t count = -1,
    size_t cut = 0) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count < 0 ? tokens.size() : count);
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  bytes.resize(bytes.size() - cut);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::vector<uint16_t> ramp(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    t[i] = static_cast<uint16_t>(i % 60000);
  }
  return t;
}

TEST(TokenDataset, BatchesAreWindowsAndTheirNextTokens) {
  const auto dir = lamp::test::fresh_dir("tokens_windows");
  // 101 tokens, windows of 8 + 1: 12 windows, 3 batches of 4.
  const auto path = write_tokens(dir + "/t.bin", ramp(101));
  TokenDataset data(
      path, TokenDatasetOptions().seq_len(8).batch_size(4).seed(3));
  EXPECT_EQ(data.size(), 101);
  EXPECT_EQ(data.windows(), 12);
  EXPECT_EQ(data.batches_per_epoch(), 3);
  std::set<int64_t> starts;
  for (int64_t b = 0; b < 3; ++b) {
    const auto [x, y] = data.batch(0, b);
    ASSERT_EQ(x.sizes(), (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(x.scalar_type(), torch::kLong);
    EXPECT_TRUE(torch::equal(x.narrow(1, 1, 7), y.narrow(1, 0, 7)));
    EXPECT_TRUE(torch::equal(y - x, torch::ones_like(x)));
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t start = x[i][0].item<int64_t>();
      EXPECT_EQ(start % 8, 0);
      starts.insert(start);
    }
  }
  EXPECT_EQ(starts.size(), 12u); // every window once an epoch
  // A function of (epoch, index): again the same; another epoch reshuffles.
  EXPECT_TRUE(torch::equal(data.batch(0, 1).first, data.batch(0, 1).first));
  bool differs = false;
  for (int64_t b = 0; b < 3; ++b) {
    differs |= !torch::equal(data.batch(0, b).first, data.batch(1, b).first);
  }
  EXPECT_TRUE(differs);
  EXPECT_EQ(data.tokens().numel(), 101);
  EXPECT_EQ(data.tokens().scalar_type(), torch::kUInt16);
}

TEST(TokenDataset, RanksReadDisjointShares) {
  const auto dir = lamp::test::fresh_dir("tokens_ranks");
  const auto path = write_tokens(dir + "/t.bin", ramp(4 * 6 * 5 + 1));
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    TokenDataset data(
        path,
        TokenDatasetOptions().seq_len(4).batch_size(2).rank(rank).world_size(
            3));
    ASSERT_EQ(data.batches_per_epoch(), 5); // 30 windows, 10 a rank
    for (int64_t b = 0; b < 5; ++b) {
      const auto x = data.batch(2, b).first;
      for (int64_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(seen.insert(x[i][0].item<int64_t>()).second);
      }
    }
  }
  EXPECT_EQ(seen.size(), 30u);
}

// The tool's file, read back.
TEST(TokenDataset, ReadsWhatMakeTokensWrites) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto dir = lamp::test::fresh_dir("tokens_tool");
  std::ofstream(dir + "/a.txt") << std::string(3000, 'a') << "hello, lamp\n";
  const std::string command = std::string("\"") + LAMP_TEST_PYTHON + "\" \"" +
      LAMP_TEST_SOURCE_DIR + "/../tools/make_tokens.py\" \"" + dir +
      "/a.txt\" --out-dir \"" + dir + "/out\" > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  TokenDataset train(
      dir + "/out/train.bin",
      TokenDatasetOptions().seq_len(16).batch_size(2).vocab_size(256));
  const auto tokens = train.tokens();
  EXPECT_GT(tokens.numel(), 2800);
  EXPECT_EQ(tokens[0].item<int64_t>(), 'a');
  train.batch(0, 0);
  TokenDataset val(
      dir + "/out/val.bin", TokenDatasetOptions().seq_len(4).batch_size(1));
  EXPECT_GT(val.size(), 100);
}

TEST(TokenDataset, ABadFileIsAClearError) {
  const auto dir = lamp::test::fresh_dir("tokens_bad");
  const auto good = ramp(50);
  const auto opts = TokenDatasetOptions().seq_len(8).batch_size(2);
  expect_error(
      [&] { TokenDataset(dir + "/missing.bin", opts); },
      "missing.bin: cannot open (No such file or directory)");
  std::ofstream(dir + "/short.bin") << "tiny";
  expect_error(
      [&] { TokenDataset(dir + "/short.bin", opts); },
      "short.bin: 4 bytes, shorter than the 1,024-byte header");
  expect_error(
      [&] { TokenDataset(write_tokens(dir + "/magic.bin", good, 1234), opts); },
      "magic.bin: not a token file (magic 1234, expected 20240520");
  expect_error(
      [&] {
        TokenDataset(
            write_tokens(dir + "/version.bin", good, 20240520, 2), opts);
      },
      "version.bin: token file version 2, this lamp reads version 1");
  expect_error(
      [&] {
        TokenDataset(
            write_tokens(dir + "/cut.bin", good, 20240520, 1, -1, 3), opts);
      },
      "cut.bin: the header says 50 tokens (1124 bytes) but the file has 1121 "
      "bytes: truncated or damaged");
  expect_error(
      [&] { TokenDataset(write_tokens(dir + "/few.bin", ramp(8)), opts); },
      "few.bin: 8 tokens, fewer than one window of seq_len + 1 = 9");
  expect_error(
      [&] { TokenDataset(write_tokens(dir + "/one.bin", ramp(12)), opts); },
      "one.bin: too short for one batch: 1 window(s) of 9 tokens, and a "
      "batch of 2 on each of 1 rank(s) needs 2");
  TokenDataset data(
      write_tokens(dir + "/vocab.bin", good),
      TokenDatasetOptions(opts).vocab_size(10));
  expect_error_of<c10::IndexError>(
      [&] { data.batch(0, 0); }, ", outside the model's vocabulary of 10");
  expect_error_of<c10::ValueError>(
      [&] { TokenDataset(dir + "/x.bin", TokenDatasetOptions().seq_len(0)); },
      "seq_len and batch_size must be >= 1, got 0 and 8");
}

} // namespace

} // namespace token_dataset_test
