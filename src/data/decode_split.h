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

 private:
  double threads_;
  double stages_;
  double cpu_ = -1; // seconds per image; < 0: not measured yet
  double read_ = -1;
  double gpu_ = -1;
};

} // namespace lamp::data::detail
