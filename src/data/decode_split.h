#pragma once

// Internal: how many images of each batch lamp::data's loader gives the GPU
// under ImageDecode::kAuto, from the measured cost of each path, so that
// the decode threads and the GPU finish a batch together.

#include <lamp/export.h>

#include <cstdint>

namespace lamp::data::detail {

// A batch of B images with g of them for the GPU costs the decode threads
// ((B - g) * cpu + g * read) / threads seconds (`cpu`: reading, decoding
// and transforming one image; `read`: reading one and parsing its header
// for the GPU) and the loader's stages g * gpu / stages seconds (`gpu`: a
// stage thread's time per image the GPU decodes, waits included; `stages`
// threads take alternate batches). The two are equal at
//   g = B * cpu / threads / (gpu / stages + (cpu - read) / threads).
// Each cost is a running average (a thread's over ~100 images, the stage's
// over ~5 batches), and each side
// keeps at least 1/32 of a batch so that it goes on being measured.
//
// Not thread-safe: the loader calls it under its mutex.
class LAMP_API DecodeSplit {
 public:
  DecodeSplit(int64_t threads, int64_t stages);

  // The GPU's share of a batch of `rows` images: 0..rows. Half a batch
  // until both sides have been measured.
  int64_t gpu_rows(int64_t rows) const;

  // A decode thread spent `seconds` on one image: decoding it (`decoded`)
  // or only reading it for the GPU.
  void record_thread(bool decoded, double seconds);

  // The stage spent `seconds` on a batch in which the GPU decoded
  // `gpu_images` images.
  void record_stage(int64_t gpu_images, double seconds);

  // Whether an image whose CPU cost is `ratio` times its GPU cost
  // (cpu_gpu_cost_ratio) goes to the GPU, for a batch whose GPU share is
  // to be `share` (gpu_rows / rows): the GPU gets the images with the
  // highest ratios, the decode threads keep those cheapest for them. An
  // image goes to the GPU when fewer than a `share` of the last kWindow
  // ratios (its own included) rank above it, equal ratios ranked by a
  // stratified draw, so that a `share` of the images go to the GPU from
  // the first image on, whatever the ratios' scale and however many are
  // equal. share >= 1: all; <= 0: none.
  bool to_gpu(double ratio, double share);

 private:
  double threads_;
  double stages_;
  double cpu_ = -1; // seconds per image; < 0: not measured yet
  double read_ = -1;
  double gpu_ = -1;
  // The last kWindow ratios to_gpu saw, a ring; `seen_` counts them all.
  static constexpr int kWindow = 256;
  double window_[kWindow] = {};
  int64_t seen_ = 0;
};

// An image's cost to decode on the CPU over its cost on the GPU, up to a
// constant factor (only their order matters to DecodeSplit::to_gpu). The
// CPU's Huffman decoding, which dominates, reads the file up to the crop's
// last row (`rows_fraction` of the image: partial decoding stops there); the
// GPU's host work (nvJPEG feeding its engines) grows with the whole file, on
// top of a fixed part per image. Measured on one H200 host, nvJPEG's host
// time a JPEG was 0.20 ms at 117 kB and 0.28 ms at 231 kB a file: ~0.11 ms
// plus 0.74 us a kB, so the fixed part is worth ~150 kB.
LAMP_API double cpu_gpu_cost_ratio(int64_t file_bytes, double rows_fraction);

} // namespace lamp::data::detail
