// Times lamp::nn::add_layer_norm alone, forward and forward + backward, at
// the shapes of GPT-2's blocks: x (rows, C) fp32 (the residual stream), the
// residual branch bf16 (a GEMM's output under autocast), y in bf16. Prints
// one JSON line a shape: the GPU time of one call (median of `--repeats`,
// each the mean of `--steps` calls replayed from a CUDA graph, so no
// launch overhead is timed) and the bytes a call must move at the least
// over that time. benchmarks/add_layer_norm.py is the Python twin (`s = x +
// r; y = F.layer_norm(s, ...)`, eager and under torch.compile).
//
//   add_layer_norm [--device cuda] [--columns 768,1024,1280,1600]
//                  [--rows 16384] [--steps 100] [--repeats 7]
//                  [--residual-bias]   (bias_add_layer_norm: bf16 r_bias)
//
// Bytes (a row element): forward reads x (4) and r (2), writes the sum (4)
// and y (2); backward reads the sum (4), y's gradient (2) and the sum's
// own gradient (4), writes x's gradient (4) and r's (2).

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common.h"

namespace {

struct Options {
  std::string device = "cuda";
  std::vector<int64_t> columns{768, 1024, 1280, 1600};
  int64_t rows = 16 * 1024;
  int64_t steps = 100;
  int64_t repeats = 7;
  bool residual_bias = false;
};

// Median over `repeats` of the mean ms of one `call`, `steps` calls a
// repeat. On CUDA the calls are captured once into a graph and replayed.
double time_ms(
    const Options& opt,
    const torch::Device& device,
    const std::function<void()>& call) {
  std::function<void()> run = [&] {
    for (int64_t i = 0; i < opt.steps; ++i) {
      call();
    }
  };
#if LAMP_WITH_CUDA
  std::optional<at::cuda::CUDAGraph> graph;
  if (device.is_cuda()) {
    // NOTE: capture on a side stream (a capture may not use the default
    // stream), after warm-up calls there that leave the allocator's blocks
    // in place; thread-local capture mode, as lamp::GraphedStep's (backward
    // runs on autograd's device thread).
    const auto main = c10::cuda::getCurrentCUDAStream();
    const auto side = c10::cuda::getStreamFromPool();
    at::cuda::CUDAEvent ready;
    ready.record(main);
    ready.block(side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      for (int i = 0; i < 3; ++i) {
        call();
      }
      graph.emplace();
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      run();
      graph->capture_end();
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(main);
    run = [&] { graph->replay(); };
  }
#endif
  run();
  return examples::median_ms(device, opt.repeats, opt.steps, run);
}

void run_shape(const Options& opt, const torch::Device& device, int64_t c) {
  torch::manual_seed(0);
  const auto f32 = torch::TensorOptions().device(device);
  const auto bf16 = f32.dtype(torch::kBFloat16);
  const auto x = torch::randn({opt.rows, c}, f32).requires_grad_();
  const auto r = torch::randn({opt.rows, c}, bf16).requires_grad_();
  const auto r_bias = torch::randn({c}, bf16).requires_grad_();
  const auto w = (1 + 0.1 * torch::randn({c}, f32)).requires_grad_();
  const auto b = (0.1 * torch::randn({c}, f32)).requires_grad_();
  const auto dsum = torch::randn({opt.rows, c}, f32);
  const auto dy = torch::randn({opt.rows, c}, bf16);
  std::vector<torch::Tensor> inputs{x, r, w, b};
  if (opt.residual_bias) {
    inputs.push_back(r_bias);
  }
  auto forward = [&] {
    lamp::AutocastGuard autocast(device.type(), torch::kBFloat16);
    return opt.residual_bias ? lamp::nn::bias_add_layer_norm(x, r, r_bias, w, b)
                             : lamp::nn::add_layer_norm(x, r, w, b);
  };
  const double fwd = time_ms(opt, device, [&] {
    torch::NoGradGuard no_grad;
    (void)forward();
  });
  const double fwd_bwd = time_ms(opt, device, [&] {
    auto [sum, y] = forward();
    (void)torch::autograd::grad({sum, y}, inputs, {dsum, dy});
  });
  const double n = double(opt.rows) * double(c);
  const double fwd_gb = 12 * n / 1e9, bwd_gb = 16 * n / 1e9;
  // The backward as the difference of two timings: where noise makes it
  // nothing (tiny CPU runs), null rather than a negative time.
  const double bwd = fwd_bwd - fwd;
  char backward[64] = "null, \"backward_tb_s\": null";
  if (bwd > 0) {
    std::snprintf(
        backward,
        sizeof backward,
        "%.4f, \"backward_tb_s\": %.3f",
        bwd,
        bwd_gb / bwd);
  }
  std::printf(
      "{\"impl\": \"lamp\", \"op\": \"%s\", \"device\": \"%s\", \"rows\": "
      "%lld, \"columns\": %lld, \"forward_ms\": %.4f, \"forward_tb_s\": %.3f, "
      "\"forward_backward_ms\": %.4f, \"backward_ms\": %s}\n",
      opt.residual_bias ? "bias_add_layer_norm" : "add_layer_norm",
      device.str().c_str(),
      static_cast<long long>(opt.rows),
      static_cast<long long>(c),
      fwd,
      fwd_gb / fwd, // GB / ms = TB / s
      fwd_bwd,
      backward);
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "lamp::nn::add_layer_norm alone at GPT-2's shapes: GPU time a call "
      "and the bytes it moves over it"};
  app.add_option("--device", opt.device, "cuda or cpu");
  app.add_option("--columns", opt.columns, "row widths C (GPT-2: 768 ... 1600)")
      ->delimiter(',');
  app.add_option("--rows", opt.rows, "rows (batch x sequence length)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", opt.steps, "calls a timed repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", opt.repeats, "timed repeats (median)")
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--residual-bias",
      opt.residual_bias,
      "bias_add_layer_norm with a bf16 bias on the residual");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto device = examples::pick_device(opt.device);
    if (!device) {
      std::cerr << "add_layer_norm: --device cuda but no CUDA device is "
                   "available\n";
      return examples::no_gpu_status();
    }
    for (const auto c : opt.columns) {
      run_shape(opt, *device, c);
    }
  } catch (const std::exception& e) {
    return examples::report_failure("add_layer_norm", e);
  }
  return 0;
}
