#pragma once

// Token files for language models: llm.c's and nanoGPT's `.bin` layout,
// memory-mapped, cut into windows that every rank shuffles alike.

#include <lamp/data/distributed_sampler.h>
#include <lamp/export.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamp::data {

/// Options of `TokenDataset`.
struct LAMP_API TokenDatasetOptions {
  /// Tokens a sample's input (its target is the same window moved on by
  /// one). Must be >= 1. Default: 1024.
  TORCH_ARG(int64_t, seq_len) = 1024;
  /// Samples a batch (per rank). Must be >= 1. Default: 8.
  TORCH_ARG(int64_t, batch_size) = 8;
  /// This process's rank among `world_size` readers of the file; each reads
  /// its own share of every epoch's windows. Default: 0 of 1.
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  /// Reshuffle the windows every epoch (seeded with `seed + epoch`, the
  /// same on every rank). Default: true.
  TORCH_ARG(bool, shuffle) = true;
  /// The shuffle's seed. Default: 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// When > 0, a batch holding a token >= this is an error
  /// (`c10::IndexError`) rather than an embedding lookup out of range: a
  /// file made for another vocabulary. Checked on the host, per batch.
  /// Default: 0 (no check).
  TORCH_ARG(int64_t, vocab_size) = 0;
};

/// A file of uint16 tokens in llm.c's layout (karpathy/llm.c's
/// `dev/data/*.bin`, which nanoGPT's prepare scripts also write): a header of
/// 256 little-endian int32 (magic 20240520, version 1, the number of
/// tokens), then the tokens. The file is memory-mapped, not read: a corpus
/// of billions of tokens costs no memory.
///
/// The tokens are cut into windows of `seq_len + 1` tokens, window `w`
/// starting at token `w * seq_len` (neighbours share one token: an input's
/// last target is the next window's first input). Each epoch the windows
/// are split among the ranks as Python's `DistributedSampler(windows,
/// world_size, rank, shuffle, seed, drop_last=True)` splits indices, so a
/// run's batches are a function of (epoch, index): a resumed run reads the
/// same ones, and a Python twin can too. A truncated, empty, foreign or
/// too-short file is a `c10::Error` naming the file and what is wrong.
///
/// Example:
/// \code
///   lamp::data::TokenDataset train("fineweb_train_000001.bin",
///       lamp::data::TokenDatasetOptions().seq_len(1024).batch_size(16));
///   for (int64_t b = 0; b < train.batches_per_epoch(); ++b) {
///     auto [inputs, targets] = train.batch(/*epoch=*/0, b);  // [16, 1024]
///     inputs = inputs.to(torch::kCUDA, /*non_blocking=*/true);
///     ...
///   }
/// \endcode
class LAMP_API TokenDataset {
 public:
  explicit TokenDataset(std::string path, TokenDatasetOptions options = {});
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;

  /// Tokens in the file.
  int64_t size() const;
  /// Windows of `seq_len + 1` tokens: `(size() - 1) / seq_len`.
  int64_t windows() const;
  /// Whole batches each rank reads an epoch (a partial last one is
  /// dropped); at least 1.
  int64_t batches_per_epoch() const;
  /// Batch `index` (in [0, batches_per_epoch())) of `epoch` for this rank:
  /// inputs and targets, each [batch_size, seq_len] int64 on the CPU (in
  /// pinned memory where CUDA is available, so that a non-blocking copy to
  /// the GPU is asynchronous).
  std::pair<torch::Tensor, torch::Tensor> batch(int64_t epoch, int64_t index);
  /// The file's path.
  const std::string& path() const;
  const TokenDatasetOptions& options() const;

  /// The tokens as a 1-D uint16 tensor over the mapped file (no copy;
  /// valid while this object lives).
  torch::Tensor tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp::data
