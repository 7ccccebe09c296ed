#include <lamp/autocast.h>
#include <lamp/config.h>
#include <lamp/grad_scaler.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace grad_scaler_test {

namespace {

using lamp::test::expect_error;
using torch::optim::Optimizer;

// What tests/grad_scaler_oracle.py prints, and the same run in C++.
struct Run {
  std::vector<double> scales;
  std::vector<int> found_inf;
  std::vector<std::vector<double>> params;
};

const std::map<int, double> kInject = {
    {3, INFINITY},
    {4, INFINITY},
    {5, NAN},
    {40, INFINITY},
    {41, NAN},
    {120, INFINITY},
    {121, INFINITY},
    {122, -INFINITY},
    {199, NAN}};

lamp::GradScalerOptions scaler_options() {
  return lamp::GradScalerOptions()
      .init_scale(1024.0)
      .growth_factor(2.0)
      .backoff_factor(0.5)
      .growth_interval(7);
}

std::vector<torch::Tensor> make_params(torch::Device device) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (auto [shape, k] : std::vector<std::pair<std::vector<int64_t>, double>>{
           {{16, 8}, 0.25}, {{16}, 0.1}, {{4, 16}, 0.25}, {{4}, 0.1}}) {
    params.push_back((torch::randn(shape) * k).to(device).requires_grad_());
  }
  return params;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
      s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::unique_ptr<Optimizer>> make_optimizers(
    std::string scenario,
    const std::vector<torch::Tensor>& params) {
  using namespace torch::optim;
  const bool fused = starts_with(scenario, "fused_");
  if (fused) {
    scenario = scenario.substr(6);
  }
  if (ends_with(scenario, "_unscale")) {
    scenario = scenario.substr(0, scenario.size() - 8);
  }
  std::vector<std::unique_ptr<Optimizer>> out;
  if (scenario == "sgd" || scenario == "sgd_momentum") {
    auto options = SGDOptions(0.05).momentum(scenario == "sgd" ? 0.0 : 0.9);
    if (fused) {
      out.push_back(std::make_unique<lamp::optim::FusedSGD>(params, options));
    } else {
      out.push_back(std::make_unique<SGD>(params, options));
    }
  } else if (scenario == "sgd_two_optimizers") {
    out.push_back(std::make_unique<SGD>(
        std::vector<torch::Tensor>{params[0], params[1]}, SGDOptions(0.05)));
    out.push_back(std::make_unique<SGD>(
        std::vector<torch::Tensor>{params[2], params[3]}, SGDOptions(0.05)));
  } else if (scenario == "adam") {
    if (fused) {
      out.push_back(
          std::make_unique<lamp::optim::FusedAdam>(params, AdamOptions(1e-3)));
    } else {
      out.push_back(std::make_unique<Adam>(params, AdamOptions(1e-3)));
    }
  } else if (scenario == "adamw") {
    if (fused) {
      out.push_back(std::make_unique<lamp::optim::FusedAdamW>(
          params, AdamWOptions(1e-3)));
    } else {
      out.push_back(std::make_unique<AdamW>(params, AdamWOptions(1e-3)));
    }
  }
  EXPECT_FALSE(out.empty()) << "unknown scenario " << scenario;
  return out;
}

// One scripted training step; returns the scaled loss.
void train_step(
    lamp::GradScaler& scaler,
    std::vector<std::unique_ptr<Optimizer>>& optimizers,
    const std::vector<torch::Tensor>& params,
    int step,
    bool unscale,
    torch::Device device) {
  auto x = torch::randn({32, 8}).to(device);
  auto target = torch::randn({32, 4}).to(device);
  for (auto& opt : optimizers) {
    opt->zero_grad();
  }
  auto out = torch::linear(
      torch::relu(torch::linear(x, params[0], params[1])),
      params[2],
      params[3]);
  scaler.scale(torch::mse_loss(out, target)).backward();
  if (kInject.count(step)) {
    params[step % 4].grad().view({-1})[0].fill_(kInject.at(step));
  }
  if (unscale) {
    for (auto& opt : optimizers) {
      scaler.unscale_(*opt);
    }
  }
  for (auto& opt : optimizers) {
    scaler.step(*opt);
  }
  scaler.update();
}

std::vector<std::vector<double>> values(
    const std::vector<torch::Tensor>& params) {
  std::vector<std::vector<double>> out;
  for (const auto& p : params) {
    auto flat = p.detach().cpu().to(torch::kDouble).contiguous().view({-1});
    out.emplace_back(
        flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
  }
  return out;
}

Run run_cpp(const std::string& scenario, torch::Device device, int steps) {
  auto params = make_params(device);
  auto optimizers = make_optimizers(scenario, params);
  lamp::GradScaler scaler(scaler_options());
  Run run;
  for (int i = 0; i < steps; ++i) {
    train_step(
        scaler, optimizers, params, i, ends_with(scenario, "_unscale"), device);
    run.scales.push_back(scaler.get_scale());
    run.found_inf.push_back(
        scaler.get_found_inf_async().item<double>() != 0 ? 1 : 0);
  }
  run.params = values(params);
  return run;
}

Run run_python(const std::string& scenario, const char* device, int steps) {
  Run run;
  const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
      "amp/grad_scaler_oracle.py",
      scenario + " " + device + " " + std::to_string(steps)));
  for (const auto& f : lines) {
    if (f[0] == "step") {
      run.scales.push_back(std::strtod(f[2].c_str(), nullptr));
      run.found_inf.push_back(std::stoi(f[3]));
    } else if (f[0] == "param") {
      run.params.emplace_back();
      for (size_t i = 2; i < f.size(); ++i) {
        run.params.back().push_back(std::strtod(f[i].c_str(), nullptr));
      }
    }
  }
  return run;
}

