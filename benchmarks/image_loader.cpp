// Images/s of lamp::data::ImageLoader alone (no model): the training
// transform (RandomResizedCrop(224) + flip + ImageNet normalisation) of an
// ImageFolder, delivered as fp16 channels-last batches on the GPU (or fp32
// on the CPU), with CPU (libjpeg-turbo) or GPU (nvJPEG) decode.
// benchmarks/image_loader.py times torchvision's ImageFolder + DataLoader on
// the same folder; benchmarks/make_jpegs.py writes one.
//
//   image_loader --data DIR [--device cuda] [--gpu-decode] [--threads 16]
//                [--batch-size 256] [--batches 200]
//
// Prints one JSON line: images/s over the timed batches, and the process's
// CPU time per image (cores busy per 1,000 images/s).

#include <lamp/data.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

} // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::string device = "cuda";
  bool gpu_decode = false;
  int64_t threads = 16;
  int64_t batch_size = 256;
  int64_t batches = 200;
  int64_t warmup = 10;
  CLI::App app{"lamp::data::ImageLoader throughput"};
  app.add_option("--data", dir, "an ImageFolder root")->required();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  app.add_flag("--gpu-decode", gpu_decode, "nvJPEG decode");
  app.add_option("--threads", threads, "decode threads")->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str();
  app.add_option("--batches", batches, "timed batches")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed batches")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const torch::Device dev(device);
  lamp::data::ImageFolder folder(dir);
  lamp::data::ImageLoader loader(
      folder,
      lamp::data::ImageLoaderOptions()
          .batch_size(batch_size)
          .device(dev)
          .dtype(dev.is_cuda() ? torch::kHalf : torch::kFloat)
          .channels_last(true)
          .num_threads(threads)
          .prefetch(3)
          .gpu_decode(gpu_decode)
          .drop_last(true));
  int64_t epoch = 0;
  loader.set_epoch(epoch);
  auto next = [&] {
    auto batch = loader.next();
    if (!batch) {
      loader.set_epoch(++epoch);
      batch = loader.next();
    }
    return batch->images;
  };
  for (int64_t i = 0; i < warmup; ++i) {
    next();
  }
  if (dev.is_cuda()) {
    torch::cuda::synchronize();
  }
  const double cpu0 = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor last;
  for (int64_t i = 0; i < batches; ++i) {
    last = next();
  }
  if (dev.is_cuda()) {
    torch::cuda::synchronize();
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const double images = static_cast<double>(batches * batch_size);
  const double cpu = cpu_seconds() - cpu0;
  std::printf(
      "{\"impl\": \"lamp\", \"decode\": \"%s\", \"threads\": %lld, "
      "\"batch_size\": %lld, \"images_per_s\": %.1f, "
      "\"cores_per_1000_images_per_s\": %.2f, \"checksum\": %.4f}\n",
      gpu_decode ? "gpu" : "cpu",
      static_cast<long long>(threads),
      static_cast<long long>(batch_size),
      images / s,
      cpu / s / (images / s / 1000.0),
      last.to(torch::kFloat).mean().item<double>());
  return 0;
}
