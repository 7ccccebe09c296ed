// lamp's fused optimizers: Python's fused=True bitwise on the CPU (Adam,
// AdamW, SGD with their options, two param groups with their own learning
// rates), LibTorch's optimizers within rounding, and save/load.

#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace optim_test {

namespace {

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const std::vector<torch::Tensor>&)>;

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(0);
  return {
      torch::randn({8, 4}),
      torch::randn({4}),
      torch::randn({3, 8}),
      torch::randn({3})};
}

// Two groups: the first two tensors at the default lr, the rest at 0.05.
template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> two_groups(
    const std::vector<torch::Tensor>& p,
    Options defaults) {
  auto second = std::make_unique<Options>(defaults);
  second->lr(0.05);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p[0], p[1]});
  groups.emplace_back(
      std::vector<torch::Tensor>{p[2], p[3]}, std::move(second));
  return std::make_unique<Optimizer>(groups, defaults);
}

struct Scenario {
  std::string name;
  Factory fused; // lamp
  Factory libtorch; // torch::optim, the same options
};

std::vector<Scenario> scenarios() {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  namespace lo = lamp::optim;
  namespace to = torch::optim;
  auto adam_amsgrad_wd = AdamOptions(0.01)
                             .betas({0.8, 0.99})
                             .eps(1e-6)
                             .weight_decay(0.1)
                             .amsgrad(true);
  auto adamw_amsgrad = AdamWOptions(0.01).weight_decay(0.05).amsgrad(true);
  auto sgd_momentum_wd =
      SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01);
  auto sgd_nesterov = SGDOptions(0.1).momentum(0.9).nesterov(true);
  auto pair = [](auto options, auto* fused, auto* plain) {
    using F = std::remove_pointer_t<decltype(fused)>;
    using P = std::remove_pointer_t<decltype(plain)>;
    return std::make_pair(
        Factory([options](const std::vector<torch::Tensor>& p) {
          return two_groups<F>(p, options);
        }),
        Factory([options](const std::vector<torch::Tensor>& p) {
          return two_groups<P>(p, options);
        }));
  };
  std::vector<Scenario> out;
  auto add = [&](const std::string& name, auto factories) {
    out.push_back({name, factories.first, factories.second});
  };
  add("adam",
      pair(AdamOptions(0.01), (lo::FusedAdam*)nullptr, (to::Adam*)nullptr));
  add("adam_amsgrad_wd",
      pair(adam_amsgrad_wd, (lo::FusedAdam*)nullptr, (to::Adam*)nullptr));
  add("adamw",
      pair(AdamWOptions(0.01), (lo::FusedAdamW*)nullptr, (to::AdamW*)nullptr));
  add("adamw_amsgrad",
      pair(adamw_amsgrad, (lo::FusedAdamW*)nullptr, (to::AdamW*)nullptr));
  add("sgd", pair(SGDOptions(0.1), (lo::FusedSGD*)nullptr, (to::SGD*)nullptr));
  add("sgd_momentum_wd",
      pair(sgd_momentum_wd, (lo::FusedSGD*)nullptr, (to::SGD*)nullptr));
  add("sgd_nesterov",
      pair(sgd_nesterov, (lo::FusedSGD*)nullptr, (to::SGD*)nullptr));
  return out;
}

// `steps` steps on gradients drawn from the generator after make_params(),
// as the oracle draws them. `from` > 0 continues an existing run.
void run(
    torch::optim::Optimizer& optimizer,
    std::vector<torch::Tensor>& params,
    int64_t steps) {
  for (int64_t i = 0; i < steps; ++i) {
    for (auto& p : params) {
      p.mutable_grad() = torch::randn_like(p);
    }
    optimizer.step();
  }
}

