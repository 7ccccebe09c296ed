// FusedOptimizer::keep_weight_casts: a model trained with the kept 16-bit
// copies (written by the step, taken by CastWeightsGuard) trains bit for
// bit as one whose guard casts every step; a weight changed between steps
// is cast again; bad use is a clear error. CPU here (the step casts after
// ATen's kernel), CUDA in *Gpu (lamp's Adam kernel writes the copies, also
// inside GraphedStep's graph).
#include <lamp/autocast.h>
#include <lamp/cast_weights.h>
#include <lamp/cuda_graph.h>
#include <lamp/grad_scaler.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace kept_weight_casts_test {

namespace {

// Three linear layers (six tensors the guard casts), one of them frozen
// and in no optimizer, and a LayerNorm, whose weights the guard leaves to
// autocast.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    frozen->weight.set_requires_grad(false);
    frozen->bias.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::gelu(fc1(x));
    h = ln(fc2(h) + frozen(h));
    return h.to(torch::kFloat).pow(2).mean();
  }
  std::vector<torch::Tensor> trained() {
    std::vector<torch::Tensor> out;
    for (auto& p : parameters()) {
      if (p.requires_grad()) {
        out.push_back(p);
      }
    }
    return out;
  }
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(32, 64))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(64, 48))};
  torch::nn::Linear frozen{
      register_module("frozen", torch::nn::Linear(64, 48))};
  torch::nn::LayerNorm ln{register_module(
      "ln",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({48})))};
};
TORCH_MODULE(Net);

