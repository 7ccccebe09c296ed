#include <lamp/data/image_loader.h>

#include <ATen/Parallel.h>
#include <lamp/config.h>
#include <lamp/data/distributed_sampler.h>
#include <lamp/data/image_decoder.h>
#include <lamp/data/image_folder.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "batch_stage.h"
#include "loader_options.h"
#include "sample_pipeline.h"

namespace lamp::data {

// Note [ImageLoader threads and streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Three kinds of threads share one mutex (`mutex`) and a ring of
// `prefetch + 1` Slots, each a host batch (pinned when the device is CUDA):
//
// * Decode threads (num_threads) take rows of the batches the ring holds,
//   one at a time, in batch order: read the file, then either decode, crop,
//   resize and flip it into the slot's row (the CPU's rows), or parse its
//   header, draw its crop and keep its bytes for the GPU (the last
//   `gpu_first..rows` rows of a slot: BatchStage::gpu_rows, all of them
//   with ImageDecode::kGpu, a measured share with kAuto). They touch only
//   their row while working, so they hold the mutex only to take a row and
//   to report it done. Before writing a row they wait for the slot's
//   `released` event: the stage's copies out of the slot's last batch.
// * Stage threads (stage_threads; stage thread k takes the batches b with
//   b % stage_threads == k) each turn a complete slot into a batch
//   (BatchStage::run, lane k): on CUDA it decodes the GPU's rows with
//   nvJPEG, copies the CPU's rows to the device and makes the batch in one
//   kernel, all on its lane's own stream, records `released` and the
//   batch's `done` event, and hands the slot back to the decode threads for
//   batch + ring size at once; it never waits for the GPU on the host
//   (nvJPEG's hardware engines aside: Note [nvJPEG streams and threads]).
//   It is the only thread that uses its lane's stream and nvJPEG decoder,
//   so one lane's host wait for the engines never holds up another's. The
//   finished batches go into `ready` by index, so next() gets them in
//   order whichever lane finishes first.
// * The caller's thread (next()) takes finished batches in order, makes its
//   current stream wait for the batch's `done` event (no host sync) and
//   records the tensors on that stream, so the caching allocator does not
//   reuse their memory while the caller's kernels may still read them. It
//   counts skipped images when it returns their batch.
//
// Decode threads run decode_nice() below the loader's maker's priority, so
// that a stage thread or the training thread that wakes (each runs briefly,
// then waits for the GPU) gets a core at once: with 16 decode threads on 16
// cores the engines otherwise sat idle while a stage thread waited for a
// time slice.
//
// Decode threads call at::set_num_threads(1): it is per-thread for OpenMP,
// but LibTorch also keeps the value for threads created later, so the
// loader restores the caller's value when it joins its threads.
//
// `stop` (under the mutex) ends all waits; the destructor and seek() set it
// and join the threads. An exception in a decode thread (a bad image
// without skip_bad_images, an I/O error) travels with its slot to the stage
// and from there to next(), which rethrows it.

// NOTE: in detail, not the anonymous namespace: ImageLoader::Impl holds
// them, and a type with linkage should not hold one without (GCC's
// -Wsubobject-linkage, in the unity build).
namespace detail {

struct RingSlot {
  int64_t batch = -1; // the batch it holds, -1 when free
  int64_t rows = 0;
  int64_t next_row = 0; // the next row a decode thread takes
  int64_t pending = 0; // rows taken or not, not yet done
  int64_t gpu_first = 0; // rows from here on are for the GPU
  SlotRows data;
  std::exception_ptr error;
};

struct ReadyBatch {
  Staged staged;
  std::vector<std::string> skipped; // the bad rows' files
  std::exception_ptr error;
  bool end = false;
};

} // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

} // namespace

struct ImageLoader::Impl {
  Impl(const ImageFolder& dataset, ImageLoaderOptions options)
      : dataset(dataset),
        options(std::move(options)),
        sampler(
            static_cast<int64_t>(dataset.size()),
            this->options.rank(),
            this->options.world_size(),
            this->options.shuffle(),
            this->options.seed(),
            this->options.drop_last()) {}

  void start();
  void stop_and_join();
  void decode_loop();
  void stage_loop(int lane);
  void assign(detail::RingSlot& slot, int64_t batch);
  bool decode_row(detail::RingSlot& slot, int64_t row, torch::Tensor& scratch);

  const ImageFolder& dataset;
  const ImageLoaderOptions options;
  DistributedSampler sampler;
  detail::Recipe recipe;
  std::unique_ptr<detail::BatchStage> stage;

  int64_t epoch = 0;
  int64_t batch = 0; // what next() returns next
  int64_t num_batches = 0;
  std::vector<int64_t> order; // this epoch's dataset indices on this rank
  // Of the batches next() returned: this epoch's skipped files, and every
  // image decoded on the GPU and on the CPU.
  std::vector<std::string> skipped;
  int64_t gpu_decoded = 0;
  int64_t cpu_decoded = 0;
  // The caller's intra-op threads, restored when the decode threads end.
  const int intra_op_threads = at::get_num_threads();
  // The nice value of the thread that made the loader: the decode threads'
  // is decode_nice() above it.
  const int nice_base = getpriority(PRIO_PROCESS, 0);

