#include <lamp/data.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace distributed_sampler_test {

namespace {

using lamp::data::DistributedSampler;

// One case of tests/distributed_sampler_oracle.py.
struct Case {
  int64_t size;
  int64_t rank;
  int64_t world_size;
  bool shuffle;
  uint64_t seed;
  bool drop_last;
  int64_t epoch;

  std::string spec() const {
    return std::to_string(size) + ":" + std::to_string(rank) + ":" +
        std::to_string(world_size) + ":" + (shuffle ? "1" : "0") + ":" +
        std::to_string(seed) + ":" + (drop_last ? "1" : "0") + ":" +
        std::to_string(epoch);
  }
};

// Every rank of sizes 0, 1, 7, 10, 1000 (sizes below, equal to and above
// the world size: padding longer than the dataset included) and world
// sizes 1, 2, 3, 4, 8; shuffled with several seeds and epochs (a negative
// epoch and a seed above 2^63 included) or not, padded or trimmed.
std::vector<Case> grid() {
  struct SeedEpoch {
    uint64_t seed;
    int64_t epoch;
  };
  const std::vector<SeedEpoch> shuffled{
      {0, 0}, {0, 1}, {42, 3}, {(uint64_t{1} << 63) + 5, 2}, {7, -1}};
  std::vector<Case> cases;
  for (int64_t size : {0, 1, 7, 10, 1000}) {
    for (int64_t world : {1, 2, 3, 4, 8}) {
      for (int64_t rank = 0; rank < world; ++rank) {
        for (bool drop_last : {false, true}) {
          cases.push_back({size, rank, world, false, 0, drop_last, 5});
          for (const auto& [seed, epoch] : shuffled) {
            cases.push_back({size, rank, world, true, seed, drop_last, epoch});
          }
        }
      }
    }
  }
  return cases;
}

TEST(DistributedSampler, MatchesPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto cases = grid();
  std::string args;
  for (const auto& c : cases) {
    args += " " + c.spec();
  }
  const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
      "data/distributed_sampler_oracle.py", args));
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.spec());
    const auto& line = lines[i];
    ASSERT_GE(line.size(), 4u);
    ASSERT_EQ(line[1], std::to_string(i));
    DistributedSampler sampler(
        c.size, c.rank, c.world_size, c.shuffle, c.seed, c.drop_last);
    sampler.set_epoch(c.epoch);
    EXPECT_EQ(std::to_string(sampler.num_samples()), line[2]);
    EXPECT_EQ(std::to_string(sampler.total_size()), line[3]);
    std::vector<std::string> indices;
    for (int64_t index : sampler.indices()) {
      indices.push_back(std::to_string(index));
    }
    EXPECT_EQ(indices, std::vector<std::string>(line.begin() + 4, line.end()));
    EXPECT_EQ(sampler.size(), indices.size());
  }
}

TEST(DistributedSampler, RanksCoverTheDataset) {
  for (bool drop_last : {false, true}) {
    for (int64_t world : {3, 4}) {
      std::multiset<int64_t> seen;
      for (int64_t rank = 0; rank < world; ++rank) {
        DistributedSampler sampler(10, rank, world, true, 3, drop_last);
        sampler.set_epoch(4);
        for (int64_t index : sampler.indices()) {
          seen.insert(index);
        }
      }
      const auto expected = drop_last ? 10 / world * world : 10 + 2;
      EXPECT_EQ(seen.size(), static_cast<size_t>(expected));
      std::set<int64_t> distinct(seen.begin(), seen.end());
      // Padded: every index, two of them twice; trimmed: no repeats.
      EXPECT_EQ(distinct.size(), drop_last ? seen.size() : 10u);
    }
  }
}

TEST(DistributedSampler, EpochChangesTheShuffleOnly) {
  DistributedSampler shuffled(100, 1, 2);
  EXPECT_EQ(shuffled.epoch(), 0);
  const auto first = shuffled.indices();
  EXPECT_EQ(shuffled.indices(), first); // same epoch, same order
  shuffled.set_epoch(1);
  EXPECT_EQ(shuffled.epoch(), 1);
  EXPECT_NE(shuffled.indices(), first);

  DistributedSampler ordered(10, 1, 4, /*shuffle=*/false);
  ordered.set_epoch(9);
  EXPECT_EQ(ordered.indices(), (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(ordered.num_samples(), 3);
  EXPECT_EQ(ordered.total_size(), 12);
  EXPECT_EQ(ordered.dataset_size(), 10);
  EXPECT_EQ(ordered.rank(), 1);
  EXPECT_EQ(ordered.world_size(), 4);
  EXPECT_FALSE(ordered.shuffle());
  EXPECT_FALSE(ordered.drop_last());
  EXPECT_EQ(ordered.seed(), 0u);
}

TEST(DistributedSampler, EmptyDataset) {
  for (bool drop_last : {false, true}) {
    DistributedSampler sampler(0, 2, 3, true, 0, drop_last);
    EXPECT_EQ(sampler.num_samples(), 0);
    EXPECT_EQ(sampler.total_size(), 0);
    EXPECT_TRUE(sampler.indices().empty());
  }
}

TEST(DistributedSampler, RejectsBadRankAndWorldSize) {
  using lamp::test::expect_error_of;
  expect_error_of<c10::ValueError>(
      [] { DistributedSampler(10, 4, 4); },
      "Invalid rank 4, rank should be in the interval [0, 3]");
  expect_error_of<c10::ValueError>(
      [] { DistributedSampler(10, -1, 2); },
      "Invalid rank -1, rank should be in the interval [0, 1]");
  expect_error_of<c10::ValueError>(
      [] { DistributedSampler(10, 0, 0); }, "invalid world_size 0");
  expect_error_of<c10::ValueError>(
      [] { DistributedSampler(10, 0, -2); }, "invalid world_size -2");
  expect_error_of<c10::ValueError>(
      [] { DistributedSampler(-1, 0, 1); },
      "the dataset size must be >= 0, got -1");
}

TEST(DistributedSampler, RankErrorIsPythons) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
      "data/distributed_sampler_oracle.py", "10:4:4:1:0:0:0 10:-1:2:1:0:0:0"));
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<std::pair<int64_t, int64_t>> bad{{4, 4}, {-1, 2}};
  for (size_t i = 0; i < bad.size(); ++i) {
    ASSERT_GE(lines[i].size(), 4u);
    EXPECT_EQ(lines[i][2], "error");
    EXPECT_EQ(lines[i][3], "ValueError");
    std::string message;
    for (size_t k = 4; k < lines[i].size(); ++k) {
      message += (k > 4 ? " " : "") + lines[i][k];
    }
    lamp::test::expect_error_of<c10::ValueError>(
        [&] { DistributedSampler(10, bad[i].first, bad[i].second); }, message);
  }
}

} // namespace

} // namespace distributed_sampler_test
