// One tensor is one parameter: a model whose output layer shares the token
// embedding's weight (GPT-2's tied LM head), registered under two names so
// that LibTorch's parameters() lists it twice, trains as Python trains the
// same model (whose parameters() lists it once) — the fused optimizers step
// it once, GradScaler unscales it once, clipping counts it once, and a
// checkpoint holds it once and loads back tied. Against Python bitwise on
// the CPU (shared_params_oracle.py); GraphedStep on a GPU.

#include <lamp/checkpoint.h>
#include <lamp/clip_grad.h>
#include <lamp/cuda_graph.h>
#include <lamp/grad_scaler.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace shared_params_test {

namespace {

using lamp::test::expect_error_of;
using lamp::test::fresh_dir;
using lamp::test::hex_bits;
using lamp::test::run_python_oracle;
using lamp::test::split_lines;

// A linear layer without bias whose weight is a tensor registered elsewhere
// too: how a C++ GPT ties its LM head to the token embedding.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const torch::Tensor& shared) {
    weight = register_parameter("weight", shared);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, weight);
  }
  torch::Tensor weight;
};
TORCH_MODULE(Head);

// shared_params_oracle.py's Tied, drawn the same way.
struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(torch::Device device = torch::kCPU) {
    wte = register_module("wte", torch::nn::Embedding(10, 4));
    fc = register_module("fc", torch::nn::Linear(4, 4));
    head = register_module("head", Head(wte->weight));
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    wte->weight.copy_(torch::randn({10, 4}));
    fc->weight.copy_(torch::randn({4, 4}));
    fc->bias.copy_(torch::randn({4}));
    to(device);
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    return head->forward(torch::tanh(fc->forward(wte->forward(tokens))));
  }
  torch::nn::Embedding wte{nullptr};
  torch::nn::Linear fc{nullptr};
  Head head{nullptr};
};
TORCH_MODULE(Tied);

torch::Tensor tokens(torch::Device device = torch::kCPU) {
  return torch::tensor({1, 3, 5, 7, 9, 0}, torch::kLong).to(device);
}

torch::Tensor loss_of(Tied& model, torch::Device device = torch::kCPU) {
  const auto targets = torch::tensor({2, 4, 6, 8, 0, 1}, torch::kLong);
  return torch::cross_entropy_loss(
      model->forward(tokens(device)), targets.to(device));
}

// The oracle's "KIND NAME BITS..." lines as {NAME: "BITS ..."}.
std::map<std::string, std::string> oracle(
    const std::string& args,
    const std::string& kind) {
  std::map<std::string, std::string> out;
  for (const auto& line :
       split_lines(run_python_oracle("optim/shared_params_oracle.py", args))) {
    if (line.at(0) != kind) {
      continue;
    }
    std::string bits;
    for (size_t i = 2; i < line.size(); ++i) {
      bits += (i == 2 ? "" : " ") + line[i];
    }
    out[line.at(1)] = bits;
  }
  return out;
}

// Python's parameter names and tensors (the tied one once, first name).
std::vector<std::pair<std::string, torch::Tensor>> python_named(Tied& model) {
  return {
      {"wte.weight", model->wte->weight},
      {"fc.weight", model->fc->weight},
      {"fc.bias", model->fc->bias}};
}

TEST(SharedParams, LibTorchListsATiedWeightTwice) {
  Tied model;
  // What the rest of the file is about.
  ASSERT_EQ(model->parameters().size(), 4u);
  EXPECT_TRUE(model->head->weight.is_same(model->wte->weight));
}

TEST(SharedParams, FusedOptimizersStepATiedWeightOnce) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  for (const std::string name : {"adam", "adamw", "sgd"}) {
    SCOPED_TRACE(name);
    Tied model;
    std::unique_ptr<lamp::optim::FusedOptimizer> optimizer;
    if (name == "adam") {
      optimizer = std::make_unique<lamp::optim::FusedAdam>(
          model->parameters(), torch::optim::AdamOptions(0.01));
    } else if (name == "adamw") {
      optimizer = std::make_unique<lamp::optim::FusedAdamW>(
          model->parameters(),
          torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    } else {
      optimizer = std::make_unique<lamp::optim::FusedSGD>(
          model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    }
    EXPECT_EQ(optimizer->param_groups().at(0).params().size(), 3u);
    for (int step = 0; step < 3; ++step) {
      optimizer->zero_grad();
      loss_of(model).backward();
      optimizer->step();
    }
    const auto expected = oracle("step " + name + " 3", "param");
    for (const auto& [n, p] : python_named(model)) {
      EXPECT_EQ(hex_bits(p), expected.at(n)) << n;
    }
    EXPECT_TRUE(model->head->weight.is_same(model->wte->weight));
  }
}

TEST(SharedParams, ATensorInTwoGroupsIsAnError) {
  Tied model;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{model->wte->weight, model->fc->weight});
  groups.emplace_back(
      std::vector<torch::Tensor>{model->fc->bias, model->head->weight});
  expect_error_of<c10::ValueError>(
      [&] { lamp::optim::FusedAdamW optimizer(groups); },
      "is in param groups 0 and 1; a parameter belongs to one group");
}

TEST(SharedParams, AddParamGroupKeepsEachTensorOnce) {
  Tied model;
  lamp::optim::FusedSGD optimizer(
      std::vector<torch::Tensor>{model->fc->weight},
      torch::optim::SGDOptions(0.1));
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(
      {model->wte->weight, model->head->weight, model->fc->bias}));
  ASSERT_EQ(optimizer.param_groups().size(), 2u);
  EXPECT_EQ(optimizer.param_groups()[1].params().size(), 2u);
  expect_error_of<c10::ValueError>(
      [&] {
        optimizer.add_param_group(
            torch::optim::OptimizerParamGroup({model->fc->weight}));
      },
      "is in param groups 0 and 2");
  EXPECT_EQ(optimizer.param_groups().size(), 2u); // nothing added
}