  mutable std::mutex mutex;
  std::condition_variable rows_ready; // decode threads wait
  std::condition_variable slot_done; // the stage waits
  std::condition_variable batch_ready; // next() waits
  std::vector<detail::RingSlot> ring;
  std::map<int64_t, detail::ReadyBatch>
      ready; // by batch index; `end` at end_batch
  int64_t end_batch = 0; // where the epoch ends: max(num_batches, batch)
  bool stop = false;
  bool running = false;
  std::vector<std::thread> threads;
};

void ImageLoader::Impl::assign(detail::RingSlot& slot, int64_t b) {
  // Called with the mutex held.
  const int64_t bs = options.batch_size();
  const int64_t first = b * bs;
  slot.batch = b;
  slot.rows = std::min<int64_t>(bs, static_cast<int64_t>(order.size()) - first);
  slot.next_row = 0;
  slot.pending = slot.rows;
  slot.gpu_first = slot.rows - stage->gpu_rows(slot.rows);
  slot.error = nullptr;
}

// Returns whether the row was decoded on the CPU (else it was read for the
// GPU, or is bad).
bool ImageLoader::Impl::decode_row(
    detail::RingSlot& slot,
    int64_t row,
    torch::Tensor& scratch) {
  using detail::RowState;
  const int64_t index = order[slot.batch * options.batch_size() + row];
  const auto& sample = dataset[index];
  auto& data = slot.data;
  stage->wait_until_released(data);
  data.targets.data_ptr<int64_t>()[row] = sample.target;
  // NOTE: an I/O error throws: only images that cannot be decoded are
  // skipped.
  auto bytes = read_file(sample.path);
  if (row >= slot.gpu_first &&
      stage->prepare(
          data.encoded[row], bytes, sample.path, recipe, epoch, index)) {
    data.state[row] = RowState::kEncoded;
    return false;
  }
  std::string problem = detail::transform_into(
      recipe, epoch, index, bytes, sample.path, scratch, data.pixels[row]);
  if (problem.empty()) {
    data.state[row] = RowState::kDecoded;
    return true;
  }
  TORCH_CHECK(options.skip_bad_images(), problem);
  data.state[row] = RowState::kBad;
  data.problem[row] = std::move(problem);
  return false;
}