// rtol 0: bitwise. Otherwise each parameter tensor must agree within rtol
// relative to its largest element (LibTorch's and Python's non-fused Adam
// round differently; over 200 steps single elements near zero drift by a few
// float32 ulps of the tensor's scale).
void expect_same_run(const Run& cpp, const Run& python, double rtol) {
  ASSERT_EQ(cpp.scales.size(), python.scales.size());
  for (size_t i = 0; i < cpp.scales.size(); ++i) {
    EXPECT_EQ(cpp.scales[i], python.scales[i]) << "scale after step " << i;
    EXPECT_EQ(cpp.found_inf[i], python.found_inf[i]) << "skip of step " << i;
  }
  ASSERT_EQ(cpp.params.size(), python.params.size());
  for (size_t k = 0; k < cpp.params.size(); ++k) {
    const auto& a = cpp.params[k];
    const auto& b = python.params[k];
    ASSERT_EQ(a.size(), b.size());
    double max_diff = 0, max_abs = 0;
    size_t worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(b[i]));
      if (std::abs(a[i] - b[i]) > max_diff) {
        max_diff = std::abs(a[i] - b[i]);
        worst = i;
      }
    }
    if (rtol == 0) {
      EXPECT_EQ(max_diff, 0.0) << "param " << k << "[" << worst << "]: C++ "
                               << a[worst] << ", Python " << b[worst];
    } else {
      EXPECT_LE(max_diff, rtol * max_abs)
          << "param " << k << "[" << worst << "]: C++ " << a[worst]
          << ", Python " << b[worst];
    }
  }
}

// --- Differential against torch.amp.GradScaler --------------------------

struct Scenario {
  std::string name;
  double rtol; // 0: bitwise
};

void PrintTo(const Scenario& scenario, std::ostream* os) {
  *os << scenario.name;
}

std::string scenario_name(const testing::TestParamInfo<Scenario>& info) {
  return info.param.name;
}

class GradScalerOracle : public testing::TestWithParam<Scenario> {};

TEST_P(GradScalerOracle, MatchesPythonOnCpu) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto& [name, rtol] = GetParam();
  const auto python = run_python(name, "cpu", 200);
  const auto cpp = run_cpp(name, torch::kCPU, 200);
  // The script overflows at 9 steps, 3 and 3 of them consecutive.
  EXPECT_EQ(std::count(cpp.found_inf.begin(), cpp.found_inf.end(), 1), 9);
  EXPECT_GT(*std::max_element(cpp.scales.begin(), cpp.scales.end()), 1e6)
      << "the scale should have grown many times";
  expect_same_run(cpp, python, rtol);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu,
    GradScalerOracle,
    testing::Values(
        Scenario{"sgd", 0},
        Scenario{"sgd_momentum", 0},
        Scenario{"sgd_two_optimizers", 0},
        Scenario{"sgd_unscale", 0},
        Scenario{"adam", 1e-6},
        Scenario{"adam_unscale", 1e-6},
        Scenario{"adamw", 1e-6},
        Scenario{"fused_sgd", 0},
        Scenario{"fused_sgd_momentum", 0},
        Scenario{"fused_adam", 0},
        Scenario{"fused_adam_unscale", 0},
        Scenario{"fused_adamw", 0}),
    scenario_name);

