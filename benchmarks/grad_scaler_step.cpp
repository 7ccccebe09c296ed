// Times one mixed-precision training step of an MLP 784-512-10 with
// lamp::GradScaler, with torch::optim::Adam (the scaler reads found_inf on
// the host every step) and with lamp::optim::FusedAdam (no host sync).
// benchmarks/grad_scaler_step.py is the same in Python; docs/benchmarks.md
// has the results.
//
// Also with gradient clipping (unscale_ + lamp::clip_grad_norm_) and a cosine
// schedule, the recipe of a real run.
//
//   grad_scaler_step [--batch-size 64] [--steps 200] [--repeats 7]
//                    [--trace FILE]   (Chrome trace of 10 graphed steps)

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"

namespace {

struct Options {
  std::string device = "cuda";
  int64_t batch_size = 64;
  int64_t steps = 200;
  int64_t warmup = 50;
  int64_t repeats = 7;
  std::string trace;
};

// Median over `repeats` of the mean step time of `steps` back-to-back steps.
double time_ms(
    const Options& opt,
    const torch::Device& device,
    const std::function<void()>& step) {
  for (int64_t i = 0; i < opt.warmup; ++i) {
    step();
  }
  return examples::median_ms(device, opt.repeats, opt.steps, [&] {
    for (int64_t i = 0; i < opt.steps; ++i) {
      step();
    }
  });
}

// What a step does besides FusedAdam: unscale_ + clip_grad_norm_ in the
// step, a cosine schedule stepped after it.
constexpr int kClip = 1, kCosine = 2;

enum class Phase { kForward, kForwardBackward, kStep };

// Median ms of `phase` of an AMP step (or of a plain fp32 step when `amp` is
// false, as a floor).
double run(
    const Options& opt,
    const torch::Device& device,
    bool fused,
    Phase phase,
    bool amp = true,
    bool graphed = false,
    int extras = 0) { // kClip | kCosine
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(784, 512),
      torch::nn::ReLU(),
      torch::nn::Linear(512, 10));
  model->to(device);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (fused) {
    optimizer = std::make_unique<lamp::optim::FusedAdam>(model->parameters());
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters());
  }
  const auto amp_dtype = device.is_cuda() ? torch::kHalf : torch::kBFloat16;
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(amp));
  auto x = torch::randn({opt.batch_size, 784}, device);
  auto y = torch::randint(
      10, {opt.batch_size}, torch::TensorOptions(device).dtype(torch::kLong));
  auto step = [&](const torch::Tensor& x, const torch::Tensor& y) {
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(device.type(), amp_dtype, amp);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    if (phase == Phase::kForward) {
      return loss;
    }
    scaler.scale(loss).backward();
    if (phase == Phase::kForwardBackward) {
      return loss;
    }
    if (extras & kClip) {
      scaler.unscale_(*optimizer);
      lamp::clip_grad_norm_(model->parameters(), 1.0);
    }
    scaler.step(*optimizer);
    scaler.update();
    return loss;
  };
  // A cosine schedule stepped after every step (outside the graph).
  std::optional<lamp::optim::CosineAnnealingLR> schedule;
  if (extras & kCosine) {
    schedule.emplace(*optimizer, /*T_max=*/1000);
  }
  auto next_lr = [&] {
    if (schedule) {
      schedule->step();
    }
  };
  if (graphed) {
    // The whole step in one CUDA graph; each step copies the batch into
    // the graph's static inputs, as a training loop would.
    lamp::GraphedStep graph(
        [&](const std::vector<torch::Tensor>& in) {
          return step(in[0], in[1]);
        },
        {x, y},
        {optimizer.get()});
    const double ms = time_ms(opt, device, [&] {
      graph({x, y});
      next_lr();
    });
    if (!opt.trace.empty()) {
      examples::Trace trace(opt.trace);
      trace.start();
      for (int i = 0; i < 10; ++i) {
        graph({x, y});
      }
      examples::synchronize(device);
      trace.stop();
    }
    return ms;
  }
  return time_ms(opt, device, [&] {
    step(x, y);
    next_lr();
  });
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Time a GradScaler AMP step: torch::optim::Adam vs FusedAdam"};
  app.add_option("--device", opt.device, "cuda or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--batch-size", opt.batch_size)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", opt.steps, "timed steps per repeat")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", opt.warmup)->capture_default_str();
  app.add_option("--repeats", opt.repeats)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
      "--trace",
      opt.trace,
      "write a Chrome trace of 10 graphed steps to FILE (CUDA only)");
  CLI11_PARSE(app, argc, argv);
  if (opt.device == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "grad_scaler_step: no CUDA device\n");
    return 77;
  }
  const torch::Device device(opt.device);
  std::printf("%s\n", lamp::build_info().c_str());
  std::printf(
      "MLP 784-512-10, batch %lld, %s autocast + GradScaler, median of %lld "
      "x %lld steps\n",
      static_cast<long long>(opt.batch_size),
      device.is_cuda() ? "fp16" : "bf16",
      static_cast<long long>(opt.repeats),
      static_cast<long long>(opt.steps));
  std::vector<std::pair<const char*, double>> rows = {
      {"C++ torch::optim::Adam", run(opt, device, false, Phase::kStep)},
      {"C++ lamp::optim::FusedAdam", run(opt, device, true, Phase::kStep)},
      {"  of which forward", run(opt, device, true, Phase::kForward)},
      {"  of which forward+backward",
       run(opt, device, true, Phase::kForwardBackward)},
      {"C++ FusedAdam fp32, no AMP",
       run(opt, device, true, Phase::kStep, false)},
  };
  rows.emplace_back(
      "C++ FusedAdam + clip + cosine",
      run(opt, device, true, Phase::kStep, true, false, kClip | kCosine));
  if (device.is_cuda()) {
    rows.emplace_back(
        "C++ FusedAdam, lamp::GraphedStep",
        run(opt, device, true, Phase::kStep, true, true));
    rows.emplace_back(
        "  GraphedStep + clip + cosine",
        run(opt, device, true, Phase::kStep, true, true, kClip | kCosine));
    rows.emplace_back(
        "  GraphedStep + clip",
        run(opt, device, true, Phase::kStep, true, true, kClip));
    rows.emplace_back(
        "  GraphedStep + cosine",
        run(opt, device, true, Phase::kStep, true, true, kCosine));
  }
  std::printf("%-32s %8s\n", "AMP step", "ms/step");
  for (const auto& [name, ms] : rows) {
    std::printf("%-32s %8.3f\n", name, ms);
  }
  return 0;
}
