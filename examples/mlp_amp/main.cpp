// Trains an MLP 784-512-10 under lamp::AutocastGuard.
//
// The data are synthetic but learnable: 784-dim Gaussian inputs labelled by a
// fixed random linear "teacher", so the loss falls and the held-out accuracy
// says whether training worked. Runs on CUDA when there is a device, else on
// the CPU with small defaults.
//
//   mlp_amp --precision bf16 --steps 300
//   mlp_amp --device cuda --precision fp16 --batch-size 64

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr int kSkip = 77; // CTest's SKIP_RETURN_CODE: the device is missing.

struct Options {
  std::string device = "auto";
  std::string precision = "bf16";
  int64_t batch_size = 64;
  int64_t steps = 300;
  double lr = 1e-3;
  int64_t seed = 0;
  int64_t log_every = 50;
  double min_accuracy = 0.0;
};

// A batch of the synthetic task: labels are argmax(x @ teacher).
std::pair<torch::Tensor, torch::Tensor> batch(
    const torch::Tensor& teacher,
    int64_t size) {
  auto x = torch::randn({size, 784}, teacher.options());
  auto y = torch::matmul(x, teacher).argmax(1);
  return {x, y};
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Train an MLP 784-512-10 with automatic mixed precision (lamp)"};
  app.add_option("--device", opt.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--precision", opt.precision, "fp32, fp16 or bf16 autocast")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--batch-size", opt.batch_size, "samples per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", opt.steps, "training steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", opt.lr, "Adam learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", opt.seed, "random seed")->capture_default_str();
  app.add_option("--log-every", opt.log_every, "steps between progress lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--min-accuracy",
         opt.min_accuracy,
         "exit with status 1 if the held-out accuracy ends below this")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const bool have_cuda = torch::cuda::is_available();
  if (opt.device == "cuda" && !have_cuda) {
    std::cerr << "mlp_amp: --device cuda but no CUDA device is available\n";
    return kSkip;
  }
  const torch::Device device(
      opt.device == "cpu" || (opt.device == "auto" && !have_cuda)
          ? torch::kCPU
          : torch::kCUDA);
  const std::map<std::string, c10::ScalarType> dtypes = {
      {"fp16", torch::kHalf}, {"bf16", torch::kBFloat16}};
  const bool amp = opt.precision != "fp32";
  const std::optional<c10::ScalarType> amp_dtype =
      amp ? std::optional(dtypes.at(opt.precision)) : std::nullopt;

  std::cout << lamp::build_info() << "\n"
            << "mlp_amp: MLP 784-512-10 on " << device << ", " << opt.precision
            << (amp ? " autocast" : "") << ", batch " << opt.batch_size << ", "
            << opt.steps << " steps, Adam lr " << opt.lr << "\n";
  if (opt.precision == "fp16") {
    std::cout << "mlp_amp: note: fp16 without loss scaling; fine for this "
                 "model, use bf16 or a grad scaler for deep ones\n";
  }

  torch::manual_seed(opt.seed);
  auto teacher = torch::randn({784, 10}, torch::TensorOptions(device));
  torch::nn::Sequential model(
      torch::nn::Linear(784, 512),
      torch::nn::ReLU(),
      torch::nn::Linear(512, 10));
  model->to(device);
  torch::optim::Adam optimizer(
      model->parameters(), torch::optim::AdamOptions(opt.lr));

  auto step = [&](const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(device.type(), amp_dtype, amp);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    return loss;
  };

  std::vector<double> step_ms;
  double first_loss = NAN, last_loss = NAN;
  for (int64_t i = 1; i <= opt.steps; ++i) {
    auto [x, y] = batch(teacher, opt.batch_size);
    const auto start = std::chrono::steady_clock::now();
    auto loss = step(x, y);
    if (device.is_cuda()) {
      torch::cuda::synchronize();
    }
    const auto stop = std::chrono::steady_clock::now();
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(stop - start).count());
    if (i == 1 || i % opt.log_every == 0 || i == opt.steps) {
      last_loss = loss.item<double>();
      if (i == 1) {
        first_loss = last_loss;
      }
      std::printf(
          "step %5lld  loss %.4f  %.3f ms/step  %.0f samples/s\n",
          static_cast<long long>(i),
          last_loss,
          step_ms.back(),
          opt.batch_size * 1000.0 / step_ms.back());
    }
  }

  torch::NoGradGuard no_grad;
  auto [x, y] = batch(teacher, 4096);
  torch::Tensor logits;
  {
    lamp::AutocastGuard autocast(device.type(), amp_dtype, amp);
    logits = model->forward(x);
  }
  const double accuracy =
      logits.argmax(1).eq(y).to(torch::kFloat).mean().item<double>();
  std::nth_element(
      step_ms.begin(), step_ms.begin() + step_ms.size() / 2, step_ms.end());
  std::printf(
      "mlp_amp: loss %.4f -> %.4f, held-out accuracy %.3f, median step %.3f ms\n",
      first_loss,
      last_loss,
      accuracy,
      step_ms[step_ms.size() / 2]);
  if (!std::isfinite(last_loss) || accuracy < opt.min_accuracy) {
    std::fprintf(
        stderr,
        "mlp_amp: FAILED: accuracy %.3f below --min-accuracy %.3f or loss not "
        "finite\n",
        accuracy,
        opt.min_accuracy);
    return 1;
  }
  return 0;
}
