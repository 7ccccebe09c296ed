// Images/s of lamp::data::ImageLoader alone (no model): the training
// transform (RandomResizedCrop(224) + flip + ImageNet normalisation) of an
// ImageFolder, delivered as fp16 channels-last batches on the GPU (or fp32
// on the CPU), with CPU (libjpeg-turbo), GPU (nvJPEG) or both at once.
// benchmarks/image_loader.py times torchvision's ImageFolder + DataLoader on
// the same folder; benchmarks/make_jpegs.py writes one.
//
//   image_loader --data DIR [--device cuda] [--decode cpu|gpu|auto]
//                [--no-partial-decode] [--threads 16] [--stage-threads 2]
//                [--decode-nice 5] [--dct-downscale] [--gpu-resize]
//                [--batch-size 256]
//                [--batches 200]
//
// Prints one JSON line: images/s over the timed batches, the process's CPU
// time per image (cores busy per 1,000 images/s), the share of the images
// the GPU decoded and the loader's peak GPU memory.

#include <lamp/data.h>

#include <CLI/CLI.hpp>
#include <lamp/config.h>
#include <torch/torch.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

// CPU seconds of each of this process's threads, summed by thread name
// (the loader's are lamp-decode and lamp-stageN; nvJPEG's and CUDA's keep
// theirs): which threads the cores per image go to.
std::map<std::string, double> thread_cpu_seconds() {
  std::map<std::string, double> out;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) {
    return out;
  }
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') {
      continue;
    }
    std::ifstream stat(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    // pid (comm) state ... : utime and stime are fields 14 and 15, counted
    // from after the name's closing parenthesis (a name may hold spaces).
    const auto open = line.find('(');
    const auto close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) {
      continue;
    }
    std::string name = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i >= 14) {
        ticks += std::stod(field);
      }
    }
    while (!name.empty() &&
           std::isdigit(static_cast<unsigned char>(name.back()))) {
      name.pop_back(); // lamp-stage0, lamp-stage1 -> lamp-stage
    }
    out[name] += ticks / tick;
  }
  closedir(dir);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::string device = "cuda";
  std::string decode = "auto";
  bool whole = false;
  bool dct_downscale = false;
  bool gpu_resize = false;
  int64_t threads = 16;
  int64_t stage_threads = lamp::data::ImageLoaderOptions().stage_threads();
  int decode_nice = lamp::data::ImageLoaderOptions().decode_nice();
  int64_t prefetch = lamp::data::ImageLoaderOptions().prefetch();
  int64_t batch_size = 256;
  int64_t batches = 200;
  int64_t warmup = 10;
  CLI::App app{"lamp::data::ImageLoader throughput"};
  app.add_option("--data", dir, "an ImageFolder root")->required();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  app.add_option("--decode", decode, "cpu, gpu (nvJPEG) or auto (both)")
      ->check(CLI::IsMember({"cpu", "gpu", "auto"}))
      ->capture_default_str();
  app.add_flag_callback(
      "--gpu-decode", [&] { decode = "gpu"; }, "the same as --decode gpu");
  app.add_flag(
      "--no-partial-decode", whole, "decode whole JPEGs, not just the crop");
  app.add_flag(
      "--dct-downscale",
      dct_downscale,
      "decode JPEGs whose crop is >= 2x the output reduced (Pillow's draft)");
  app.add_flag(
      "--gpu-resize",
      gpu_resize,
      "the GPU resizes the decode threads' JPEG crops (gpu_resize)");
  app.add_option("--threads", threads, "decode threads")->capture_default_str();
  app.add_option("--decode-nice", decode_nice, "decode threads' nice offset")
      ->capture_default_str();
  app.add_option("--stage-threads", stage_threads, "stage threads (lanes)")
      ->capture_default_str();
  app.add_option("--prefetch", prefetch, "batches prepared ahead")
      ->capture_default_str();
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
          .stage_threads(stage_threads)
          .decode_nice(decode_nice)
          .prefetch(prefetch)
          .decode(
              decode == "cpu"       ? lamp::data::ImageDecode::kCpu
                  : decode == "gpu" ? lamp::data::ImageDecode::kGpu
                                    : lamp::data::ImageDecode::kAuto)
          .partial_decode(!whole)
          .dct_downscale(dct_downscale)
          .gpu_resize(gpu_resize)
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
  const int64_t gpu0 = loader.gpu_decoded_images();
  const int64_t cpu_images0 = loader.cpu_decoded_images();
  const double cpu0 = cpu_seconds();
  const auto threads0 = thread_cpu_seconds();
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
  std::string by_thread;
  for (const auto& [name, seconds] : thread_cpu_seconds()) {
    const auto before = threads0.find(name);
    const double busy =
        (seconds - (before == threads0.end() ? 0.0 : before->second)) / s;
    if (busy >= 0.01) {
      char item[128];
      std::snprintf(
          item,
          sizeof(item),
          "%s\"%s\": %.2f",
          by_thread.empty() ? "" : ", ",
          name.c_str(),
          busy);
      by_thread += item;
    }
  }
  const double gpu_images =
      static_cast<double>(loader.gpu_decoded_images() - gpu0);
  const double cpu_images =
      static_cast<double>(loader.cpu_decoded_images() - cpu_images0);
  double peak_gib = 0;
#if LAMP_WITH_CUDA
  if (dev.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        c10::cuda::current_device());
    peak_gib = static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 30);
  }
#endif
  std::printf(
      "{\"impl\": \"lamp\", \"decode\": \"%s\", \"partial_decode\": %s, \"dct_downscale\": %s, \"gpu_resize\": %s, "
      "\"threads\": %lld, \"stage_threads\": %lld, \"decode_nice\": %d, \"prefetch\": %lld, \"batch_size\": %lld, \"images_per_s\": %.1f, "
      "\"cores_per_1000_images_per_s\": %.2f, \"gpu_decoded_share\": %.3f, "
      "\"peak_gpu_gib\": %.3f, \"cores_by_thread\": {%s}, \"checksum\": %.4f}\n",
      decode.c_str(),
      whole ? "false" : "true",
      dct_downscale ? "true" : "false",
      gpu_resize && dev.is_cuda() ? "true" : "false",
      static_cast<long long>(threads),
      static_cast<long long>(stage_threads),
      decode_nice,
      static_cast<long long>(prefetch),
      static_cast<long long>(batch_size),
      images / s,
      cpu / s / (images / s / 1000.0),
      gpu_images / std::max(1.0, gpu_images + cpu_images),
      peak_gib,
      by_thread.c_str(),
      last.to(torch::kFloat).mean().item<double>());
  return 0;
}
