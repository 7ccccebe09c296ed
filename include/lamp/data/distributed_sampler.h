#pragma once

// Which dataset indices each rank reads: Python's
// torch.utils.data.DistributedSampler (torch 2.11,
// torch/utils/data/distributed.py), index for index.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <lamp/export.h>

namespace lamp::data {

/// Splits the indices `0 .. size - 1` of a dataset among `world_size`
/// ranks, as Python's `DistributedSampler(dataset, num_replicas=world_size,
/// rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)` does, so a
/// C++ job reads the very samples, in the very order, that the Python job
/// would:
///
/// - `shuffle`: the indices are `torch::randperm(size)` drawn from a CPU
///   generator seeded with `seed + epoch()`; bit for bit Python's order.
///   Otherwise `0, 1, ..., size - 1`. Every rank must pass the same seed.
/// - `drop_last` false: the list is padded to `total_size()`, a multiple of
///   `world_size`, by repeating it from its start (as many times as needed
///   when `world_size > size`), so every rank gets `num_samples()` =
///   ceil(size / world_size) indices and some samples are read twice.
///   `drop_last` true: the tail is dropped instead, `num_samples()` =
///   floor(size / world_size).
/// - Rank `r` takes the indices at positions `r, r + world_size, ...`.
///
/// Call `set_epoch(epoch)` at the start of every epoch, before reading
/// `indices()`: otherwise every epoch has the same order, as in Python.
///
/// NOTE: the arguments are (size, rank, world_size), rank first; Python's
/// positional order is (dataset, num_replicas, rank). Errors are
/// `c10::ValueError` (Python's ValueError), with Python's message for a
/// rank outside [0, world_size - 1].
///
/// Not replicated: Python takes the world size and rank of the default
/// process group when they are omitted; here they are required. Python's
/// seed is an unbounded int and `seed + epoch` outside [-2^63, 2^64 - 1]
/// raises there; here `seed + epoch` wraps modulo 2^64, which is Python's
/// seed whenever Python accepts it (negative seeds included).
///
/// Example:
/// \code
///   lamp::data::ImageFolder train("/data/imagenet/train");
///   lamp::data::DistributedSampler sampler(
///       train.size(), process_group->rank(), process_group->world_size());
///   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
///     sampler.set_epoch(epoch);
///     for (int64_t index : sampler.indices()) {
///       const auto& [path, target] = train[index];
///       // load, transform, batch ...
///     }
///   }
/// \endcode
class LAMP_API DistributedSampler {
 public:
  /// \param size the dataset's length (>= 0).
  /// \param rank this process's rank, in [0, world_size - 1].
  /// \param world_size the number of ranks sharing the dataset (>= 1;
  ///   Python's `num_replicas`).
  /// \param shuffle shuffle the indices every epoch. Default: true.
  /// \param seed the shuffle's seed, the same on every rank. Default: 0.
  /// \param drop_last drop the tail instead of padding. Default: false.
  DistributedSampler(
      int64_t size,
      int64_t rank,
      int64_t world_size,
      bool shuffle = true,
      uint64_t seed = 0,
      bool drop_last = false);

  /// Sets the epoch, which seeds the shuffle (`seed + epoch`).
  void set_epoch(int64_t epoch) {
    epoch_ = epoch;
  }
  /// The epoch set last (0 at first).
  int64_t epoch() const {
    return epoch_;
  }

  /// This rank's dataset indices for the current epoch, in order: what
  /// Python's `list(sampler)` returns. `num_samples()` of them.
  std::vector<int64_t> indices() const;

  /// The number of indices of each rank (Python's `num_samples`).
  int64_t num_samples() const {
    return num_samples_;
  }
  /// `num_samples() * world_size()`: the length of the padded or trimmed
  /// list before it is split (Python's `total_size`).
  int64_t total_size() const {
    return num_samples_ * world_size_;
  }
  /// `num_samples()`, Python's `len(sampler)`; not the dataset's size.
  size_t size() const {
    return static_cast<size_t>(num_samples_);
  }

  /// The dataset's length, as passed.
  int64_t dataset_size() const {
    return dataset_size_;
  }
  int64_t rank() const {
    return rank_;
  }
  /// Python's `num_replicas`.
  int64_t world_size() const {
    return world_size_;
  }
  bool shuffle() const {
    return shuffle_;
  }
  uint64_t seed() const {
    return seed_;
  }
  bool drop_last() const {
    return drop_last_;
  }

 private:
  int64_t dataset_size_;
  int64_t rank_;
  int64_t world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

} // namespace lamp::data