void ImageLoader::Impl::decode_loop() {
  // One intra-op thread here: num_threads decode threads already fill the
  // cores, and each resize would otherwise start an OpenMP team of its own.
  // See Note [ImageLoader threads and streams] for what this changes.
  at::set_num_threads(1);
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
        if (s.batch >= 0 && s.next_row < s.rows &&
            (slot == nullptr || s.batch < slot->batch)) {
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

void ImageLoader::Impl::stage_loop(int lane) {
  const int64_t lanes = stage->lanes();
  for (int64_t b = batch; b < num_batches; ++b) {
    if (b % lanes != lane) {
      continue;
    }
    detail::RingSlot& slot = ring[b % ring.size()];
    {
      std::unique_lock<std::mutex> lock(mutex);
      slot_done.wait(
          lock, [&] { return stop || (slot.batch == b && slot.pending == 0); });
      if (stop) {
        return;
      }
    }
    detail::ReadyBatch item;
    if (slot.error) {
      item.error = slot.error;
    } else {
      try {
        item.staged = stage->run(slot.data, slot.rows, b, recipe, lane);
        item.staged.batch.epoch = epoch;
        item.staged.batch.index = b;
        for (int64_t r : item.staged.bad_rows) {
          item.skipped.push_back(
              dataset[order[b * options.batch_size() + r]].path);
        }
      } catch (...) {
        item.error = std::current_exception();
      }
    }
    std::unique_lock<std::mutex> lock(mutex);
    const bool failed = static_cast<bool>(item.error);
    ready.emplace(b, std::move(item));
    batch_ready.notify_all();
    if (failed) {
      return; // next() rethrows; seek() or set_epoch() restarts
    }
    // The stage's work on this slot is enqueued and `released` recorded:
    // the decode threads may start on a later batch (they wait for it).
    const int64_t later = b + static_cast<int64_t>(ring.size());
    if (later < num_batches) {
      assign(slot, later);
      rows_ready.notify_all();
    } else {
      slot.batch = -1;
    }
    // Bounded: at most `prefetch` finished batches wait for next().
    slot_done.wait(lock, [&] { return stop || ready.size() < ring.size(); });
    if (stop) {
      return;
    }
  }
  // Every lane ends the epoch (the first one's marker stays).
  std::lock_guard<std::mutex> lock(mutex);
  detail::ReadyBatch end;
  end.end = true;
  ready.emplace(end_batch, std::move(end));
  batch_ready.notify_all();
}

void ImageLoader::Impl::start() {
  sampler.set_epoch(epoch);
  order = sampler.indices();
  const int64_t bs = options.batch_size();
  num_batches = options.drop_last()
      ? static_cast<int64_t>(order.size()) / bs
      : (static_cast<int64_t>(order.size()) + bs - 1) / bs;
  end_batch = std::max(num_batches, batch);
  stop = false;
  ready.clear();
  for (auto& slot : ring) {
    slot.batch = -1;
  }
  for (size_t k = 0; k < ring.size(); ++k) {
    if (batch + static_cast<int64_t>(k) < num_batches) {
      assign(ring[(batch + k) % ring.size()], batch + k);
    }
  }
  for (int64_t t = 0; t < options.num_threads(); ++t) {
    threads.emplace_back([this] { decode_loop(); });
  }
  for (int lane = 0; lane < stage->lanes(); ++lane) {
    threads.emplace_back([this, lane] { stage_loop(lane); });
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

ImageLoader::ImageLoader(const ImageFolder& dataset, ImageLoaderOptions options)
    : impl_(std::make_unique<Impl>(dataset, std::move(options))) {
  const auto& o = impl_->options;
  detail::check_loader_options(dataset, o);
  auto& recipe = impl_->recipe;
  recipe.train = o.train();
  recipe.image_size = o.image_size();
  recipe.resize_size = o.resize_size();
  recipe.scale = o.scale();
  recipe.ratio = o.ratio();
  recipe.seed = o.seed();
  recipe.partial_decode = o.partial_decode();
  impl_->stage = std::make_unique<detail::BatchStage>(o);
  const bool pinned = o.device().is_cuda();
  impl_->ring.resize(o.prefetch() + 1);
  for (auto& slot : impl_->ring) {
    auto& data = slot.data;
    data.pixels = torch::empty(
        {o.batch_size(), o.image_size(), o.image_size(), 3},
        torch::TensorOptions(torch::kUInt8).pinned_memory(pinned));
    data.targets = torch::empty(
        {o.batch_size()},
        torch::TensorOptions(torch::kLong).pinned_memory(pinned));
    data.state.assign(o.batch_size(), detail::RowState::kDecoded);
    data.encoded.resize(o.batch_size());
    data.problem.resize(o.batch_size());
  }
}

ImageLoader::~ImageLoader() {
  impl_->stop_and_join();
}

std::optional<ImageBatch> ImageLoader::next() {
  auto& impl = *impl_;
  if (!impl.running) {
    impl.start();
  }
  detail::ReadyBatch item;
  {
    std::unique_lock<std::mutex> lock(impl.mutex);
    impl.batch_ready.wait(
        lock, [&] { return impl.ready.count(impl.batch) != 0; });
    const auto it = impl.ready.find(impl.batch);
    if (it->second.end) {
      return std::nullopt; // stays at the end until set_epoch()/seek()
    }
    item = std::move(it->second);
    impl.ready.erase(it);
    impl.slot_done.notify_all(); // room in the ready queue
  }
  if (item.error) {
    impl.stop_and_join();
    std::rethrow_exception(item.error);
  }
  auto& staged = item.staged;
  if (!item.skipped.empty()) {
    TORCH_WARN_ONCE(
        "lamp::data::ImageLoader skips images it cannot decode "
        "(skip_bad_images); the first: ",
        staged.bad_reasons.front());
  }
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.skipped.insert(
        impl.skipped.end(), item.skipped.begin(), item.skipped.end());
    impl.gpu_decoded += staged.gpu_decoded;
    impl.cpu_decoded += staged.cpu_decoded;
  }
  ++impl.batch;
  impl.stage->hand_over(staged);
  return std::move(staged.batch);
}

void ImageLoader::set_epoch(int64_t epoch) {
  seek(epoch, 0);
}

void ImageLoader::seek(int64_t epoch, int64_t batch) {
  TORCH_CHECK_VALUE(
      epoch >= 0 && batch >= 0,
      "ImageLoader::seek: epoch and batch must be >= 0, got ",
      epoch,
      " and ",
      batch);
  impl_->stop_and_join();
  impl_->epoch = epoch;
  impl_->batch = batch;
  impl_->skipped.clear();
}

int64_t ImageLoader::epoch() const {
  return impl_->epoch;
}

int64_t ImageLoader::batch() const {
  return impl_->batch;
}

int64_t ImageLoader::batches_per_epoch() const {
  const int64_t n = impl_->sampler.num_samples();
  const int64_t bs = impl_->options.batch_size();
  return impl_->options.drop_last() ? n / bs : (n + bs - 1) / bs;
}

int64_t ImageLoader::skipped_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return static_cast<int64_t>(impl_->skipped.size());
}

std::vector<std::string> ImageLoader::skipped_paths() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->skipped;
}

int64_t ImageLoader::gpu_decoded_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->gpu_decoded;
}

int64_t ImageLoader::cpu_decoded_images() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cpu_decoded;
}

const ImageLoaderOptions& ImageLoader::options() const {
  return impl_->options;
}

} // namespace lamp::data