// --- Behaviour --------------------------------------------------------------

struct Model {
  std::vector<torch::Tensor> params = make_params(torch::kCPU);
  torch::Tensor loss() const {
    auto x = torch::ones({2, 8});
    return torch::linear(
               torch::relu(torch::linear(x, params[0], params[1])),
               params[2],
               params[3])
        .sum();
  }
};

TEST(GradScaler, MisuseRaisesPythonsErrors) {
  Model model;
  torch::optim::SGD sgd(model.params, 0.1);
  lamp::GradScaler scaler;
  const std::string fix =
      "but _scale is None.  This may indicate your script "
      "did not use scaler.scale(loss or outputs) earlier "
      "in the iteration.";
  expect_error([&] { scaler.unscale_(sgd); }, "Attempted unscale_ " + fix);
  expect_error([&] { scaler.step(sgd); }, "Attempted step " + fix);
  expect_error([&] { scaler.update(); }, "Attempted update " + fix);

  scaler.scale(model.loss()).backward();
  expect_error(
      [&] { scaler.update(); }, "No inf checks were recorded prior to update.");
  scaler.unscale_(sgd);
  expect_error(
      [&] { scaler.unscale_(sgd); },
      "unscale_() has already been called on this optimizer since the last "
      "update().");
  scaler.step(sgd);
  expect_error(
      [&] { scaler.unscale_(sgd); },
      "unscale_() is being called after step().");
  expect_error(
      [&] { scaler.step(sgd); },
      "step() has already been called since the last update().");
  scaler.update();

  // After update() the optimizer is READY again.
  sgd.zero_grad();
  scaler.scale(model.loss()).backward();
  scaler.step(sgd);
  scaler.update();

  // An optimizer none of whose parameters has a gradient.
  torch::optim::SGD idle(
      std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())},
      0.1);
  scaler.scale(model.loss());
  expect_error(
      [&] { scaler.step(idle); },
      "No inf checks were recorded for this optimizer.");
}

TEST(GradScaler, RefusesToUnscaleFp16Gradients) {
  auto w = torch::ones({4}, torch::dtype(torch::kHalf).requires_grad(true));
  w.mutable_grad() = torch::ones({4}, torch::kHalf);
  torch::optim::SGD sgd(std::vector<torch::Tensor>{w}, 0.1);
  lamp::GradScaler scaler;
  scaler.scale(torch::ones({}));
  try {
    scaler.unscale_(sgd);
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(
        std::string(e.what()).find("Attempting to unscale FP16 gradients."),
        std::string::npos);
  }
}

TEST(GradScaler, InvalidOptionsAreRejected) {
  using O = lamp::GradScalerOptions;
  expect_error(
      [] { lamp::GradScaler s(O().growth_factor(1.0)); },
      "The growth factor must be > 1.0.");
  expect_error(
      [] { lamp::GradScaler s(O().backoff_factor(1.0)); },
      "The backoff factor must be < 1.0.");
  expect_error(
      [] { lamp::GradScaler s(O().backoff_factor(0.0)); },
      "backoff_factor must be > 0");
  expect_error(
      [] { lamp::GradScaler s(O().growth_interval(0)); },
      "growth_interval must be > 0");
  expect_error(
      [] { lamp::GradScaler s(O().init_scale(-1)); },
      "init_scale must be finite and > 0");
  // As Python: a disabled scaler does not check its options.
  lamp::GradScaler disabled(O().enabled(false).growth_factor(0.5));
  EXPECT_FALSE(disabled.is_enabled());
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Model reference, model;
  torch::optim::SGD ref_sgd(reference.params, 0.1), sgd(model.params, 0.1);
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(false));
  for (int i = 0; i < 3; ++i) {
    ref_sgd.zero_grad();
    reference.loss().backward();
    ref_sgd.step();

    sgd.zero_grad();
    auto loss = model.loss();
    auto scaled = scaler.scale(loss);
    EXPECT_TRUE(scaled.is_same(loss));
    scaled.backward();
    scaler.unscale_(sgd);
    scaler.step(sgd);
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_FALSE(scaler.get_scale_async().defined());
  for (size_t k = 0; k < model.params.size(); ++k) {
    EXPECT_TRUE(torch::equal(model.params[k], reference.params[k]));
  }
  torch::serialize::OutputArchive archive;
  scaler.save(archive); // nothing but the version key
  lamp::GradScaler enabled;
  std::stringstream stream;
  archive.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  expect_error(
      [&] { enabled.load(in); },
      "The source state dict is empty, possibly because it was saved from a "
      "disabled instance of GradScaler.");
}

