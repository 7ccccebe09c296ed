// ImageLoader's decode and stage threads: see Note [ImageLoader threads
// and streams] in loader_pipeline.h.

#include "loader_pipeline.h"

#include <lamp/data/image_decoder.h>
#include <torch/torch.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <string>

namespace lamp::data {

namespace {

using Clock = std::chrono::steady_clock;

// Names the calling thread for top, perf and /proc (at most 15 characters);
// a failure only leaves the inherited name.
void name_thread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

} // namespace

ImageLoader::Impl::Impl(const ImageFolder& dataset, ImageLoaderOptions options)
    : dataset(dataset),
      options(std::move(options)),
      sampler(
          static_cast<int64_t>(dataset.size()),
          this->options.rank(),
          this->options.world_size(),
          this->options.shuffle(),
          this->options.seed(),
          this->options.drop_last()),
      num_batches(
          this->options.drop_last()
              ? sampler.num_samples() / this->options.batch_size()
              : (sampler.num_samples() + this->options.batch_size() - 1) /
                  this->options.batch_size()) {
  const auto& o = this->options; // NOTE: the member; the parameter was moved
  recipe.train = o.train();
  recipe.image_size = o.image_size();
  recipe.resize_size = o.resize_size();
  recipe.scale = o.scale();
  recipe.ratio = o.ratio();
  recipe.seed = o.seed();
  recipe.partial_decode = o.partial_decode();
  recipe.dct_downscale = o.dct_downscale();
  recipe.gpu_resize =
      o.gpu_resize() && o.device().is_cuda() && o.train() && o.partial_decode();
  stage = std::make_unique<detail::BatchStage>(o);
  const bool pinned = o.device().is_cuda();
  ring.resize(o.prefetch() + 1);
  for (auto& slot : ring) {
    auto& data = slot.data;
    data.pixels = torch::empty(
        {o.batch_size(), o.image_size(), o.image_size(), 3},
        torch::TensorOptions(torch::kUInt8).pinned_memory(pinned));
    data.targets = torch::empty(
        {o.batch_size()},
        torch::TensorOptions(torch::kLong).pinned_memory(pinned));
    if (recipe.gpu_resize) {
      // Room for crops of twice the output's pixels on average; a crop
      // that finds none is resized on the CPU.
      data.crops = torch::empty(
          {2 * o.batch_size() * o.image_size() * o.image_size() * 3},
          torch::TensorOptions(torch::kUInt8).pinned_memory(pinned));
      data.crop_offset.assign(o.batch_size(), 0);
    }
    data.state.assign(o.batch_size(), detail::RowState::kDecoded);
    data.encoded.resize(o.batch_size());
    data.problem.resize(o.batch_size());
  }
}

// Called with `lock` (on the mutex) held; computes a new epoch's order
// without it (a shuffle of the whole dataset).
std::shared_ptr<const std::vector<int64_t>> ImageLoader::Impl::order_of(
    std::unique_lock<std::mutex>& lock,
    int64_t e) {
  if (const auto it = orders.find(e); it != orders.end()) {
    return it->second;
  }
  lock.unlock();
  DistributedSampler s = sampler; // a copy: set_epoch() changes it
  s.set_epoch(e);
  auto order = std::make_shared<const std::vector<int64_t>>(s.indices());
  lock.lock();
  // Two lanes may cross into a new epoch at once: the first one's stays.
  const auto [it, added] = orders.emplace(e, std::move(order));
  (void)added;
  // Slots keep their own; an older epoch is not assigned again.
  orders.erase(orders.begin(), orders.lower_bound(e - 1));
  return it->second;
}

void ImageLoader::Impl::assign(
    std::unique_lock<std::mutex>& lock,
    detail::RingSlot& slot,
    int64_t seq) {
  const int64_t e = seq / num_batches;
  auto order = order_of(lock, e);
  const int64_t bs = options.batch_size();
  const int64_t b = seq % num_batches;
  const int64_t first = b * bs;
  slot.seq = seq;
  slot.epoch = e;
  slot.batch = b;
  slot.order = std::move(order);
  slot.rows =
      std::min<int64_t>(bs, static_cast<int64_t>(slot.order->size()) - first);
  slot.next_row = 0;
  slot.pending = slot.rows;
  slot.data.crops_used->store(0);
  slot.gpu_share = slot.rows > 0
      ? static_cast<double>(stage->gpu_rows(slot.rows)) /
          static_cast<double>(slot.rows)
      : 0.0;
  slot.error = nullptr;
}

// Returns whether the row was decoded on the CPU (else it was read for the
// GPU, or is bad).
bool ImageLoader::Impl::decode_row(
    detail::RingSlot& slot,
    int64_t row,
    torch::Tensor& scratch) {
  using detail::RowState;
  const int64_t index = (*slot.order)[slot.batch * options.batch_size() + row];
  const auto& sample = dataset[index];
  auto& data = slot.data;
  stage->wait_until_released(data);
  data.targets.data_ptr<int64_t>()[row] = sample.target;
  // NOTE: an I/O error throws: only images that cannot be decoded are
  // skipped.
  auto bytes = read_file(sample.path);
  if (slot.gpu_share > 0 &&
      stage->prepare(
          data.encoded[row],
          bytes,
          sample.path,
          recipe,
          slot.epoch,
          index,
          slot.gpu_share)) {
    data.state[row] = RowState::kEncoded;
    return false;
  }
  std::string problem;
  const detail::SampleRef file{slot.epoch, index, bytes, sample.path};
  if (recipe.gpu_resize) {
    // The crop straight into the slot's crops, for the GPU to resize, when
    // there is room.
    auto& used = *data.crops_used;
    const int64_t capacity = data.crops.numel();
    uint8_t* base = data.crops.data_ptr<uint8_t>();
    int64_t offset = 0;
    const auto reserve = [&](int64_t n) -> uint8_t* {
      offset = used.fetch_add(n);
      return offset + n <= capacity ? base + offset : nullptr;
    };
    auto crop = detail::decode_crop(recipe, file, reserve);
    if (crop.taken && crop.problem.empty()) {
      data.state[row] = RowState::kCropped;
      data.encoded[row].placement = crop.placement;
      data.crop_offset[row] = offset;
      return true;
    }
    problem = std::move(crop.problem);
  }
  if (problem.empty()) {
    problem = detail::transform_into(recipe, file, scratch, data.pixels[row]);
  }
  if (problem.empty()) {
    data.state[row] = RowState::kDecoded;
    return true;
  }
  TORCH_CHECK(options.skip_bad_images(), problem, detail::kSkipAdvice);
  data.state[row] = RowState::kBad;
  data.problem[row] = std::move(problem);
  return false;
}

void ImageLoader::Impl::decode_loop() {
  // One intra-op thread here: num_threads decode threads already fill the
  // cores, and each resize would otherwise start an OpenMP team of its own.
  // See Note [ImageLoader threads and streams] for what this changes.
  at::set_num_threads(1);
  name_thread("lamp-decode");
  if (options.decode_nice() > 0) {
    // A thread's own nice value (Linux schedules threads, and setpriority
    // on a thread id changes that thread only). Raising it needs no
    // privilege; failing to is harmless, so the result is ignored.
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    (void)setpriority(PRIO_PROCESS, tid, nice_base + options.decode_nice());
  }
  torch::Tensor scratch; // this thread's decode buffer, reused
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    detail::RingSlot* slot = nullptr;
    rows_ready.wait(lock, [&] {
      if (stop) {
        return true;
      }
      // The lowest batch with an untaken row, so batches finish in order.
      for (auto& s : ring) {
        if (s.seq >= 0 && s.next_row < s.rows &&
            (slot == nullptr || s.seq < slot->seq)) {
          slot = &s;
        }
      }
      return slot != nullptr;
    });
    if (stop) {
      return;
    }
    const int64_t row = slot->next_row++;
    lock.unlock();
    std::exception_ptr error;
    const auto start = Clock::now();
    bool decoded = false;
    try {
      decoded = decode_row(*slot, row, scratch);
    } catch (...) {
      error = std::current_exception();
    }
    stage->record_thread(
        decoded, std::chrono::duration<double>(Clock::now() - start).count());
    lock.lock();
    if (error && !slot->error) {
      slot->error = error;
    }
    if (--slot->pending == 0) {
      slot_done.notify_all();
    }
  }
}