std::string bits(const std::vector<torch::Tensor>& params) {
  std::ostringstream out;
  for (size_t i = 0; i < params.size(); ++i) {
    out << "param " << i;
    const auto flat =
        params[i].detach().contiguous().view(torch::kInt32).flatten();
    for (int64_t k = 0; k < flat.numel(); ++k) {
      char hex[16];
      std::snprintf(
          hex,
          sizeof hex,
          " %08x",
          static_cast<uint32_t>(flat[k].item<int32_t>()));
      out << hex;
    }
    out << "\n";
  }
  return out.str();
}

constexpr int64_t kSteps = 25;

TEST(Optim, FusedOptimizersMatchPythonsFusedBitwise) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  std::string names;
  std::string ours;
  for (const auto& s : scenarios()) {
    auto params = make_params();
    for (auto& p : params) {
      p.requires_grad_(true);
    }
    auto optimizer = s.fused(params);
    run(*optimizer, params, kSteps);
    names += " " + s.name;
    ours += "scenario " + s.name + "\n" + bits(params);
  }
  // NOTE: one Python process for all scenarios (each start costs seconds).
  EXPECT_EQ(
      ours,
      lamp::test::run_python_oracle(
          "optim/optim_oracle.py", std::to_string(kSteps) + names));
}

// LibTorch's optimizers do the same math in another order of operations:
// equal within float32 rounding over the run.
TEST(Optim, FusedOptimizersAgreeWithLibTorchs) {
  for (const auto& s : scenarios()) {
    auto a = make_params();
    auto b = make_params();
    for (auto* list : {&a, &b}) {
      for (auto& p : *list) {
        p.requires_grad_(true);
      }
    }
    auto fused = s.fused(a);
    auto plain = s.libtorch(b);
    torch::manual_seed(1);
    run(*fused, a, kSteps);
    torch::manual_seed(1);
    run(*plain, b, kSteps);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6))
          << s.name << " param " << i << " max diff "
          << (a[i] - b[i]).abs().max().item<double>();
    }
  }
}

// torch::save of the optimizer mid-run, torch::load into a new one on a
// copy of the parameters: the continuation equals the uninterrupted run.
TEST(Optim, SaveLoadMidRunContinuesIdentically) {
  for (const auto& s : scenarios()) {
    auto whole = make_params();
    auto split = make_params();
    for (auto* list : {&whole, &split}) {
      for (auto& p : *list) {
        p.requires_grad_(true);
      }
    }
    auto uninterrupted = s.fused(whole);
    torch::manual_seed(2);
    run(*uninterrupted, whole, 2 * kSteps);

    auto first = s.fused(split);
    torch::manual_seed(2);
    run(*first, split, kSteps);
    std::stringstream archive;
    torch::save(*first, archive);
    auto resumed_params = split;
    for (auto& p : resumed_params) {
      p = p.detach().clone().requires_grad_(true);
    }
    auto second = s.fused(resumed_params);
    torch::load(*second, archive);
    run(*second, resumed_params, kSteps);
    EXPECT_EQ(bits(resumed_params), bits(whole)) << s.name;
  }
}

TEST(Optim, BadOptionsAreClearErrors) {
  auto params = make_params();
  using lamp::test::expect_error;
  expect_error(
      [&] { lamp::optim::FusedAdam(params, torch::optim::AdamOptions(-1)); },
      "Invalid learning rate: -1");
  expect_error(
      [&] {
        lamp::optim::FusedAdam(
            params, torch::optim::AdamOptions(0.1).betas({1.0, 0.9}));
      },
      "Invalid beta parameter at index 0: 1");
  expect_error(
      [&] {
        lamp::optim::FusedSGD(
            params, torch::optim::SGDOptions(0.1).nesterov(true));
      },
      "Nesterov momentum requires a momentum and zero dampening");
  auto ints = std::vector<torch::Tensor>{torch::zeros({2}, torch::kLong)};
  ints[0].mutable_grad() = torch::zeros({2}, torch::kLong);
  lamp::optim::FusedAdam adam(ints);
  expect_error(
      [&] { adam.step(); }, "parameters must be floating point on CPU or CUDA");
}

} // namespace

} // namespace optim_test