TEST(GradScaler, ScaleLivesOnTheFirstScaledTensorsDeviceAndIsLazy) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(8.0));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_FALSE(scaler.get_scale_async().defined());
  auto scaled = scaler.scale(std::vector<torch::Tensor>{
      torch::full({2}, 1.0), torch::full({2}, 2.0, torch::kDouble)});
  EXPECT_TRUE(torch::equal(scaled[0], torch::full({2}, 8.0)));
  EXPECT_TRUE(torch::equal(scaled[1], torch::full({2}, 16.0, torch::kDouble)));
  EXPECT_EQ(scaler.get_scale_async().scalar_type(), torch::kFloat);
  EXPECT_EQ(scaler.get_scale_async().dim(), 0);
}

TEST(GradScaler, GradientsOfSeveralDtypesAreUnscaledPerDtype) {
  auto f = torch::ones({3}, torch::requires_grad());
  auto d = torch::ones({3}, torch::dtype(torch::kDouble).requires_grad(true));
  torch::optim::SGD sgd(std::vector<torch::Tensor>{f, d}, 1.0);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(4.0));
  (scaler.scale(f.sum()) + scaler.scale(d.sum())).backward();
  scaler.unscale_(sgd);
  EXPECT_TRUE(torch::equal(f.grad(), torch::ones({3})));
  EXPECT_TRUE(torch::equal(d.grad(), torch::ones({3}, torch::kDouble)));
  scaler.step(sgd);
  scaler.update();
  EXPECT_EQ(scaler.get_found_inf_async().item<double>(), 0.0);

  sgd.zero_grad();
  (scaler.scale(f.sum()) + scaler.scale(d.sum())).backward();
  d.grad()[1] = INFINITY; // only the double group overflows
  const auto before = f.detach().clone();
  scaler.step(sgd);
  scaler.update();
  EXPECT_NE(scaler.get_found_inf_async().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(f, before)) << "a skipped step moved a parameter";
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

TEST(GradScaler, UpdateWithNewScale) {
  Model model;
  torch::optim::SGD sgd(model.params, 0.1);
  lamp::GradScaler scaler;
  scaler.scale(model.loss()).backward();
  scaler.step(sgd);
  scaler.update(3.0);
  EXPECT_EQ(scaler.get_scale(), 3.0);
  // update(new_scale) ends the iteration too.
  sgd.zero_grad();
  scaler.scale(model.loss()).backward();
  scaler.step(sgd);
  scaler.update();
}

TEST(GradScaler, SettersAndGetters) {
  lamp::GradScaler scaler;
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  scaler.set_growth_factor(4.0);
  scaler.set_backoff_factor(0.25);
  scaler.set_growth_interval(10);
  EXPECT_EQ(scaler.get_growth_factor(), 4.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.25);
  EXPECT_EQ(scaler.get_growth_interval(), 10);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

// Save scaler and optimizer at step `split`, load them into fresh objects,
// continue: the result must equal an uninterrupted run bit for bit.
void expect_resume_is_seamless(const std::string& scenario) {
  const int steps = 60, split = 30;
  const auto uninterrupted = run_cpp(scenario, torch::kCPU, steps);

  auto params = make_params(torch::kCPU);
  std::vector<double> scales;
  std::stringstream scaler_file, optimizer_file;
  {
    auto optimizers = make_optimizers(scenario, params);
    lamp::GradScaler scaler(scaler_options());
    for (int i = 0; i < split; ++i) {
      train_step(scaler, optimizers, params, i, false, torch::kCPU);
      scales.push_back(scaler.get_scale());
    }
    torch::save(scaler, scaler_file);
    torch::save(*optimizers[0], optimizer_file);
  }
  auto optimizers = make_optimizers(scenario, params);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1.0));
  torch::load(scaler, scaler_file);
  torch::load(*optimizers[0], optimizer_file);
  EXPECT_EQ(scaler.get_scale(), scales.back());
  EXPECT_EQ(scaler.get_growth_interval(), 7);
  for (int i = split; i < steps; ++i) {
    train_step(scaler, optimizers, params, i, false, torch::kCPU);
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(scales, uninterrupted.scales);
  EXPECT_EQ(values(params), uninterrupted.params);
}