void ImageLoader::Impl::stage_loop(int lane, int64_t first) {
  name_thread("lamp-stage" + std::to_string(lane));
  const int64_t lanes = stage->lanes();
  const int64_t bs = options.batch_size();
  for (int64_t seq = first; seq < end_seq; ++seq) {
    if (seq % lanes != lane) {
      continue;
    }
    detail::RingSlot& slot = ring[seq % ring.size()];
    {
      std::unique_lock<std::mutex> lock(mutex);
      slot_done.wait(
          lock, [&] { return stop || (slot.seq == seq && slot.pending == 0); });
      if (stop) {
        return;
      }
    }
    detail::ReadyBatch item;
    if (slot.error) {
      item.error = slot.error;
    } else {
      try {
        item.staged =
            stage->run(slot.data, slot.rows, slot.batch, recipe, lane);
        item.staged.batch.epoch = slot.epoch;
        item.staged.batch.index = slot.batch;
        for (int64_t r : item.staged.bad_rows) {
          item.skipped.push_back(
              dataset[(*slot.order)[slot.batch * bs + r]].path);
        }
      } catch (...) {
        item.error = std::current_exception();
      }
    }
    std::unique_lock<std::mutex> lock(mutex);
    const bool failed = static_cast<bool>(item.error);
    ready.emplace(seq, std::move(item));
    batch_ready.notify_all();
    if (failed) {
      return; // next() rethrows; seek() or set_epoch() restarts
    }
    // The stage's work on this slot is enqueued and `released` recorded:
    // the decode threads may start on a later batch (they wait for it).
    const int64_t later = seq + static_cast<int64_t>(ring.size());
    if (later < end_seq) {
      assign(lock, slot, later);
      if (stop) {
        return; // order_of() let go of the lock
      }
      rows_ready.notify_all();
    } else {
      slot.seq = -1;
    }
    // Bounded: at most `prefetch` finished batches wait for next().
    slot_done.wait(lock, [&] { return stop || ready.size() < ring.size(); });
    if (stop) {
      return;
    }
  }
}

