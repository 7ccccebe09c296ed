// An FP8 scope casts each weight once (Note [FP8 weight cache]): its
// micro-batches, a checkpoint's recompute and a tied layer reuse the copy,
// with the same results as casting again; anything that changes the weight
// (an optimizer step, fused or not, an in-place op, the scope's end) makes
// a new one. On a GPU: a scope left open over eager forwards, a graph
// capture and its replays never uses a stale copy.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/fp8.h>
#include <lamp/nn/diagnostics.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp8_weight_cache_test {

namespace {

using lamp::nn::detail::fp8_linear_weight_cast_count;

lamp::Fp8Recipe delayed() {
  return lamp::Fp8Recipe()
      .scaling(lamp::Fp8Scaling::kDelayed)
      .amax_history_len(4);
}

// Weight casts that `f` made.
template <typename F>
int64_t casts_of(F&& f) {
  const int64_t before = fp8_linear_weight_cast_count();
  f();
  return fp8_linear_weight_cast_count() - before;
}

struct Grads {
  torch::Tensor x, w, b;
};

// Two micro-batches through `fc`, forward and backward, in one scope
// (`one_scope`) or a scope each; the inputs' and parameters' gradients.
Grads micro_batches(
    lamp::nn::Linear& fc,
    const std::vector<torch::Tensor>& xs,
    const lamp::Fp8Recipe& recipe,
    bool one_scope) {
  fc->zero_grad();
  std::vector<torch::Tensor> inputs;
  {
    lamp::Fp8AutocastGuard outer(recipe, one_scope);
    for (const auto& x : xs) {
      auto in = x.clone().requires_grad_();
      lamp::Fp8AutocastGuard fp8(recipe);
      fc->forward(in).pow(2).sum().backward();
      inputs.push_back(in.grad());
    }
  }
  return {
      torch::cat(inputs), fc->weight.grad().clone(), fc->bias.grad().clone()};
}

void expect_equal(const Grads& a, const Grads& b) {
  EXPECT_TRUE(torch::equal(a.x, b.x));
  EXPECT_TRUE(torch::equal(a.w, b.w));
  EXPECT_TRUE(torch::equal(a.b, b.b));
}

TEST(Fp8WeightCache, AScopeCastsAWeightOnceForItsMicroBatches) {
  torch::manual_seed(0);
  lamp::nn::Linear fc(32, 16);
  const std::vector<torch::Tensor> xs{
      torch::randn({8, 32}), torch::randn({8, 32}) * 4};
  Grads once, each;
  EXPECT_EQ(casts_of([&] { once = micro_batches(fc, xs, {}, true); }), 1);
  EXPECT_EQ(casts_of([&] { each = micro_batches(fc, xs, {}, false); }), 2);
  expect_equal(once, each);
}

// Under delayed scaling a reused copy records its amax as a new cast would:
// the histories and scales are those of casting at every call.
TEST(Fp8WeightCache, DelayedHistoriesAreThoseOfCastingEachTime) {
  const std::vector<torch::Tensor> xs{
      torch::randn({8, 32}), torch::randn({8, 32}) * 4};
  auto run = [&](bool one_scope) {
    torch::manual_seed(1);
    lamp::nn::Linear fc(32, 16);
    const auto grads = micro_batches(fc, xs, delayed(), one_scope);
    return std::make_tuple(
        grads, fc->fp8_amax_history.clone(), fc->fp8_scale.clone());
  };
  const auto [once, once_history, once_scale] = run(true);
  const auto [each, each_history, each_scale] = run(false);
  // NOTE: the second micro-batch's weight scale was updated from the
  // first's amax; the reused copy keeps the scale it was cast with (its
  // inverse dequantises it), so the outputs and the gradients' amaxes
  // (row 2) differ from a new cast's by FP8 rounding. The input's and the
  // weight's amaxes, and the scales made from them, do not.
  EXPECT_TRUE(
      torch::equal(once_history.narrow(0, 0, 2), each_history.narrow(0, 0, 2)));
  EXPECT_TRUE(torch::equal(once_scale, each_scale));
  EXPECT_GT(once_history[1].abs().sum().item<double>(), 0);
  EXPECT_LT(
      ((once.x - each.x).abs().max() / each.x.abs().max()).item<double>(), 0.1);
}

// An optimizer step in the scope, fused (its kernels bump no versions by
// themselves) or LibTorch's, or any in-place op on the weight, makes the
// next forward cast it again: its output is a fresh scope's.
TEST(Fp8WeightCache, AChangedWeightIsCastAgain) {
  torch::manual_seed(2);
  const auto x = torch::randn({16, 32});
  auto fresh = [&](lamp::nn::Linear& fc) {
    lamp::Fp8AutocastGuard fp8;
    torch::NoGradGuard no_grad;
    return fc->forward(x);
  };
  auto check = [&](lamp::nn::Linear& fc, auto change) {
    lamp::Fp8AutocastGuard fp8;
    torch::Tensor again;
    const auto casts = casts_of([&] {
      fc->forward(x).sum().backward();
      change();
      torch::NoGradGuard no_grad;
      again = fc->forward(x);
    });
    EXPECT_EQ(casts, 2);
    EXPECT_TRUE(torch::equal(again, fresh(fc)));
  };
  lamp::nn::Linear a(32, 16), b(32, 16), c(32, 16);
  lamp::optim::FusedAdamW fused(
      a->parameters(), torch::optim::AdamWOptions(1e-2));
  check(a, [&] { fused.step(); });
  torch::optim::AdamW libtorch(
      b->parameters(), torch::optim::AdamWOptions(1e-2));
  check(b, [&] { libtorch.step(); });
  check(c, [&] {
    torch::NoGradGuard no_grad;
    c->weight.mul_(0.5);
  });
}

// Under autocast the weight's cast also makes the bias's 16-bit copy, kept
// with the weight's: a bias changed in place with the weight unchanged
// reuses the weight's copy but not the bias's, and two layers tied to one
// weight with biases of their own each add their own: every output is a
// fresh scope's.
TEST(Fp8WeightCache, ABiasChangedOrOtherIsCastAgain) {
  torch::manual_seed(3);
  const auto x = torch::randn({16, 32});
  lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
  torch::NoGradGuard no_grad;
  auto fresh = [&](lamp::nn::Linear& fc) {
    lamp::Fp8AutocastGuard fp8;
    return fc->forward(x);
  };
  lamp::nn::Linear fc(32, 16);
  {
    lamp::Fp8AutocastGuard fp8;
    torch::Tensor again;
    const auto casts = casts_of([&] {
      fc->forward(x);
      fc->bias.add_(1.0);
      again = fc->forward(x);
    });
    EXPECT_EQ(casts, 1);
    EXPECT_TRUE(torch::equal(again, fresh(fc)));
  }
  lamp::nn::Linear tied(32, 16);
  tied->weight = fc->weight;
  {
    lamp::Fp8AutocastGuard fp8;
    torch::Tensor a, b;
    const auto casts = casts_of([&] {
      a = fc->forward(x);
      b = tied->forward(x);
    });
    EXPECT_EQ(casts, 1);
    EXPECT_TRUE(torch::equal(a, fresh(fc)));
    EXPECT_TRUE(torch::equal(b, fresh(tied)));
    EXPECT_FALSE(torch::equal(a, b));
  }
}

// A new scope casts again; so does a layer whose weight is computed in the
// forward (a new tensor each call).
TEST(Fp8WeightCache, ScopesAndComputedWeightsCastAgain) {
  torch::manual_seed(3);
  lamp::nn::Linear fc(32, 16);
  const auto x = torch::randn({16, 32});
  torch::NoGradGuard no_grad;
  EXPECT_EQ(
      casts_of([&] {
        for (int i = 0; i < 2; ++i) {
          lamp::Fp8AutocastGuard fp8;
          fc->forward(x);
        }
      }),
      2);
  EXPECT_EQ(
      casts_of([&] {
        lamp::Fp8AutocastGuard fp8;
        for (int i = 0; i < 2; ++i) {
          lamp::nn::linear(x, fc->weight * 1.0, fc->bias);
        }
      }),
      2);
}

// A weight shared by two layers is one tensor: under current scaling one
// cast serves both; under delayed scaling each layer casts it with its own
// scale.
TEST(Fp8WeightCache, TiedLayersShareACopyUnlessTheirScalesDiffer) {
  torch::manual_seed(4);
  lamp::nn::Linear a(32, 32), b(32, 32);
  b->weight = a->weight; // what b's forward reads
  const auto x = torch::randn({16, 32});
  torch::NoGradGuard no_grad;
  auto both = [&](const lamp::Fp8Recipe& recipe) {
    lamp::Fp8AutocastGuard fp8(recipe);
    return b->forward(a->forward(x));
  };
  torch::Tensor current;
  EXPECT_EQ(casts_of([&] { current = both({}); }), 1);
  {
    // The same as the functional form, which casts in each call.
    lamp::Fp8AutocastGuard fp8;
    const auto h = lamp::nn::linear(x, a->weight * 1.0, a->bias);
    EXPECT_TRUE(
        torch::equal(current, lamp::nn::linear(h, b->weight * 1.0, b->bias)));
  }
  EXPECT_EQ(casts_of([&] { both(delayed()); }), 2);
}

// A checkpointed layer's recompute, in the backward, reuses the forward's
// copy when the backward runs in the scope (on the CPU: the same thread).
TEST(Fp8WeightCache, ARecomputeInTheScopeReusesTheCopy) {
  torch::manual_seed(5);
  lamp::nn::Linear fc(32, 16);
  const auto x = torch::randn({16, 32}).requires_grad_();
  lamp::Fp8AutocastGuard fp8;
  EXPECT_EQ(
      casts_of([&] {
        const auto out = lamp::checkpoint(
            [&](const std::vector<torch::Tensor>& in) {
              return std::vector<torch::Tensor>{fc->forward(in[0])};
            },
            {x});
        out[0].sum().backward();
      }),
      1);
  EXPECT_TRUE(fc->weight.grad().defined());
}

// The fused optimizers' kernels write the parameters without bumping their
// versions; lamp bumps them, so autograd sees a weight stepped between a
// forward and its backward, as with LibTorch's optimizers.
TEST(Fp8WeightCache, FusedStepsBumpTheParametersVersions) {
  torch::manual_seed(6);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  lamp::optim::FusedSGD opt(
      std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.1));
  const auto loss = (w * w).sum();
  loss.backward(/*gradient=*/{}, /*retain_graph=*/true);
  const auto version = w._version();
  opt.step();
  EXPECT_GT(w._version(), version);
  EXPECT_THROW(loss.backward(), c10::Error);
}