TEST(GradScaler, SaveLoadMidRunContinuesIdentically) {
  // torch::manual_seed in make_params also fixes the data of each step, so
  // the second half sees the same batches if the RNG is advanced alike.
  expect_resume_is_seamless("adam");
  expect_resume_is_seamless("fused_adam");
  expect_resume_is_seamless("fused_sgd_momentum");
}

TEST(GradScaler, StateKeysAreNamedAsPythons) {
  lamp::GradScaler scaler(scaler_options());
  scaler.scale(torch::ones({}));
  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::stringstream stream;
  out.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  const std::vector<std::pair<std::string, c10::IValue>> expected = {
      {"scale", 1024.0},
      {"growth_factor", 2.0},
      {"backoff_factor", 0.5},
      {"growth_interval", int64_t{7}},
      {"_growth_tracker", int64_t{0}},
      {"lamp_version", int64_t{1}}};
  for (const auto& [key, value] : expected) {
    c10::IValue read;
    ASSERT_TRUE(in.try_read(key, read)) << key;
    EXPECT_EQ(read, value) << key;
  }
}

// --- GPU ----------------------------------------------------------------

class GradScalerGpu : public testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    LAMP_SKIP_WITHOUT_CUDA();
  }
};

TEST_P(GradScalerGpu, MatchesPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto& [name, rtol] = GetParam();
  const auto python = run_python(name, "cuda", 200);
  const auto cpp = run_cpp(name, torch::kCUDA, 200);
  EXPECT_EQ(std::count(cpp.found_inf.begin(), cpp.found_inf.end(), 1), 9);
  expect_same_run(cpp, python, rtol);
}

class GradScalerStepGpu : public lamp::test::GpuTest {};

INSTANTIATE_TEST_SUITE_P(
    Cuda,
    GradScalerGpu,
    testing::Values(
        Scenario{"sgd", 1e-6},
        Scenario{"adam", 1e-6},
        Scenario{"fused_sgd_momentum", 1e-6},
        Scenario{"fused_adam", 1e-6},
        Scenario{"fused_adam_unscale", 1e-6},
        Scenario{"fused_adamw", 1e-6}),
    scenario_name);

TEST_F(GradScalerStepGpu, GradientsOnCpuAndCudaAreUnscaledPerDevice) {
  auto on_cuda = torch::ones(
      {3},
      torch::dtype(torch::kFloat).device(torch::kCUDA).requires_grad(true));
  auto on_cpu = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<torch::Tensor>{on_cuda, on_cpu}, 1.0);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(4.0));
  auto losses = scaler.scale({on_cuda.sum(), on_cpu.sum()});
  EXPECT_TRUE(scaler.get_scale_async().is_cuda());
  EXPECT_TRUE(losses[1].is_cpu());
  torch::autograd::backward(losses);
  scaler.unscale_(sgd);
  EXPECT_TRUE(torch::equal(on_cuda.grad().cpu(), torch::ones({3})));
  EXPECT_TRUE(torch::equal(on_cpu.grad(), torch::ones({3})));
  scaler.step(sgd);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);

  sgd.zero_grad();
  torch::autograd::backward(scaler.scale({on_cuda.sum(), on_cpu.sum()}));
  on_cpu.grad()[0] = NAN; // the CPU group overflows, the CUDA one does not
  const auto before = on_cuda.detach().clone();
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(torch::equal(on_cuda, before))
      << "a skipped step moved a parameter";
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_TRUE(scaler.get_found_inf_async().is_cuda());
}

#if LAMP_WITH_CUDA

