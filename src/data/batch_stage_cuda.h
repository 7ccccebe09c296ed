#pragma once

// Internal: the CUDA half of the image loader's batch stage (batch_stage.h):
// the lanes' streams and nvJPEG decoders, the GPU decode of the rows the
// decode threads left encoded, the copy of the others, the kernel that
// writes the batch, and the hand-over to the caller's stream.
// batch_stage_cuda.cpp is built only with LAMP_WITH_CUDA (as src/nn's
// *_cuda.cpp); without it the functions below are stubs, and the stage
// calls them only for a CUDA device, which the loader then rejects.

#include <lamp/config.h>
#include <lamp/data/image_decoder.h>
#include <lamp/data/image_loader.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batch_stage.h"

namespace lamp::data::detail {

// What one stage thread uses alone on CUDA: its stream, its nvJPEG decoder,
// a CPU buffer for the files nvJPEG turns down. See Note [ImageLoader
// threads and streams] in loader_pipeline.h.
struct CudaLane;

// The stage's CUDA resources, decided once by its constructor.
struct CudaStage {
  // What ImageLoaderOptions::decode() comes to: kCpu without nvJPEG, or
  // with kAuto where nvJPEG does not work on the device.
  ImageDecode mode = ImageDecode::kCpu;
  std::vector<std::shared_ptr<CudaLane>> lanes; // one per stage thread
};

#if LAMP_WITH_CUDA

// The lanes for `options` (a CUDA device, which gets its index here).
CudaStage make_cuda_stage(ImageLoaderOptions& options);

// Whether nvJPEG decodes the image in `bytes` (a JPEG whose header and
// markers it takes; with `progressive_on_cpu`, a sequential one only), and
// its size. False without nvJPEG.
bool nvjpeg_takes(
    const std::vector<uint8_t>& bytes,
    const std::string& path,
    bool progressive_on_cpu,
    ImageSize* size);

// BatchStage::run for a CUDA device, on `lane`'s stream.
Staged run_cuda(
    CudaLane& lane,
    const ImageLoaderOptions& options,
    SlotRows& slot,
    int64_t rows,
    int64_t batch,
    const Recipe& recipe);

// BatchStage::hand_over for a batch on a CUDA device.
void hand_over_cuda(Staged& staged);

#else

inline CudaStage make_cuda_stage(ImageLoaderOptions&) {
  TORCH_CHECK(false, "ImageLoader: lamp was built without CUDA");
}

inline bool nvjpeg_takes(
    const std::vector<uint8_t>&,
    const std::string&,
    bool,
    ImageSize*) {
  return false;
}

inline Staged run_cuda(
    CudaLane&,
    const ImageLoaderOptions&,
    SlotRows&,
    int64_t,
    int64_t,
    const Recipe&) {
  TORCH_CHECK(false, "ImageLoader: lamp was built without CUDA");
}

inline void hand_over_cuda(Staged&) {}

#endif

} // namespace lamp::data::detail
