#include <lamp/data/token_dataset.h>

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace lamp::data {
namespace {

constexpr int32_t kMagic = 20240520; // llm.c's dev/data/data_common.py
constexpr int32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 256 * 4;

} // namespace

struct TokenDataset::Impl {
  std::string path;
  TokenDatasetOptions options;
  int fd = -1;
  void* map = nullptr;
  size_t map_bytes = 0;
  const uint16_t* tokens = nullptr;
  int64_t count = 0;
  DistributedSampler sampler{0, 0, 1};
  std::optional<int64_t> epoch; // whose indices `order` holds
  std::vector<int64_t> order;

  ~Impl() {
    if (map != nullptr) {
      munmap(map, map_bytes);
    }
    if (fd >= 0) {
      close(fd);
    }
  }
};

TokenDataset::TokenDataset(std::string path, TokenDatasetOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& d = *impl_;
  d.path = std::move(path);
  d.options = options;
  const auto& p = d.path;
  TORCH_CHECK_VALUE(
      options.seq_len() >= 1 && options.batch_size() >= 1,
      "lamp::data::TokenDataset: seq_len and batch_size must be >= 1, got ",
      options.seq_len(),
      " and ",
      options.batch_size());
  TORCH_CHECK_VALUE(
      options.world_size() >= 1 && options.rank() >= 0 &&
          options.rank() < options.world_size(),
      "lamp::data::TokenDataset: rank ",
      options.rank(),
      " is outside [0, ",
      options.world_size(),
      ")");
  d.fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(d.fd >= 0, p, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  TORCH_CHECK(
      fstat(d.fd, &st) == 0 && S_ISREG(st.st_mode), p, ": not a regular file");
  const auto bytes = static_cast<int64_t>(st.st_size);
  TORCH_CHECK(
      bytes >= kHeaderBytes,
      p,
      ": ",
      bytes,
      " bytes, shorter than the 1,024-byte header of a token file (llm.c's "
      ".bin layout; tools/make_tokens.py writes one)");
  int32_t header[256];
  TORCH_CHECK(
      pread(d.fd, header, sizeof header, 0) == sizeof header,
      p,
      ": cannot read the header (",
      std::strerror(errno),
      ")");
  TORCH_CHECK(
      header[0] == kMagic,
      p,
      ": not a token file (magic ",
      header[0],
      ", expected ",
      kMagic,
      ": llm.c's .bin layout; tools/make_tokens.py writes one)");
  TORCH_CHECK(
      header[1] == kVersion,
      p,
      ": token file version ",
      header[1],
      ", this lamp reads version ",
      kVersion,
      " (uint16 tokens)");
  d.count = header[2];
  const int64_t expected = kHeaderBytes + 2 * d.count;
  TORCH_CHECK(
      d.count >= 0 && bytes == expected,
      p,
      ": the header says ",
      d.count,
      " tokens (",
      expected,
      " bytes) but the file has ",
      bytes,
      " bytes: truncated or damaged");
  TORCH_CHECK(
      d.count >= options.seq_len() + 1,
      p,
      ": ",
      d.count,
      " tokens, fewer than one window of seq_len + 1 = ",
      options.seq_len() + 1,
      "; use a larger file or a shorter sequence");
  d.map_bytes = static_cast<size_t>(bytes);
  d.map = mmap(nullptr, d.map_bytes, PROT_READ, MAP_SHARED, d.fd, 0);
  TORCH_CHECK(
      d.map != MAP_FAILED, p, ": cannot map (", std::strerror(errno), ")");
  d.tokens = reinterpret_cast<const uint16_t*>(
      static_cast<const char*>(d.map) + kHeaderBytes);
  d.sampler = DistributedSampler(
      windows(),
      options.rank(),
      options.world_size(),
      options.shuffle(),
      options.seed(),
      /*drop_last=*/true);
  TORCH_CHECK(
      batches_per_epoch() >= 1,
      p,
      ": too short for one batch: ",
      windows(),
      " window(s) of ",
      options.seq_len() + 1,
      " tokens, and a batch of ",
      options.batch_size(),
      " on each of ",
      options.world_size(),
      " rank(s) needs ",
      options.batch_size() * options.world_size(),
      "; use a larger file, a smaller batch or a shorter sequence");
}

TokenDataset::~TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;

int64_t TokenDataset::size() const {
  return impl_->count;
}

int64_t TokenDataset::windows() const {
  return (impl_->count - 1) / impl_->options.seq_len();
}

int64_t TokenDataset::batches_per_epoch() const {
  return impl_->sampler.num_samples() / impl_->options.batch_size();
}

const std::string& TokenDataset::path() const {
  return impl_->path;
}

const TokenDatasetOptions& TokenDataset::options() const {
  return impl_->options;
}

torch::Tensor TokenDataset::tokens() const {
  return torch::from_blob(
      const_cast<uint16_t*>(impl_->tokens), {impl_->count}, torch::kUInt16);
}

std::pair<torch::Tensor, torch::Tensor> TokenDataset::batch(
    int64_t epoch,
    int64_t index) {
  auto& d = *impl_;
  const auto& o = d.options;
  TORCH_CHECK_INDEX(
      index >= 0 && index < batches_per_epoch(),
      d.path,
      ": batch ",
      index,
      " of an epoch of ",
      batches_per_epoch());
  if (d.epoch != epoch) {
    d.sampler.set_epoch(epoch);
    d.order = d.sampler.indices();
    d.epoch = epoch;
  }
  const int64_t b = o.batch_size(), t = o.seq_len();
  const auto options = torch::TensorOptions()
                           .dtype(torch::kLong)
                           .pinned_memory(torch::cuda::is_available());
  auto inputs = torch::empty({b, t}, options);
  auto targets = torch::empty({b, t}, options);
  auto* in = inputs.data_ptr<int64_t>();
  auto* out = targets.data_ptr<int64_t>();
  uint16_t largest = 0;
  for (int64_t i = 0; i < b; ++i) {
    const uint16_t* window = d.tokens + d.order[index * b + i] * t;
    for (int64_t j = 0; j < t; ++j) {
      in[i * t + j] = window[j];
      out[i * t + j] = window[j + 1];
      largest = std::max(largest, window[j]);
    }
    largest = std::max(largest, window[t]);
  }
  TORCH_CHECK_INDEX(
      o.vocab_size() <= 0 || largest < o.vocab_size(),
      d.path,
      ": holds token ",
      largest,
      ", outside the model's vocabulary of ",
      o.vocab_size(),
      " (a file made with another tokenizer?)");
  return {inputs, targets};
}

} // namespace lamp::data
