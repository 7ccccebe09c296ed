#pragma once

// ImageLoader's pipeline: its ring of host batches, the decode and stage
// threads that fill it and the state next() and seek() share with them
// (ImageLoader::Impl). The threads' code is in loader_pipeline.cpp, the
// public API in image_loader.cpp.

#include <ATen/Parallel.h>
#include <lamp/data/distributed_sampler.h>
#include <lamp/data/image_folder.h>
#include <lamp/data/image_loader.h>
#include <torch/types.h>

#include <sys/resource.h>

#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batch_stage.h"
#include "sample_pipeline.h"

namespace lamp::data {

// Note [ImageLoader threads and streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Three kinds of threads share one mutex (`mutex`) and a ring of
// `prefetch + 1` Slots, each a host batch (pinned when the device is CUDA):
//
// The pipeline numbers its batches across epochs: batch b of epoch e is
// `seq` e * batches_per_epoch + b. It starts where next() is (start()) and,
// with prefetch_next_epoch, runs on into the next epoch (each epoch's order
// from the sampler when its first slot is assigned) until the ring is full;
// next() stops at its epoch's end, and set_epoch(epoch + 1) there finds the
// next epoch's first batches ready instead of an empty pipeline.
//
// * Decode threads (num_threads) take rows of the batches the ring holds,
//   one at a time, in `seq` order: read the file, then either decode, crop,
//   resize and flip it into the slot's row (the CPU's rows), or parse its
//   header, draw its crop and keep its bytes for the GPU (a share of the
//   slot's rows: BatchStage::gpu_rows of them, all with ImageDecode::kGpu,
//   a measured share with kAuto, drawn by BatchStage::prepare). With
//   gpu_resize the decode threads decode a JPEG's crop into the slot's
//   `crops` and leave its resize to the GPU. They touch only
//   their row while working, so they hold the mutex only to take a row and
//   to report it done. Before writing a row they wait for the slot's
//   `released` event: the stage's copies out of the slot's last batch
//   (polling it, so that a waiting thread does not hold a core).
// * Stage threads (stage_threads; stage thread k takes the batches b with
//   b % stage_threads == k) each turn a complete slot into a batch
//   (BatchStage::run, lane k): on CUDA it decodes the GPU's rows with
//   nvJPEG, copies the CPU's rows to the device and makes the batch in one
//   kernel, all on its lane's own stream, records `released` and the
//   batch's `done` event, and hands the slot back to the decode threads for
//   seq + ring size at once; it never waits for the GPU on the host
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
// `stop` (under the mutex) ends all waits; the destructor and seek() (to
// any position but the pipeline's own) set it and join the threads. An
// exception in a decode thread (a bad image without skip_bad_images, an I/O
// error) travels with its slot to the stage and from there to next(), which
// rethrows it.

// NOTE: in detail, not the anonymous namespace: ImageLoader::Impl holds
// them, and a type with linkage should not hold one without (GCC's
// -Wsubobject-linkage, in the unity build).
namespace detail {

struct RingSlot {
  int64_t seq = -1; // the batch it holds (see the Note), -1 when free
  int64_t epoch = 0; // that batch's epoch and index in it
  int64_t batch = 0;
  std::shared_ptr<const std::vector<int64_t>> order; // its epoch's order
  int64_t rows = 0;
  int64_t next_row = 0; // the next row a decode thread takes
  int64_t pending = 0; // rows taken or not, not yet done
  double gpu_share = 0; // of its rows, for the GPU (BatchStage::prepare)
  SlotRows data;
  std::exception_ptr error;
};

struct ReadyBatch {
  Staged staged;
  std::vector<std::string> skipped; // the bad rows' files
  std::exception_ptr error;
};

} // namespace detail

struct ImageLoader::Impl {
  // The whole set-up: sampler, recipe, batch stage and the ring's pinned
  // buffers, from options already checked (check_loader_options).
  Impl(const ImageFolder& dataset, ImageLoaderOptions options);

  void start();
  void stop_and_join();
  void decode_loop();
  void stage_loop(int lane, int64_t first);
  std::shared_ptr<const std::vector<int64_t>> order_of(
      std::unique_lock<std::mutex>& lock,
      int64_t epoch);
  void assign(
      std::unique_lock<std::mutex>& lock,
      detail::RingSlot& slot,
      int64_t seq);
  bool decode_row(detail::RingSlot& slot, int64_t row, torch::Tensor& scratch);

  const ImageFolder& dataset;
  const ImageLoaderOptions options;
  const DistributedSampler sampler; // for its sizes; see order_of()
  const int64_t num_batches; // per epoch
  detail::Recipe recipe;
  std::unique_ptr<detail::BatchStage> stage;

  // The caller's position: next() returns batch `batch` of epoch `epoch`
  // next, which is the pipeline's batch `next_seq` while it runs.
  int64_t epoch = 0;
  int64_t batch = 0;
  int64_t next_seq = 0;
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
  std::map<int64_t, detail::ReadyBatch> ready; // by seq
  // The epochs' orders (dataset indices on this rank) that slots were last
  // assigned from.
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders;
  int64_t end_seq = 0; // the pipeline stops before this seq
  bool stop = false;
  bool running = false;
  std::vector<std::thread> threads;
};

} // namespace lamp::data