// A small fp16-autocast model whose whole training step can be replayed.
struct CudaStep {
  torch::nn::Sequential model{
      torch::nn::Linear(64, 128),
      torch::nn::ReLU(),
      torch::nn::Linear(128, 10)};
  torch::Tensor x = torch::randn({32, 64}, torch::kCUDA);
  torch::Tensor y = torch::randint(
      10,
      {32},
      torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  lamp::GradScaler scaler{lamp::GradScalerOptions().growth_interval(3)};
  std::unique_ptr<Optimizer> optimizer;

  explicit CudaStep(bool fused) {
    model->to(torch::kCUDA);
    if (fused) {
      optimizer = std::make_unique<lamp::optim::FusedAdam>(model->parameters());
    } else {
      optimizer = std::make_unique<torch::optim::Adam>(model->parameters());
    }
  }
  void operator()() {
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kHalf, true, false);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*optimizer);
    scaler.update();
  }
};

// Makes every synchronising CUDA call in scope throw.
struct ErrorOnSync {
  ErrorOnSync() {
    c10::cuda::warning_state().set_sync_debug_mode(
        c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~ErrorOnSync() {
    c10::cuda::warning_state().set_sync_debug_mode(
        c10::cuda::SyncDebugMode::L_DISABLED);
  }
};

TEST_F(GradScalerStepGpu, FusedStepNeverSynchronises) {
  CudaStep step(/*fused=*/true);
  step(); // lazy state creation is allowed to allocate
  ErrorOnSync error_on_sync;
  for (int i = 0; i < 5; ++i) {
    EXPECT_NO_THROW(step());
  }
}

TEST_F(GradScalerStepGpu, PlainOptimizerStepSynchronisesOnce) {
  // The check above is only meaningful if sync detection works: a
  // torch::optim optimizer must read found_inf on the host.
  CudaStep step(/*fused=*/false);
  step();
  ErrorOnSync error_on_sync;
  EXPECT_THROW(step(), c10::Error);
}

TEST_F(GradScalerStepGpu, WholeStepCapturedInACudaGraphSkipsOnInf) {
  CudaStep step(/*fused=*/true);
  auto stream = c10::cuda::getStreamFromPool();
  {
    // Warm up on a side stream, as PyTorch's CUDA-graph recipe says.
    c10::cuda::CUDAStreamGuard guard(stream);
    for (int i = 0; i < 3; ++i) {
      step();
    }
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    graph.capture_begin();
    step();
    graph.capture_end();
  }
  auto* state = step.optimizer->state()
                    .at(step.model->parameters()[0].unsafeGetTensorImpl())
                    .get();
  auto step_count = [&] {
    return static_cast<lamp::optim::FusedAdamParamState*>(state)
        ->step()
        .item<float>();
  };
  auto snapshot = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& p : step.model->parameters()) {
      out.push_back(p.detach().clone());
    }
    return out;
  };

  // Clean replays: parameters move, the step counter advances, the scale
  // grows every 3 clean steps.
  graph.replay();
  torch::cuda::synchronize();
  const double scale = step.scaler.get_scale();
  const float count = step_count();
  auto before = snapshot();
  graph.replay();
  torch::cuda::synchronize();
  EXPECT_EQ(step.scaler.get_found_inf_async().item<float>(), 0.0f);
  EXPECT_EQ(step_count(), count + 1);
  EXPECT_FALSE(torch::equal(before[0], step.model->parameters()[0]));

  // Poison the static input: the replayed step must be skipped on the
  // device, the scale halves and nothing moves.
  step.x.fill_(INFINITY);
  const double scale_before_inf = step.scaler.get_scale();
  before = snapshot();
  graph.replay();
  torch::cuda::synchronize();
  EXPECT_EQ(step.scaler.get_found_inf_async().item<float>(), 1.0f);
  EXPECT_EQ(step.scaler.get_scale(), scale_before_inf / 2);
  EXPECT_EQ(step_count(), count + 1);
  const auto params = step.model->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_TRUE(torch::equal(before[k], params[k])) << "parameter " << k;
  }
  EXPECT_GE(scale_before_inf, scale);
}

#else

TEST_F(GradScalerStepGpu, FusedStepNeverSynchronises) {
  GTEST_SKIP() << "lamp was built without CUDA";
}

TEST_F(GradScalerStepGpu, WholeStepCapturedInACudaGraphSkipsOnInf) {
  GTEST_SKIP() << "lamp was built without CUDA";
}

#endif

} // namespace

} // namespace grad_scaler_test
