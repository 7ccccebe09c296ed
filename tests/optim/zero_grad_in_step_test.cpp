// FusedOptimizer::zero_grad_in_step: a step that drops its gradients trains
// bit for bit as the same step followed by zero_grad(), for each fused
// optimizer and each way of stepping (plain, with a scale and a found_inf
// that skips a step, clip_grad_norm_and_step), with a weight listed twice.
// On a GPU, FusedAdam/FusedAdamW take lamp's kernel, which then skips
// storing the divided gradients; also inside GraphedStep's graph.
#include <lamp/cuda_graph.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace zero_grad_in_step_test {

namespace {

enum class How { kPlain, kScaled, kClip };

struct Case {
  std::string name;
  std::string optimizer; // "adam", "adamw" or "sgd"
  How how;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

std::unique_ptr<lamp::optim::FusedOptimizer> make_optimizer(
    const std::string& name,
    const std::vector<torch::Tensor>& params) {
  if (name == "adam") {
    return std::make_unique<lamp::optim::FusedAdam>(
        params, torch::optim::AdamOptions(1e-2).weight_decay(0.1));
  }
  if (name == "adamw") {
    return std::make_unique<lamp::optim::FusedAdamW>(
        params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  }
  return std::make_unique<lamp::optim::FusedSGD>(
      params, torch::optim::SGDOptions(1e-2).momentum(0.9));
}

// Weights of sizes that are not multiples of 4 (the kernel's tail), the
// first listed twice as a tied weight is.
struct Model {
  explicit Model(torch::Device device) {
    torch::manual_seed(0);
    const auto o = torch::TensorOptions().device(device);
    w1 = torch::randn({37, 13}, o).requires_grad_();
    b1 = torch::randn({37}, o).requires_grad_();
    w2 = torch::randn({5, 37}, o).requires_grad_();
  }
  std::vector<torch::Tensor> listed() const {
    return {w1, b1, w2, w1};
  }
  std::vector<torch::Tensor> params() const {
    return {w1, b1, w2};
  }
  torch::Tensor loss(const torch::Tensor& x) const {
    const auto h = torch::tanh(torch::addmm(b1, x, w1.t()));
    return torch::mm(h, w2.t()).pow(2).mean() + w1.sum() * 1e-3;
  }
  torch::Tensor w1, b1, w2;
};

// Whether the two models' parameters are bitwise equal (the first that is
// not, named).
testing::AssertionResult same_params(const Model& a, const Model& b) {
  const auto pa = a.params();
  const auto pb = b.params();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) {
      return testing::AssertionFailure() << "parameter " << i << " differs";
    }
  }
  return testing::AssertionSuccess();
}

// One step of `how` on `opt`; returns the clip's norm (undefined
// otherwise).
torch::Tensor step(
    lamp::optim::FusedOptimizer& opt,
    How how,
    int s,
    torch::Device device) {
  const auto o = torch::TensorOptions().device(device);
  switch (how) {
    case How::kPlain:
      opt.step();
      return {};
    case How::kScaled:
      // Step 2 is skipped (found_inf), as GradScaler skips one.
      opt.step_scaled(
          torch::full({}, 4.0, o), torch::full({}, s == 2 ? 1.0 : 0.0, o));
      return {};
    case How::kClip:
      return opt.clip_grad_norm_and_step(0.5);
  }
  return {};
}

void expect_trains_as_step_then_zero_grad(const Case& c, torch::Device device) {
  Model ref(device), dropped(device);
  auto ref_opt = make_optimizer(c.optimizer, ref.listed());
  auto opt = make_optimizer(c.optimizer, dropped.listed());
  EXPECT_FALSE(opt->zeroes_grad_in_step()); // default off
  opt->zero_grad_in_step(true);
  EXPECT_TRUE(opt->zeroes_grad_in_step());
  torch::manual_seed(1);
  for (int s = 0; s < 4; ++s) {
    const auto x =
        torch::randn({16, 13}, torch::TensorOptions().device(device));
    ref.loss(x).backward();
    dropped.loss(x).backward();
    const auto ref_norm = step(*ref_opt, c.how, s, device);
    const auto norm = step(*opt, c.how, s, device);
    // Off: the step leaves the gradients (divided where it divided them).
    for (const auto& p : ref.params()) {
      ASSERT_TRUE(p.grad().defined()) << "step " << s;
    }
    ref_opt->zero_grad();
    for (const auto& p : dropped.params()) {
      EXPECT_FALSE(p.grad().defined()) << "step " << s;
    }
    if (ref_norm.defined()) {
      EXPECT_TRUE(torch::equal(ref_norm, norm)) << "step " << s;
    }
    ASSERT_TRUE(same_params(ref, dropped)) << "step " << s;
  }
}

const std::vector<Case> kCases{
    {"AdamPlain", "adam", How::kPlain},
    {"AdamScaled", "adam", How::kScaled},
    {"AdamClip", "adam", How::kClip},
    {"AdamWPlain", "adamw", How::kPlain},
    {"AdamWScaled", "adamw", How::kScaled},
    {"AdamWClip", "adamw", How::kClip},
    {"SgdScaled", "sgd", How::kScaled},
    {"SgdClip", "sgd", How::kClip}};

class ZeroGradInStep : public testing::TestWithParam<Case> {};

TEST_P(ZeroGradInStep, TrainsAsStepThenZeroGrad) {
  expect_trains_as_step_then_zero_grad(GetParam(), torch::kCPU);
}

INSTANTIATE_TEST_SUITE_P(
    Cases,
    ZeroGradInStep,
    testing::ValuesIn(kCases),
    case_name);

// --- CUDA: FusedAdam/FusedAdamW on lamp's kernel, which skips the store ---

class ZeroGradInStepGpu : public lamp::test::GpuTest,
                          public testing::WithParamInterface<Case> {};

TEST_P(ZeroGradInStepGpu, TrainsAsStepThenZeroGrad) {
  expect_trains_as_step_then_zero_grad(GetParam(), torch::kCUDA);
}

TEST_P(ZeroGradInStepGpu, GraphedStepTrainsAsWithItOff) {
  const auto& c = GetParam();
  Model ref(torch::kCUDA), dropped(torch::kCUDA);
  auto ref_opt = make_optimizer(c.optimizer, ref.listed());
  auto opt = make_optimizer(c.optimizer, dropped.listed());
  opt->zero_grad_in_step(true);
  const auto x = torch::randn({16, 13}, torch::kCUDA);
  auto graphed = [&](Model& m, lamp::optim::FusedOptimizer& o) {
    return std::make_unique<lamp::GraphedStep>(
        [&m, &o, &c](const std::vector<torch::Tensor>& in) {
          o.zero_grad();
          auto loss = m.loss(in[0]);
          loss.backward();
          (void)step(o, c.how, 0, torch::kCUDA);
          return loss.detach();
        },
        std::vector<torch::Tensor>{x},
        std::vector<torch::optim::Optimizer*>{&o},
        lamp::GraphedStepOptions().warmup_steps(2));
  };
  auto a = graphed(ref, *ref_opt);
  auto b = graphed(dropped, *opt);
  for (int s = 0; s < 5; ++s) {
    const auto in = torch::randn({16, 13}, torch::kCUDA);
    const auto la = (*a)({in});
    const auto lb = (*b)({in});
    ASSERT_TRUE(torch::equal(la, lb)) << "call " << s;
    ASSERT_TRUE(same_params(ref, dropped)) << "call " << s;
  }
  EXPECT_TRUE(b->is_captured());
}

INSTANTIATE_TEST_SUITE_P(
    Cases,
    ZeroGradInStepGpu,
    testing::Values(kCases[1], kCases[2], kCases[4], kCases[5]),
    case_name);

} // namespace

} // namespace zero_grad_in_step_test