void ImageLoader::Impl::start() {
  // The caller's position is inside an epoch (next() checked).
  next_seq = epoch * num_batches + batch;
  end_seq = options.prefetch_next_epoch() ? std::numeric_limits<int64_t>::max()
                                          : (epoch + 1) * num_batches;
  stop = false;
  ready.clear();
  orders.clear();
  std::unique_lock<std::mutex> lock(mutex);
  for (auto& slot : ring) {
    slot.seq = -1;
  }
  for (size_t k = 0; k < ring.size(); ++k) {
    const int64_t seq = next_seq + static_cast<int64_t>(k);
    if (seq < end_seq) {
      assign(lock, ring[seq % ring.size()], seq);
    }
  }
  lock.unlock();
  for (int64_t t = 0; t < options.num_threads(); ++t) {
    threads.emplace_back([this] { decode_loop(); });
  }
  for (int lane = 0; lane < stage->lanes(); ++lane) {
    threads.emplace_back(
        [this, lane, first = next_seq] { stage_loop(lane, first); });
  }
  running = true;
}

void ImageLoader::Impl::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  rows_ready.notify_all();
  slot_done.notify_all();
  batch_ready.notify_all();
  for (auto& t : threads) {
    t.join();
  }
  if (!threads.empty()) {
    at::set_num_threads(intra_op_threads);
  }
  threads.clear();
  running = false;
  ready.clear();
}

} // namespace lamp::data