// A scope left open across eager forwards, a graph's capture and its
// replays: a copy made eagerly is not replayed stale by the graph, and a
// forward after replays does not reuse a copy from before them.
TEST(Fp8WeightCacheGpu, AScopeOpenAcrossGraphReplaysIsNeverStale) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(7);
  const auto x = torch::randn({64, 32}, cuda);
  const auto y = torch::randn({64, 16}, cuda);
  auto train = [&](bool graphed, bool open_scope) {
    torch::manual_seed(8);
    lamp::nn::Linear fc(32, 16);
    fc->to(cuda);
    lamp::optim::FusedAdamW opt(
        fc->parameters(), torch::optim::AdamWOptions(1e-2));
    lamp::Fp8AutocastGuard outer({}, open_scope);
    auto step = [&](const std::vector<torch::Tensor>& in) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        lamp::Fp8AutocastGuard fp8;
        loss = (fc->forward(in[0]).to(torch::kFloat) - in[1]).pow(2).mean();
      }
      loss.backward();
      opt.step();
      return loss.detach();
    };
    std::vector<torch::Tensor> evals;
    auto evaluate = [&] {
      torch::NoGradGuard no_grad;
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      lamp::Fp8AutocastGuard fp8;
      evals.push_back(fc->forward(x).to(torch::kCPU));
    };
    if (graphed) {
      lamp::GraphedStep g(step, {x, y}, {&opt});
      for (int i = 0; i < 6; ++i) {
        g({x, y});
        evaluate();
      }
      EXPECT_TRUE(g.is_captured());
    } else {
      for (int i = 0; i < 6; ++i) {
        step({x, y});
        evaluate();
      }
    }
    return torch::stack(evals);
  };
  const auto eager = train(false, false);
  for (const bool open_scope : {false, true}) {
    SCOPED_TRACE(open_scope ? "scope open throughout" : "a scope each");
    const auto graphed = train(true, open_scope);
    EXPECT_LT(
        ((graphed - eager).abs().max() / eager.abs().max()).item<double>(),
        1e-5);
    // Six different models evaluated, not one copy six times.
    EXPECT_FALSE(torch::equal(graphed[4], graphed[5]));
  }
}

} // namespace

} // namespace fp8_weight_cache_test
