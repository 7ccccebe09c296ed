// Times lamp's whole-run checkpoint of the ResNet-50 example (model,
// FusedAdam state, GradScaler, RNG states): save_checkpoint (device → CPU
// copies, archive, fsync, rename) and load_checkpoint (read, CRC checks,
// validation, copies into the live tensors). benchmarks/checkpoint_io.py
// does the same with torch.save / torch.load in Python. Also a background
// save (CheckpointManagerOptions::async_save): the pause (save() returns
// once the state is copied to host memory) and the write behind it.
//
//   checkpoint_io [--device cuda] [--dir /tmp] [--repeats 5]
//                 [--load-repeats N] [--no-async]   (N loads: for profiling)

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "resnet50_amp/resnet50.h"

namespace {

double median_ms(int64_t repeats, const std::function<void()>& f) {
  std::vector<double> ms;
  for (int64_t i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda";
  std::string dir = "/tmp";
  int64_t repeats = 5;
  int64_t load_repeats = 0; // 0: repeats
  bool no_async = false;
  CLI::App app{"Time save_checkpoint / load_checkpoint of ResNet-50 + Adam"};
  app.add_option("--device", device_name)
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--dir", dir, "folder for the checkpoint file")
      ->capture_default_str();
  app.add_option("--repeats", repeats)->check(CLI::PositiveNumber);
  app.add_option(
         "--load-repeats", load_repeats, "loads timed (default: --repeats)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-async", no_async, "skip the background save's timing");
  CLI11_PARSE(app, argc, argv);
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "checkpoint_io: no CUDA device\n");
    return 77;
  }
  const torch::Device device(device_name);
  torch::manual_seed(0);
  resnet::ResNet50 model;
  model->to(device);
  lamp::optim::FusedAdam optimizer(model->parameters());
  lamp::GradScaler scaler;
  {
    // One step so that the optimizer has its state.
    auto x = torch::randn({2, 3, 64, 64}, device);
    auto loss = model->forward(x).sum();
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
  }
  int64_t step = 1;
  lamp::TrainingState state;
  state.add("model", *model)
      .add("optimizer", optimizer)
      .add("scaler", scaler)
      .add("step", step);
  const auto path = dir + "/lamp_checkpoint_io.pt";
  const double save =
      median_ms(repeats, [&] { lamp::save_checkpoint(state, path, step); });
  const double load = median_ms(load_repeats > 0 ? load_repeats : repeats, [&] {
    lamp::load_checkpoint(state, path);
    if (device.is_cuda()) {
      torch::cuda::synchronize();
    }
  });
  struct stat st {};
  stat(path.c_str(), &st);
  std::remove(path.c_str());
  const auto async_dir = dir + "/lamp_checkpoint_io_async";
  lamp::CheckpointManager manager(
      async_dir,
      lamp::CheckpointManagerOptions().keep_last(1).async_save(true));
  std::vector<double> pause, behind;
  for (int64_t i = 0; i < (no_async ? 0 : repeats); ++i) {
    auto start = std::chrono::steady_clock::now();
    manager.save(state, step + i);
    pause.push_back(std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
    start = std::chrono::steady_clock::now();
    manager.wait();
    behind.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - start)
                         .count());
  }
  std::sort(pause.begin(), pause.end());
  std::sort(behind.begin(), behind.end());
  for (const auto& [s_, p] : manager.list()) {
    std::remove(p.c_str());
  }
  ::rmdir(async_dir.c_str());
  std::printf("%s\n", lamp::build_info().c_str());
  std::printf(
      "ResNet-50 + FusedAdam + GradScaler on %s: %.1f MiB file, save %.1f "
      "ms, load %.1f ms (median of %lld)\n",
      device.str().c_str(),
      st.st_size / 1048576.0,
      save,
      load,
      static_cast<long long>(repeats));
  if (pause.empty()) {
    return 0;
  }
  std::printf(
      "async_save: save() returns after %.1f ms (the copy to host memory), "
      "the file is written %.1f ms later (medians)\n",
      pause[pause.size() / 2],
      behind[behind.size() / 2]);
  return 0;
}