// A LibTorch optimizer keeps the tied weight twice in its group: the
// scaler still divides its gradient once.
TEST(SharedParams, GradScalerUnscalesATiedGradientOnce) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  Tied model;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  ASSERT_EQ(optimizer.param_groups().at(0).params().size(), 4u);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024.0));
  scaler.scale(loss_of(model)).backward();
  scaler.unscale_(optimizer);
  const auto expected = oracle("unscale", "grad");
  for (const auto& [n, p] : python_named(model)) {
    EXPECT_EQ(hex_bits(p.grad()), expected.at(n)) << n;
  }
}

TEST(SharedParams, ClipGradNormCountsATiedGradientOnce) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto expected = oracle("clip", "grad");
  // "norm BITS": one line, its bits where a name would be.
  const auto norm_bits = oracle("clip", "norm").begin()->first;
  for (const std::optional<bool> foreach : {std::optional<bool>(), {true}}) {
    SCOPED_TRACE(foreach.has_value());
    Tied model;
    loss_of(model).backward();
    const auto total =
        lamp::clip_grad_norm_(model->parameters(), 0.5, 2.0, false, foreach);
    EXPECT_EQ(hex_bits(total), norm_bits);
    for (const auto& [n, p] : python_named(model)) {
      EXPECT_EQ(hex_bits(p.grad()), expected.at(n)) << n;
    }
  }
}

// The checkpoint holds the tied weight once under both names (Python sees
// what it sees for its own tied state_dict) and loads back tied; the
// optimizer's state lists it once.
TEST(SharedParams, CheckpointHoldsATiedWeightOnce) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto path = fresh_dir("shared_params") + "/tied.pt";
  torch::Tensor trained;
  {
    Tied model;
    lamp::optim::FusedAdamW optimizer(
        model->parameters(),
        torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      loss_of(model).backward();
      optimizer.step();
    }
    trained = model->wte->weight.detach().clone();
    lamp::TrainingState state;
    state.add("model", *model).add("optimizer", optimizer).rng(false);
    lamp::save_checkpoint(state, path);
  }
  std::map<std::string, std::string> seen;
  for (const auto& line : split_lines(run_python_oracle(
           "optim/shared_params_oracle.py", "load \"" + path + "\""))) {
    std::string rest;
    for (size_t i = 1; i < line.size(); ++i) {
      rest += (i == 1 ? "" : " ") + line[i];
    }
    seen[line.at(0)] = rest;
  }
  EXPECT_EQ(seen["keys"], "fc.bias fc.weight head.weight wte.weight");
  EXPECT_EQ(seen["shared"], "1");
  EXPECT_EQ(seen["same_as_python"], "1");
  EXPECT_EQ(seen["optimizer_params"], "3");
  EXPECT_EQ(seen["max_abs_diff"], "0.0");

  Tied model;
  lamp::optim::FusedAdamW optimizer(model->parameters());
  lamp::TrainingState state;
  state.add("model", *model).add("optimizer", optimizer).rng(false);
  lamp::load_checkpoint(state, path);
  EXPECT_TRUE(model->head->weight.is_same(model->wte->weight));
  EXPECT_TRUE(torch::equal(model->wte->weight, trained));
  EXPECT_EQ(optimizer.state().size(), 3u);
}

// The same steps graphed on a GPU: FusedAdamW and GradScaler inside the
// graph, against eager steps of a model whose optimizer was given each
// tensor once.
TEST(SharedParamsGpu, GraphedStepStepsATiedWeightOnce) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  const torch::Device cuda(torch::kCUDA);
  Tied graphed(cuda);
  Tied eager(cuda);
  lamp::optim::FusedAdamW graphed_opt(graphed->parameters());
  lamp::optim::FusedAdamW eager_opt(std::vector<torch::Tensor>{
      eager->wte->weight, eager->fc->weight, eager->fc->bias});
  lamp::GradScaler graphed_scaler, eager_scaler;
  const auto in = tokens(cuda);
  const auto targets = torch::tensor({2, 4, 6, 8, 0, 1}, torch::kLong).to(cuda);
  auto step_of = [&](Tied& model,
                     lamp::optim::FusedAdamW& opt,
                     lamp::GradScaler& scaler,
                     const torch::Tensor& x,
                     const torch::Tensor& y) {
    opt.zero_grad();
    auto loss = torch::cross_entropy_loss(model->forward(x), y);
    scaler.scale(loss).backward();
    scaler.unscale_(opt);
    lamp::clip_grad_norm_(model->parameters(), 0.5);
    scaler.step(opt);
    scaler.update();
    return loss;
  };
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& batch) {
        return step_of(
            graphed, graphed_opt, graphed_scaler, batch[0], batch[1]);
      },
      {in, targets},
      {&graphed_opt});
  for (int i = 0; i < 6; ++i) {
    step({in, targets});
    step_of(eager, eager_opt, eager_scaler, in, targets);
  }
  ASSERT_TRUE(step.is_captured());
  EXPECT_TRUE(graphed->head->weight.is_same(graphed->wte->weight));
  EXPECT_TRUE(
      torch::allclose(graphed->wte->weight, eager->wte->weight, 1e-6, 1e-6));
  EXPECT_TRUE(
      torch::allclose(graphed->fc->weight, eager->fc->weight, 1e-6, 1e-6));
}

} // namespace

} // namespace shared_params_test
