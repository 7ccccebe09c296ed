// Images/s of lamp's nvJPEG decoder alone (no crop, no resize, no loader):
// the ceiling of the GPU half of ImageLoader's decode. The JPEGs of an
// ImageFolder are read into memory once; `--decoders N` threads, each with
// its own decoder and stream, take alternate batches of `--batch-size`
// images, as N loader stages would. `--cuda-backend` keeps the hardware
// engines out (nvJPEG's CUDA backend decodes all). `--roi` decodes only a
// RandomResizedCrop window of each image (the loader's training crops, as
// `partial_decode` does), with nvJPEG's ROI decode. `--pinned` hands
// nvJPEG the encoded bytes in pinned host memory instead of pageable.
//
//   nvjpeg_decoder --data DIR [--decoders 1] [--batch-size 256]
//                  [--batches 60] [--cuda-backend] [--roi] [--pinned]
//                  [--per-pass]
//
// Prints one JSON line: images/s, the share the engines decoded, the host
// time a decode() call takes (the stage thread's part of a batch), wall and
// CPU, and what nvJPEG allocated for its own buffers; with --per-pass, a
// line per pass over the files (the first pass against later ones).

#include <lamp/data.h>

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "data/jpeg_markers.h"
#include "data/nvjpeg_decoder.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct File {
  std::string path;
  std::vector<uint8_t> bytes;
  lamp::data::CropBox crop; // a training crop of it
};

} // namespace

