#include <lamp/data/distributed_sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randperm.h>
#include <c10/util/Exception.h>

namespace lamp::data {

DistributedSampler::DistributedSampler(
    int64_t size,
    int64_t rank,
    int64_t world_size,
    bool shuffle,
    uint64_t seed,
    bool drop_last)
    : dataset_size_(size),
      rank_(rank),
      world_size_(world_size),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  TORCH_CHECK_VALUE(
      size >= 0,
      "DistributedSampler: the dataset size must be >= 0, got ",
      size);
  // NOTE: Python only checks the rank, so a world size <= 0 reads
  // "Invalid rank 0, rank should be in the interval [0, -1]" there.
  TORCH_CHECK_VALUE(
      world_size >= 1,
      "DistributedSampler: invalid world_size ",
      world_size,
      " (Python's num_replicas), it should be at least 1; pass the number "
      "of processes that share the dataset");
  TORCH_CHECK_VALUE(
      rank >= 0 && rank < world_size,
      "Invalid rank ",
      rank,
      ", rank should be in the interval [0, ",
      world_size - 1,
      "]; pass this process's rank (e.g. RANK under torchrun) and the "
      "world size, in that order");
  // NOTE: Python computes ceil(size / n) and, with drop_last and a size
  // that n does not divide, ceil((size - n) / n) in floating point; both
  // equal these integer forms for sizes below 2^53.
  num_samples_ =
      drop_last ? size / world_size : (size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (num_samples_ == 0) {
    return out;
  }
  if (!shuffle_) {
    for (int64_t i = rank_; i < total_size(); i += world_size_) {
      out.push_back(i % dataset_size_);
    }
    return out;
  }
  // NOTE: Python's torch.Generator().manual_seed(seed + epoch) maps a
  // negative seed s to 2^64 + s: the same as this unsigned sum.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(
      seed_ + static_cast<uint64_t>(epoch_));
  const at::Tensor permutation =
      at::randperm(dataset_size_, generator, at::TensorOptions(at::kLong));
  const int64_t* perm = permutation.const_data_ptr<int64_t>();
  // Padding repeats the permutation from its start (both of Python's
  // branches: `indices[:padding]` and `(indices * k)[:padding]`), so
  // position i of the padded list is perm[i % size].
  for (int64_t i = rank_; i < total_size(); i += world_size_) {
    out.push_back(perm[i % dataset_size_]);
  }
  return out;
}

} // namespace lamp::data
