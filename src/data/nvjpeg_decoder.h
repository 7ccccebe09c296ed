#pragma once

// Internal: decoding batches of JPEG files on the GPU with nvJPEG, for
// lamp::data's loader. Built only with LAMP_WITH_NVJPEG; the CPU decoder
// (lamp/data/image_decoder.h) is the reference and the fallback.

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <lamp/data/transforms.h>
#include <lamp/export.h>

#include "nvjpeg_memory.h"

namespace lamp::data::detail {

/// Why NvjpegDecoder::decode did not decode one image of a batch.
struct NvjpegFailure {
  /// A JPEG nvJPEG cannot decode (c10::NotImplementedError): decode it on
  /// the CPU. false: a corrupt or truncated file (c10::ValueError).
  bool unsupported = false;
  /// What is wrong, naming the file.
  std::string message;
};

/// Options of NvjpegDecoder.
struct NvjpegDecoderOptions {
  /// Decode baseline JPEGs on the GPU's hardware JPEG engines where it has
  /// them (A100, H100, H200); false: nvJPEG's CUDA backend decodes all.
  /// Default: true.
  TORCH_ARG(bool, hardware) = true;
  /// The CUDA backend's device buffer comes from LibTorch's caching
  /// allocator; false: from cudaMalloc (nvJPEG's default), a diagnostic
  /// switch. The hardware engines' buffers always come from cudaMalloc (see
  /// Note [nvJPEG streams and threads]). Default: true.
  TORCH_ARG(bool, caching_allocator) = true;
};

/// Decodes JPEGs to RGB on one GPU: baseline files on the GPU's hardware
/// JPEG engines where it has them (A100, H100, H200), the rest (progressive
/// files, sampling the engines refuse, GPUs without engines) with nvJPEG's
/// CUDA backend.
///
/// Errors name the file (`names[i]`): a corrupt or truncated JPEG throws
/// c10::ValueError; a JPEG that nvJPEG cannot decode (CMYK/YCCK, 3
/// components in RGB colour space, 12-bit, arithmetic-coded, lossless)
/// throws c10::NotImplementedError whose message says "unsupported by
/// nvJPEG": the loader decodes that file on the CPU instead. Anything else
/// (out of memory, a failing GPU) throws c10::Error. After any error the
/// nvJPEG state the image used is made anew, so one bad file never affects
/// another.
///
/// See Note [nvJPEG streams and threads]
///
/// Example:
/// \code
///   NvjpegDecoder decoder(/*device=*/0, /*max_batch_size=*/256);
///   auto stream = c10::cuda::getStreamFromPool(false, 0);
///   auto images = decoder.decode(data, sizes, names, stream.stream());
///   // images[i]: uint8 [H, W, 3] on cuda:0, ready in `stream` order
/// \endcode
class LAMP_API NvjpegDecoder {
 public:
  /// A decoder for `device` that takes batches of up to `max_batch_size`
  /// images. One per decoding thread (it may move between threads, used by
  /// one at a time).
  NvjpegDecoder(
      c10::DeviceIndex device,
      int max_batch_size,
      NvjpegDecoderOptions options = {});
  ~NvjpegDecoder();
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  /// Decodes `data[i]` (`sizes[i]` bytes, host memory; see the Note for how
  /// long it must stay valid) to a uint8 CUDA tensor [height, width, 3],
  /// interleaved RGB (grayscale files come out with R = G = B), as the CPU
  /// decoder's layout. The work is enqueued on `stream`, a stream of this
  /// decoder's device; the outputs come from LibTorch's caching allocator,
  /// allocated with `stream` current, as views of one block a batch (a
  /// kept output keeps the block). At most max_batch_size() images.
  /// When some go to the hardware engines, first waits on the host until
  /// `stream` is idle (see the Note): give the decoder a stream of its own.
  ///
  /// With `failures`: an image that is corrupt, truncated or unsupported
  /// gets an undefined tensor and its reason in (*failures)[i] (resized to
  /// the batch), instead of throwing, and the other images decode.
  ///
  /// With `regions` (one per image): image i comes out as only
  /// (*regions)[i] of it, [height, width, 3], and nvJPEG decodes only that
  /// region where it can (its ROI decode: the engines and the CUDA backend
  /// write only the region; the entropy decoding still reads the whole
  /// file). A region must lie inside its image (c10::Error otherwise).
  std::vector<torch::Tensor> decode(
      const std::vector<const uint8_t*>& data,
      const std::vector<size_t>& sizes,
      const std::vector<std::string>& names,
      cudaStream_t stream,
      std::vector<std::optional<NvjpegFailure>>* failures = nullptr,
      const std::vector<CropBox>* regions = nullptr);

  /// How many images of the last decode() call the hardware engines decoded,
  /// and how many the CUDA backend did.
  int64_t hardware_decoded() const;
  int64_t cuda_decoded() const;
  /// The host time (seconds) the last decode() call spent in the CUDA
  /// backend's images, one after another on the calling thread (for
  /// benchmarks: what progressive JPEGs and others the engines refuse cost).
  double cuda_seconds() const;

  /// What nvJPEG allocated and freed for this decoder so far (its own
  /// buffers, not the outputs): counts, bytes, and the time spent in the
  /// calls.
  NvjpegAllocations allocations() const;

  /// Whether this decoder uses the hardware engines (false when the GPU has
  /// none, or after they failed on three batches in a row that the CUDA
  /// backend decoded).
  bool has_hardware() const;
  c10::DeviceIndex device() const;
  int max_batch_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct JpegLayout;

/// Whether nvJPEG decodes a JPEG of this layout (jpeg_markers.h): a whole
/// file, 8-bit, Huffman-coded, 1 or 3 components in YCbCr or grey.
LAMP_API bool nvjpeg_supports(const JpegLayout& layout);

/// Whether nvJPEG works on `device`: the device exists and nvJPEG can create
/// a handle for it. Cached per device; never throws.
LAMP_API bool nvjpeg_available(c10::DeviceIndex device);

} // namespace lamp::data::detail
