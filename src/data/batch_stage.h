#pragma once

// The stage of lamp::data::ImageLoader that turns a host batch of uint8
// pixels into the batch the caller gets: copy to the device, GPU decode
// (nvJPEG) of the rows the decode threads left encoded, normalisation.
// Used by the loader's stage thread only; see Note [ImageLoader threads and
// streams] in image_loader.cpp.

#include <lamp/data/image_loader.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "sample_pipeline.h"

namespace lamp::data::detail {

// A row the GPU decodes: the file's bytes and the row's crop and flip.
struct EncodedRow {
  bool pending = false; // true: the stage must decode this row
  std::vector<uint8_t> bytes;
  std::string path;
  Placement placement;
};
using EncodedRows = std::vector<EncodedRow>;

class BatchStage {
 public:
  explicit BatchStage(const ImageLoaderOptions& options);
  ~BatchStage();

  // Whether the GPU decodes this file (gpu_decode and a JPEG); called by the
  // decode threads.
  bool decodes_on_gpu(const std::vector<uint8_t>& bytes) const;

  // Decode thread: keeps the bytes of `row` and draws its crop from the
  // image's header.
  void prepare(
      EncodedRows& rows,
      int64_t row,
      const std::vector<uint8_t>& bytes,
      const std::string& path,
      const Recipe& recipe,
      int64_t epoch,
      int64_t index) const;

  // Stage thread: the first `rows` rows of `pixels` and `targets` (host) as
  // a batch on the device, without the rows whose `good` is 0. On CUDA the
  // work runs on the loader's stream and is finished when this returns.
  ImageBatch run(
      const torch::Tensor& pixels,
      const torch::Tensor& targets,
      std::vector<char>& good,
      int64_t rows,
      EncodedRows& encoded,
      const Recipe& recipe,
      std::vector<std::string>& bad_reason);

  // Caller's thread: makes the batch safe to use on its current stream.
  void hand_over(ImageBatch& batch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace lamp::data::detail