int main(int argc, char** argv) {
  std::string dir;
  int decoders = 1;
  int64_t batch_size = 256;
  int64_t batches = 60;
  int64_t max_files = 4096;
  bool cuda_backend = false;
  bool roi = false;
  CLI::App app{"lamp's nvJPEG decoder alone"};
  app.add_option("--data", dir, "an ImageFolder root")->required();
  app.add_option("--decoders", decoders, "threads, a decoder each")
      ->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str();
  app.add_option("--batches", batches, "timed batches")->capture_default_str();
  app.add_option("--max-files", max_files, "files read into memory")
      ->capture_default_str();
  app.add_flag("--cuda-backend", cuda_backend, "no hardware engines");
  app.add_flag("--roi", roi, "decode only a training crop of each image");
  bool pinned = false;
  app.add_flag("--pinned", pinned, "the encoded bytes in pinned memory");
  bool per_pass = false;
  app.add_flag(
      "--per-pass",
      per_pass,
      "also a line per pass over the files: host ms a batch and nvJPEG's "
      "allocations");
  CLI11_PARSE(app, argc, argv);

  lamp::data::ImageFolder folder(dir);
  std::vector<File> files;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  for (const auto& sample : folder.samples()) {
    if (static_cast<int64_t>(files.size()) == max_files) {
      break;
    }
    File f;
    f.path = sample.path;
    std::ifstream in(f.path, std::ios::binary);
    f.bytes.assign(
        std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    // Only what nvJPEG decodes (the loader sends the rest to the CPU).
    const auto layout =
        lamp::data::detail::read_jpeg_layout(f.bytes.data(), f.bytes.size());
    if (lamp::data::detail::nvjpeg_supports(layout)) {
      f.crop = lamp::data::random_resized_crop_params(
          layout.height, layout.width, generator);
      files.push_back(std::move(f));
    }
  }
  TORCH_CHECK(
      static_cast<int64_t>(files.size()) >= batch_size,
      "nvjpeg_decoder: ",
      files.size(),
      " JPEGs that nvJPEG decodes in ",
      dir,
      "; need at least a batch");

  // With --pinned every file's bytes are copied into one pinned block and
  // decoded from there.
  torch::Tensor pinned_bytes;
  std::vector<const uint8_t*> file_data;
  for (const auto& f : files) {
    file_data.push_back(f.bytes.data());
  }
  if (pinned) {
    int64_t total = 0;
    for (const auto& f : files) {
      total += static_cast<int64_t>(f.bytes.size());
    }
    pinned_bytes = torch::empty(
        {total},
        torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
    auto* p = pinned_bytes.data_ptr<uint8_t>();
    for (size_t i = 0; i < files.size(); ++i) {
      std::copy(files[i].bytes.begin(), files[i].bytes.end(), p);
      file_data[i] = p;
      p += files[i].bytes.size();
    }
  }
  std::atomic<int64_t> next_batch{-decoders}; // one warm-up batch each
  std::atomic<int64_t> hardware{0};
  std::atomic<int64_t> decoded{0};
  std::vector<double> host_seconds(decoders, 0.0);
  std::vector<double> host_cpu_seconds(decoders, 0.0);
  std::vector<double> cuda_seconds(decoders, 0.0); // in the CUDA backend
  std::vector<int64_t> calls(decoders, 0);
  // Per timed batch: the decode() call's host time, and what nvJPEG
  // allocated (device + pinned) and how long that took, inside it.
  std::vector<double> batch_ms(std::max<int64_t>(batches, 0), 0.0);
  std::vector<int64_t> batch_allocations(batch_ms.size(), 0);
  std::vector<double> batch_allocation_ms(batch_ms.size(), 0.0);
  // The CUDA caching allocator's segments (cudaMalloc calls) on the device
  // so far, after each timed batch: the outputs are allocated there.
  std::vector<int64_t> batch_segments(batch_ms.size(), 0);
  std::vector<lamp::data::detail::NvjpegAllocations> totals(decoders);
  std::atomic<int> ready{0};
  Clock::time_point start;
  auto work = [&](int t) {
    c10::cuda::CUDAGuard guard(0);
    lamp::data::detail::NvjpegDecoder decoder(
        0,
        static_cast<int>(batch_size),
        lamp::data::detail::NvjpegDecoderOptions().hardware(!cuda_backend));
    auto stream = c10::cuda::getStreamFromPool(false, 0);
    for (;;) {
      const int64_t b = next_batch++;
      if (b >= batches) {
        break;
      }
      std::vector<const uint8_t*> data;
      std::vector<size_t> sizes;
      std::vector<std::string> names;
      std::vector<lamp::data::CropBox> crops;
      for (int64_t i = 0; i < batch_size; ++i) {
        const size_t k = ((b + decoders) * batch_size + i) % files.size();
        const auto& f = files[k];
        data.push_back(file_data[k]);
        sizes.push_back(f.bytes.size());
        names.push_back(f.path);
        crops.push_back(f.crop);
      }
      const auto a0 = decoder.allocations();
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      auto images = decoder.decode(
          data, sizes, names, stream.stream(), nullptr, roi ? &crops : nullptr);
      if (b >= 0) {
        const auto a1 = decoder.allocations();
        batch_ms[b] = since(t0) * 1e3;
        batch_allocations[b] = a1.device_allocations + a1.pinned_allocations -
            a0.device_allocations - a0.pinned_allocations;
        batch_allocation_ms[b] = (a1.seconds - a0.seconds) * 1e3;
        batch_segments[b] = c10::cuda::CUDACachingAllocator::getDeviceStats(0)
                                .segment[0] // StatType::AGGREGATE
                                .allocated;
        host_seconds[t] += since(t0);
        host_cpu_seconds[t] += thread_cpu_seconds() - c0;
        ++calls[t];
        hardware += decoder.hardware_decoded();
        cuda_seconds[t] += decoder.cuda_seconds();
        decoded += static_cast<int64_t>(images.size());
      } else {
        stream.synchronize();
        if (++ready == decoders) {
          start = Clock::now();
        }
        while (ready < decoders) {
          std::this_thread::yield();
        }
      }
    }
    stream.synchronize();
    totals[t] = decoder.allocations();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < decoders; ++t) {
    threads.emplace_back(work, t);
  }
  for (auto& t : threads) {
    t.join();
  }
  const double s = since(start);
  double host = 0;
  double host_cpu = 0;
  double cuda_host = 0;
  int64_t n = 0;
  for (int t = 0; t < decoders; ++t) {
    cuda_host += cuda_seconds[t];
    host += host_seconds[t];
    host_cpu += host_cpu_seconds[t];
    n += calls[t];
  }
  double bytes = 0;
  double pixels = 0;
  for (const auto& f : files) {
    const auto layout =
        lamp::data::detail::read_jpeg_layout(f.bytes.data(), f.bytes.size());
    bytes += static_cast<double>(f.bytes.size());
    pixels += static_cast<double>(layout.width) * layout.height;
  }
  lamp::data::detail::NvjpegAllocations all;
  for (const auto& a : totals) {
    all.device_allocations += a.device_allocations;
    all.device_frees += a.device_frees;
    all.device_bytes += a.device_bytes;
    all.pinned_allocations += a.pinned_allocations;
    all.pinned_frees += a.pinned_frees;
    all.pinned_bytes += a.pinned_bytes;
    all.seconds += a.seconds;
  }
  std::printf(
      "{\"impl\": \"lamp NvjpegDecoder\", \"decoders\": %d, \"backend\": "
      "\"%s\", \"batch_size\": %lld, \"images_per_s\": %.1f, "
      "\"roi\": %s, \"pinned\": %s, \"hardware_share\": %.3f, "
      "\"host_ms_per_batch\": %.2f, \"host_cpu_ms_per_batch\": %.2f, "
      "\"cuda_backend_ms_per_batch\": %.2f, \"files\": %zu, \"mean_kpx\": %.0f, \"mean_kb\": %.1f, "
      "\"nvjpeg_allocations\": {\"device\": %lld, \"device_frees\": %lld, "
      "\"device_mib\": %.1f, \"pinned\": %lld, \"pinned_frees\": %lld, "
      "\"pinned_mib\": %.1f, \"ms\": %.1f}}\n",
      decoders,
      cuda_backend ? "cuda" : "hardware+cuda",
      static_cast<long long>(batch_size),
      static_cast<double>(decoded) / s,
      roi ? "true" : "false",
      pinned ? "true" : "false",
      static_cast<double>(hardware) / std::max<int64_t>(1, decoded),
      n > 0 ? host / static_cast<double>(n) * 1e3 : 0.0,
      n > 0 ? host_cpu / static_cast<double>(n) * 1e3 : 0.0,
      n > 0 ? cuda_host / static_cast<double>(n) * 1e3 : 0.0,
      files.size(),
      pixels / static_cast<double>(files.size()) / 1e3,
      bytes / static_cast<double>(files.size()) / 1e3,
      static_cast<long long>(all.device_allocations),
      static_cast<long long>(all.device_frees),
      static_cast<double>(all.device_bytes) / (1 << 20),
      static_cast<long long>(all.pinned_allocations),
      static_cast<long long>(all.pinned_frees),
      static_cast<double>(all.pinned_bytes) / (1 << 20),
      all.seconds * 1e3);
  if (per_pass) {
    // Timed batch b decodes files from ((b + decoders) * batch_size) on.
    const auto per =
        static_cast<double>(files.size()) / static_cast<double>(batch_size);
    std::map<int64_t, std::vector<int64_t>> passes;
    for (int64_t b = 0; b < batches; ++b) {
      passes[static_cast<int64_t>(static_cast<double>(b + decoders) / per)]
          .push_back(b);
    }
    for (const auto& [pass, ids] : passes) {
      double ms = 0;
      double alloc_ms = 0;
      int64_t allocations = 0;
      int64_t segments = 0;
      for (const int64_t b : ids) {
        segments = std::max(segments, batch_segments[b]);
        ms += batch_ms[b];
        alloc_ms += batch_allocation_ms[b];
        allocations += batch_allocations[b];
      }
      std::printf(
          "{\"pass\": %lld, \"batches\": %zu, \"host_ms_per_batch\": %.2f, "
          "\"allocations\": %lld, \"allocation_ms\": %.1f, "
          "\"cuda_segments_so_far\": %lld}\n",
          static_cast<long long>(pass),
          ids.size(),
          ms / static_cast<double>(ids.size()),
          static_cast<long long>(allocations),
          alloc_ms,
          static_cast<long long>(segments));
    }
  }
  return 0;
}
