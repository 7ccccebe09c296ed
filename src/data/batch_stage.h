#pragma once

// The stage of lamp::data::ImageLoader that turns a slot of decoded rows
// into the batch the caller gets: GPU decode (nvJPEG) of the rows the
// decode threads left encoded, the copy of the others to the device, and
// one kernel that transforms, normalises and lays out the whole batch. Also
// what the decode threads ask of it (which rows the GPU takes, a row's
// header for the GPU). See Note [ImageLoader threads and streams] in
// loader_pipeline.h. batch_stage.cpp is the stage on any device and its
// CPU batches; the CUDA work is batch_stage_cuda.{h,cpp}.

#include <c10/core/Event.h>
#include <lamp/data/image_loader.h>
#include <torch/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sample_pipeline.h"

namespace lamp::data::detail {

// The end of a decode error when the loader does not skip bad images: the
// option that would. (Not in the reasons themselves: a skipped image's
// reason goes to the warning, where the option is already set.)
inline constexpr const char* kSkipAdvice =
    "; or skip such files with skip_bad_images(true)";

// What a decode thread left in a row of a slot.
enum class RowState : uint8_t {
  kDecoded, // the row's transformed pixels are in the slot's host pixels
  kEncoded, // the file's bytes wait for the GPU
  kCropped, // the decoded crop is in the slot's `crops`, for the GPU's resize
  kBad, // the image cannot be decoded (`problem`)
};

// A row for the GPU: the file's bytes and the row's crop and flip.
struct EncodedRow {
  std::vector<uint8_t> bytes;
  std::string path;
  Placement placement;
};

// A ring slot's rows: written by the decode threads (each its own rows),
// then read by a stage thread once all are done.
struct SlotRows {
  torch::Tensor pixels; // uint8 [B, S, S, 3], pinned when the device is CUDA
  torch::Tensor targets; // int64 [B], likewise
  std::vector<RowState> state;
  std::vector<EncodedRow> encoded; // kEncoded; kCropped: the placement only
  std::vector<std::string> problem;
  // Recipe::gpu_resize: uint8, pinned, the kCropped rows' crops one after
  // another (crop_offset[row]: where, in bytes), up to *crops_used bytes,
  // reserved by the decode threads side by side (reset by the loader when
  // it assigns the slot a batch).
  torch::Tensor crops;
  std::vector<int64_t> crop_offset;
  std::unique_ptr<std::atomic<int64_t>> crops_used =
      std::make_unique<std::atomic<int64_t>>(0);
  // Recorded by the stage once its copies out of `pixels` and `targets` are
  // enqueued; the decode threads wait for it before writing them again.
  std::optional<c10::Event> released;
};

// The stage's result for one slot.
struct Staged {
  ImageBatch batch;
  // Rows left out of the batch or replaced (skip_bad_images), and why.
  std::vector<int64_t> bad_rows;
  std::vector<std::string> bad_reasons;
  int64_t gpu_decoded = 0; // images the GPU decoded
  int64_t cpu_decoded = 0; // images the CPU decoded
  // CUDA: recorded on its lane's stream after the batch's work.
  std::optional<c10::Event> done;
};

// Which row of the slot each output row shows: itself, or, for a bad row
// with replace_bad_images (`replace`), the next good row (cyclically); bad
// rows are left out otherwise. `bad` gets the bad rows. `batch` (its index
// in the epoch) is for messages.
std::vector<int64_t> output_rows(
    const SlotRows& slot,
    int64_t rows,
    bool replace,
    int64_t batch,
    std::vector<int64_t>& bad);

class BatchStage {
 public:
  explicit BatchStage(const ImageLoaderOptions& options);
  ~BatchStage();

  // How many of a batch's `rows` the decode threads leave for the GPU
  // (prepare() picks which): all (kGpu), a measured share (kAuto with
  // nvJPEG) or none.
  // Called under the loader's mutex.
  int64_t gpu_rows(int64_t rows) const;

  // Decode thread, for a row of a batch whose GPU share is `gpu_share`
  // (gpu_rows / rows, > 0): reads the header and decides where the image
  // is decoded (with kAuto a progressive JPEG stays on the CPU, the others
  // go to the GPU at `gpu_share`, drawn by a hash of `index`). For the GPU:
  // draws the row's crop into `row` and moves the bytes there, true. False
  // (bytes left alone) for the CPU, also when nvJPEG cannot decode the file
  // (a PNG, a CMYK JPEG, a damaged file...).
  bool prepare(
      EncodedRow& row,
      std::vector<uint8_t>& bytes,
      const std::string& path,
      const Recipe& recipe,
      int64_t epoch,
      int64_t index,
      double gpu_share) const;

  // Decode thread: a measurement for kAuto's split (under the mutex).
  void record_thread(bool decoded, double seconds);

  // Decode thread: waits until the stage's copies out of `slot` have run.
  void wait_until_released(const SlotRows& slot) const;

  // The number of stage threads (ImageLoaderOptions::stage_threads), each
  // a lane of its own: run() calls with different lanes may overlap.
  int lanes() const;

  // Stage thread of lane `lane`: the first `rows` rows of `slot` as a batch
  // on the device, bad rows left out or replaced (skip_bad_images,
  // replace_bad_images); a bad row without skip_bad_images never reaches
  // here. On CUDA the work is enqueued on the lane's stream, `done` marks
  // its end, and `released` is recorded for the slot; nothing waits on the
  // host for it. `batch` (its index in the epoch) is for messages.
  Staged run(
      SlotRows& slot,
      int64_t rows,
      int64_t batch,
      const Recipe& recipe,
      int lane);

  // Caller's thread: makes the batch safe to use on its current stream.
  void hand_over(Staged& staged) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp::data::detail