// Two equal models, one trained with its casts kept.
struct Pair {
  Pair(torch::Device device, c10::ScalarType keep) {
    torch::manual_seed(0);
    plain->to(device);
    kept->to(device);
    torch::NoGradGuard no_grad;
    auto a = plain->parameters();
    auto b = kept->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      b[i].copy_(a[i]);
    }
    opt_plain = std::make_unique<lamp::optim::FusedAdamW>(
        plain->trained(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    opt_kept = std::make_unique<lamp::optim::FusedAdamW>(
        kept->trained(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    opt_kept->keep_weight_casts(keep);
  }
  Net plain, kept;
  std::unique_ptr<lamp::optim::FusedAdamW> opt_plain, opt_kept;
};

// One autocast step; returns the loss, and how many casts the guard took
// from kept copies.
std::pair<torch::Tensor, size_t> step(
    Net& net,
    lamp::optim::FusedOptimizer& opt,
    const torch::Tensor& x,
    c10::ScalarType dtype) {
  opt.zero_grad();
  torch::Tensor loss;
  size_t kept = 0;
  {
    lamp::AutocastGuard autocast(x.device().type(), dtype);
    lamp::CastWeightsGuard cast(*net, x.device().type());
    EXPECT_EQ(cast.size(), 6u);
    kept = cast.kept();
    loss = net->forward(x);
  }
  loss.backward();
  opt.step();
  return {loss.detach(), kept};
}

void expect_same_params(Net& a, Net& b) {
  auto pa = a->parameters();
  auto pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  }
}

} // namespace

TEST(KeptWeightCasts, TrainsBitForBitAsCastingEachStep) {
  Pair p(torch::kCPU, torch::kBFloat16);
  const auto x = torch::randn({8, 32});
  for (int s = 0; s < 4; ++s) {
    const auto [la, ka] = step(p.plain, *p.opt_plain, x, torch::kBFloat16);
    const auto [lb, kb] = step(p.kept, *p.opt_kept, x, torch::kBFloat16);
    EXPECT_EQ(ka, 0u);
    // The four trained tensors: made and written at the first guard, then
    // the step's; the frozen layer's two are cast.
    EXPECT_EQ(kb, 4u) << "step " << s;
    EXPECT_TRUE(torch::equal(la, lb)) << "step " << s;
    expect_same_params(p.plain, p.kept);
  }
  EXPECT_EQ(p.opt_kept->kept_weight_casts(), torch::kBFloat16);
  EXPECT_EQ(p.opt_kept->kept_casts_in_use().size(), 4u);
}

TEST(KeptWeightCasts, AWeightChangedBetweenStepsIsCastAgain) {
  Pair p(torch::kCPU, torch::kBFloat16);
  const auto x = torch::randn({8, 32});
  auto both = [&](const auto& change) {
    change(p.plain);
    change(p.kept);
    const auto [la, ka] = step(p.plain, *p.opt_plain, x, torch::kBFloat16);
    const auto [lb, kb] = step(p.kept, *p.opt_kept, x, torch::kBFloat16);
    EXPECT_TRUE(torch::equal(la, lb));
    expect_same_params(p.plain, p.kept);
  };
  both([](Net&) {});
  // In place under no_grad (a checkpoint's load does this): the version
  // counter moves.
  both([](Net& n) {
    torch::NoGradGuard no_grad;
    n->fc1->weight.mul_(0.5);
  });
  // A new storage behind the same tensor.
  both([](Net& n) {
    torch::NoGradGuard no_grad;
    n->fc2->weight.set_data(n->fc2->weight.clone() * 2);
  });
  // Through .data(), which the version counter cannot see: keeping the
  // casts again is the documented remedy.
  both([&](Net& n) {
    n->fc2->bias.data().add_(1.0);
    if (n.ptr() == p.kept.ptr()) {
      p.opt_kept->keep_weight_casts(torch::kBFloat16);
    }
  });
}

TEST(KeptWeightCasts, AnotherAutocastDtypeIsCast) {
  Pair p(torch::kCPU, torch::kHalf); // fp16 copies, a bf16 forward
  const auto x = torch::randn({8, 32});
  for (int s = 0; s < 2; ++s) {
    const auto [la, ka] = step(p.plain, *p.opt_plain, x, torch::kBFloat16);
    const auto [lb, kb] = step(p.kept, *p.opt_kept, x, torch::kBFloat16);
    EXPECT_EQ(kb, 0u);
    EXPECT_TRUE(torch::equal(la, lb));
  }
  EXPECT_TRUE(p.opt_kept->kept_casts_in_use().empty());
}

TEST(KeptWeightCasts, KeepingNoneFreesTheCopies) {
  Pair p(torch::kCPU, torch::kBFloat16);
  const auto x = torch::randn({8, 32});
  step(p.kept, *p.opt_kept, x, torch::kBFloat16);
  EXPECT_EQ(p.opt_kept->kept_casts_in_use().size(), 4u);
  p.opt_kept->keep_weight_casts(torch::kFloat);
  EXPECT_EQ(p.opt_kept->kept_weight_casts(), torch::kFloat);
  EXPECT_TRUE(p.opt_kept->kept_casts_in_use().empty());
  const auto [lb, kb] = step(p.kept, *p.opt_kept, x, torch::kBFloat16);
  EXPECT_EQ(kb, 0u);
}

TEST(KeptWeightCasts, BadUseIsAClearError) {
  Net net;
  lamp::optim::FusedAdamW opt(net->trained());
  EXPECT_THROW(opt.keep_weight_casts(torch::kInt), c10::ValueError);
  opt.keep_weight_casts(torch::kBFloat16);
  // A second optimizer keeping the same parameters' casts.
  lamp::optim::FusedAdamW other(net->trained());
  EXPECT_THROW(
      {
        try {
          other.keep_weight_casts(torch::kBFloat16);
        } catch (const c10::Error& e) {
          EXPECT_NE(
              std::string(e.what()).find("another optimizer"),
              std::string::npos);
          throw;
        }
      },
      c10::Error);
  // Refused as a whole: it keeps none, and the first one keeps its own.
  EXPECT_EQ(other.kept_weight_casts(), torch::kFloat);
  EXPECT_EQ(opt.kept_weight_casts(), torch::kBFloat16);
}

// --- CUDA: lamp's Adam kernel writes the copies ---

class KeptWeightCastsGpu : public lamp::test::GpuTest,
                           public testing::WithParamInterface<c10::ScalarType> {
};

TEST_P(KeptWeightCastsGpu, TheStepsKernelWritesTheCastsBitForBit) {
  const auto dtype = GetParam();
  Pair p(torch::kCUDA, dtype);
  const auto x = torch::randn({64, 32}, torch::kCUDA);
  for (int s = 0; s < 4; ++s) {
    const auto [la, ka] = step(p.plain, *p.opt_plain, x, dtype);
    const auto [lb, kb] = step(p.kept, *p.opt_kept, x, dtype);
    EXPECT_EQ(kb, 4u);
    ASSERT_TRUE(torch::equal(la, lb)) << "step " << s;
    expect_same_params(p.plain, p.kept);
  }
}

TEST_P(KeptWeightCastsGpu, GraphedStepReadsAndWritesTheCasts) {
  const auto dtype = GetParam();
  Pair p(torch::kCUDA, dtype);
  const auto x = torch::randn({64, 32}, torch::kCUDA);
  auto graphed = [&](Net& net, lamp::optim::FusedOptimizer& opt) {
    return std::make_unique<lamp::GraphedStep>(
        [&net, &opt, dtype](const std::vector<torch::Tensor>& in) {
          return step(net, opt, in[0], dtype).first;
        },
        std::vector<torch::Tensor>{x},
        std::vector<torch::optim::Optimizer*>{&opt},
        lamp::GraphedStepOptions().warmup_steps(2));
  };
  auto a = graphed(p.plain, *p.opt_plain);
  auto b = graphed(p.kept, *p.opt_kept);
  for (int s = 0; s < 6; ++s) {
    if (s == 4) {
      // Between replays, in place: the copy the graph reads is stale and
      // must be written again before the replay.
      torch::NoGradGuard no_grad;
      p.plain->fc1->weight.mul_(0.5);
      p.kept->fc1->weight.mul_(0.5);
    }
    const auto la = (*a)({x});
    const auto lb = (*b)({x});
    ASSERT_TRUE(torch::equal(la, lb)) << "call " << s;
    expect_same_params(p.plain, p.kept);
  }
  EXPECT_TRUE(b->is_captured());
}

TEST_P(KeptWeightCastsGpu, ASkippedStepKeepsTheCasts) {
  const auto dtype = GetParam();
  Pair p(torch::kCUDA, dtype);
  const auto x = torch::randn({64, 32}, torch::kCUDA);
  for (int s = 0; s < 3; ++s) {
    std::optional<torch::Tensor> inf =
        torch::full({}, s == 1 ? 1.0 : 0.0, x.options());
    std::vector<torch::Tensor> losses;
    for (auto* side : {&p.plain, &p.kept}) {
      auto& opt = side == &p.plain ? *p.opt_plain : *p.opt_kept;
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, dtype);
        lamp::CastWeightsGuard cast(**side, torch::kCUDA);
        loss = (*side)->forward(x);
      }
      loss.backward();
      opt.step_scaled(torch::full({}, 2.0, x.options()), inf);
      losses.push_back(loss.detach());
    }
    ASSERT_TRUE(torch::equal(losses[0], losses[1])) << "step " << s;
    expect_same_params(p.plain, p.kept);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes,
    KeptWeightCastsGpu,
    testing::Values(torch::kBFloat16, torch::kHalf),
    [](const testing::TestParamInfo<c10::ScalarType>& info) {
      return info.param == torch::kHalf ? std::string("fp16")
                                        : std::string("bf16");
    });

} // namespace kept_weight_casts_test
