// lamp::nn::gelu_mlp: on the CPU (and wherever the epilogues do not apply)
// the three ops linear, gelu(tanh), linear, bit for bit, forward and
// backward; the module overload. On a GPU: cuBLASLt's GELU epilogues as
// accurate as the three ops (against a float64 reference of the same
// operands), the same every run, the three ops where they do not apply,
// a second derivative, and inside GraphedStep; without gradients the
// training forward's values; the output skipped in a checkpoint's recompute.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/nn/gelu_mlp.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace gelu_mlp_test {

namespace {

struct Result {
  torch::Tensor y, dx, dw1, db1, dw2, db2;
};

// x [.., c] -> hidden -> out, parameters in `param_dtype`, run under
// autocast to `dtype` when `autocast`; `mlp` is gelu_mlp or the three ops.
// `exact`: the same operands, rounded to `dtype` as the run would round
// them, then float64 leaves, without autocast: the exact result of what the
// others compute in `dtype`.
template <typename Mlp>
Result run(
    Mlp mlp,
    torch::Device device,
    std::vector<int64_t> shape,
    int64_t hidden,
    int64_t out,
    torch::Dtype dtype,
    bool autocast,
    bool exact = false) {
  torch::manual_seed(7);
  const auto param_dtype = autocast ? torch::kFloat : dtype;
  const int64_t c = shape.back();
  auto make = [&](std::vector<int64_t> s, double scale) {
    auto t = (torch::randn(s) * scale).to(device, param_dtype);
    if (exact) {
      t = t.to(dtype).to(torch::kDouble);
    }
    return t.requires_grad_();
  };
  auto x = make(shape, 1.0);
  auto w1 = make({hidden, c}, 1 / std::sqrt(double(c)));
  auto b1 = make({hidden}, 0.1);
  auto w2 = make({out, hidden}, 1 / std::sqrt(double(hidden)));
  auto b2 = make({out}, 0.1);
  shape.back() = out;
  const auto g = torch::randn(shape).to(device, dtype);
  torch::Tensor y;
  {
    lamp::AutocastGuard guard(device.type(), dtype, autocast && !exact);
    y = mlp(x, w1, b1, w2, b2);
  }
  y.backward(g.to(y.scalar_type()));
  return {y.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
}

torch::Tensor lamps(
    const torch::Tensor& x,
    const torch::Tensor& w1,
    const torch::Tensor& b1,
    const torch::Tensor& w2,
    const torch::Tensor& b2) {
  return lamp::nn::gelu_mlp(x, w1, b1, w2, b2);
}

torch::Tensor three_ops(
    const torch::Tensor& x,
    const torch::Tensor& w1,
    const torch::Tensor& b1,
    const torch::Tensor& w2,
    const torch::Tensor& b2) {
  return lamp::nn::linear(
      torch::gelu(lamp::nn::linear(x, w1, b1), "tanh"), w2, b2);
}

void expect_equal(const Result& a, const Result& b) {
  EXPECT_TRUE(torch::equal(a.y, b.y));
  EXPECT_TRUE(torch::equal(a.dx, b.dx));
  EXPECT_TRUE(torch::equal(a.dw1, b.dw1));
  EXPECT_TRUE(torch::equal(a.db1, b.db1));
  EXPECT_TRUE(torch::equal(a.dw2, b.dw2));
  EXPECT_TRUE(torch::equal(a.db2, b.db2));
}

TEST(GeluMlp, IsTheThreeOpsOnTheCpu) {
  const torch::Device cpu(torch::kCPU);
  expect_equal(
      run(lamps, cpu, {2, 5, 16}, 64, 16, torch::kFloat, false),
      run(three_ops, cpu, {2, 5, 16}, 64, 16, torch::kFloat, false));
  expect_equal(
      run(lamps, cpu, {2, 5, 16}, 64, 16, torch::kBFloat16, true),
      run(three_ops, cpu, {2, 5, 16}, 64, 16, torch::kBFloat16, true));
  expect_equal(
      run(lamps, cpu, {7, 12}, 20, 12, torch::kBFloat16, false),
      run(three_ops, cpu, {7, 12}, 20, 12, torch::kBFloat16, false));
}

TEST(GeluMlp, ModuleOverloadUsesTheLayersParameters) {
  torch::manual_seed(1);
  lamp::nn::Linear fc(16, 64), proj(64, 16);
  const auto x = torch::randn({3, 4, 16});
  EXPECT_TRUE(torch::equal(
      lamp::nn::gelu_mlp(x, fc, proj),
      lamp::nn::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias)));
  lamp::nn::Linear no_bias(torch::nn::LinearOptions(64, 16).bias(false));
  try {
    lamp::nn::gelu_mlp(x, fc, no_bias);
    ADD_FAILURE() << "a layer without a bias was taken";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("need a bias"), std::string::npos)
        << e.what();
  }
}

// GeluMlpOptions::skip_proj_bias: the output without proj's bias (the
// caller adds it), proj's bias unused; the other gradients as with it.
void expect_skipped_bias_is_added_later(torch::Device device, torch::Dtype t) {
  SCOPED_TRACE(device.str() + " " + c10::toString(t));
  torch::manual_seed(4);
  lamp::nn::Linear fc(64, 256), proj(256, 64);
  fc->to(device, t);
  proj->to(device, t);
  const auto x = torch::randn({2, 8, 64}).to(device, t);
  const auto gy = torch::randn({2, 8, 64}).to(device, t);
  auto grads = [&](bool skip) {
    for (auto* p : {&fc->weight, &fc->bias, &proj->weight, &proj->bias}) {
      p->mutable_grad() = torch::Tensor();
    }
    auto y = lamp::nn::gelu_mlp(
        x, fc, proj, lamp::nn::GeluMlpOptions().skip_proj_bias(skip));
    if (skip) {
      EXPECT_FALSE(proj->bias.grad().defined());
      y = y + proj->bias;
    }
    y.backward(gy);
    return std::vector<torch::Tensor>{
        y.detach(), fc->weight.grad(), fc->bias.grad(), proj->weight.grad()};
  };
  const auto with = grads(false);
  const auto skipped = grads(true);
  const double tol = t == torch::kFloat ? 1e-5 : 2e-2;
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_TRUE(torch::allclose(
        skipped[i].to(torch::kFloat), with[i].to(torch::kFloat), tol, tol))
        << i;
  }
}

TEST(GeluMlp, SkippedProjBiasIsTheCallersToAdd) {
  expect_skipped_bias_is_added_later(torch::kCPU, torch::kFloat);
}

class GeluMlpGpu : public lamp::test::GpuTest {};

TEST_F(GeluMlpGpu, SkippedProjBiasIsTheCallersToAdd) {
  expect_skipped_bias_is_added_later(torch::kCUDA, torch::kBFloat16);
}

// Largest absolute difference from `exact` (float64), per tensor.
std::vector<double> errors(const Result& r, const Result& exact) {
  auto e = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kDouble) - b).abs().max().item<double>();
  };
  return {
      e(r.y, exact.y),
      e(r.dx, exact.dx),
      e(r.dw1, exact.dw1),
      e(r.db1, exact.db1),
      e(r.dw2, exact.dw2),
      e(r.db2, exact.db2)};
}

// The epilogues compute GELU (and its derivative) on the fp32 accumulator
// and round once: at least as close to the exact result (float64 from the
// same rounded operands) as the three ops, which round in between.
TEST_F(GeluMlpGpu, EpiloguesAreAsAccurateAsTheThreeOps) {
  const torch::Device cuda(torch::kCUDA);
  struct Case {
    std::vector<int64_t> shape;
    int64_t hidden;
    torch::Dtype dtype;
    bool autocast;
  };
  const std::vector<Case> cases = {
      {{4, 64, 96}, 384, torch::kBFloat16, true}, // GPT-like
      {{4, 64, 96}, 384, torch::kHalf, true},
      {{300, 40}, 160, torch::kBFloat16, false}, // rank 2
      {{2, 3, 50, 40}, 64, torch::kHalf, false}, // rank 4
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(
        std::to_string(c.shape.size()) + "-D, hidden " +
        std::to_string(c.hidden) + ", " + c10::toString(c.dtype) +
        (c.autocast ? " autocast" : ""));
    const int64_t out = c.shape.back();
    const auto fused =
        run(lamps, cuda, c.shape, c.hidden, out, c.dtype, c.autocast);
    const auto ops =
        run(three_ops, cuda, c.shape, c.hidden, out, c.dtype, c.autocast);
    const auto reference =
        run(three_ops, cuda, c.shape, c.hidden, out, c.dtype, c.autocast, true);
    const auto fused_error = errors(fused, reference);
    const auto ops_error = errors(ops, reference);
    const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2"};
    const std::vector<torch::Tensor> exact{
        reference.y,
        reference.dx,
        reference.dw1,
        reference.db1,
        reference.dw2,
        reference.db2};
    for (size_t i = 0; i < fused_error.size(); ++i) {
      // Slack: a quarter of a unit in the last place of the largest value.
      const double ulp = (c.dtype == torch::kHalf ? 1.0 / 1024 : 1.0 / 128) *
          exact[i].abs().max().item<double>();
      EXPECT_LE(fused_error[i], 1.5 * ops_error[i] + ulp / 4)
          << names[i] << ": epilogues " << fused_error[i] << ", three ops "
          << ops_error[i];
    }
    EXPECT_EQ(fused.y.scalar_type(), ops.y.scalar_type());
    EXPECT_EQ(fused.db1.scalar_type(), ops.db1.scalar_type());
    expect_equal(
        run(lamps, cuda, c.shape, c.hidden, out, c.dtype, c.autocast), fused);
  }
}

// Where the epilogues do not apply, gelu_mlp is the three ops bit for bit:
// a width not a multiple of 8, fp32, float64 under autocast.
TEST_F(GeluMlpGpu, ElsewhereTheThreeOps) {
  const torch::Device cuda(torch::kCUDA);
  expect_equal(
      run(lamps, cuda, {4, 32, 96}, 100, 96, torch::kBFloat16, true),
      run(three_ops, cuda, {4, 32, 96}, 100, 96, torch::kBFloat16, true));
  expect_equal(
      run(lamps, cuda, {4, 32, 96}, 384, 96, torch::kFloat, false),
      run(three_ops, cuda, {4, 32, 96}, 384, 96, torch::kFloat, false));
  {
    // float64 under autocast: autocast leaves it as it is.
    auto d = [&](std::vector<int64_t> s) {
      return torch::randn(s, torch::dtype(torch::kDouble).device(cuda))
          .requires_grad_();
    };
    const auto x = d({8, 32}), w1 = d({64, 32}), b1 = d({64}), w2 = d({32, 64}),
               b2 = d({32});
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    EXPECT_TRUE(
        torch::equal(lamps(x, w1, b1, w2, b2), three_ops(x, w1, b1, w2, b2)));
  }
}

// Without gradients (an evaluation, a checkpoint's forward call) the same
// GEMMs and epilogue as with them: the training forward's values bit for
// bit, under no_grad and with no operand requiring a gradient alike.
TEST_F(GeluMlpGpu, WithoutGradientsTheTrainingForwardsValues) {
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(6);
  auto t = [&](std::vector<int64_t> s, double scale) {
    return (torch::randn(s, cuda) * scale).requires_grad_();
  };
  const auto x = t({4, 64, 128}, 1.0), w1 = t({512, 128}, 0.1),
             b1 = t({512}, 0.1), w2 = t({128, 512}, 0.05), b2 = t({128}, 0.1);
  lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
  const auto training = lamps(x, w1, b1, w2, b2);
  ASSERT_TRUE(training.requires_grad());
  torch::Tensor no_grad, no_operand;
  {
    torch::NoGradGuard guard;
    no_grad = lamps(x, w1, b1, w2, b2);
  }
  no_operand =
      lamps(x.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach());
  EXPECT_FALSE(no_operand.requires_grad());
  EXPECT_TRUE(torch::equal(no_grad, training.detach()));
  EXPECT_TRUE(torch::equal(no_operand, training.detach()));
  // ... and not the three ops' (which round GELU's input first): the
  // epilogue did run.
  torch::NoGradGuard guard;
  EXPECT_FALSE(torch::equal(no_grad, three_ops(x, w1, b1, w2, b2)));
}

// GeluMlpOptions::skip_output_in_recompute: a checkpointed MLP whose output
// is the checkpoint's output gets the same gradients, bit for bit, with
// the second GEMM left out of the recompute; the forward call's output is
// computed as ever.
TEST_F(GeluMlpGpu, SkippedOutputInTheRecomputeSameGradients) {
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(8);
  const auto x0 = torch::randn({4, 64, 128}, cuda);
  const auto g = torch::randn({4, 64, 128}, cuda);
  auto run = [&](bool skip) {
    torch::manual_seed(9);
    lamp::nn::Linear fc(128, 512), proj(512, 128);
    fc->to(cuda);
    proj->to(cuda);
    const auto x = x0.clone().requires_grad_();
    const auto options =
        lamp::nn::GeluMlpOptions().skip_output_in_recompute(skip);
    bool recomputed = false;
    torch::Tensor y;
    {
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      y = lamp::checkpoint(
          [&](const torch::Tensor& in) {
            recomputed = recomputed || lamp::is_recomputing();
            return lamp::nn::gelu_mlp(in, fc, proj, options);
          },
          x);
    }
    y.backward(g.to(y.scalar_type()));
    EXPECT_TRUE(recomputed);
    return std::vector<torch::Tensor>{
        y.detach(),
        x.grad(),
        fc->weight.grad(),
        fc->bias.grad(),
        proj->weight.grad(),
        proj->bias.grad()};
  };
  const auto computed = run(false);
  const auto skipped = run(true);
  for (size_t i = 0; i < computed.size(); ++i) {
    EXPECT_TRUE(torch::equal(skipped[i], computed[i])) << i;
  }
}

// A gradient penalty differentiates the backward pass: the three ops'
// second derivatives.
TEST_F(GeluMlpGpu, DoubleBackward) {
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(4);
  auto t = [&](std::vector<int64_t> s) {
    return (torch::randn(s, cuda) * 0.3).to(torch::kBFloat16).requires_grad_();
  };
  auto x = t({16, 32}), w1 = t({64, 32}), b1 = t({64}), w2 = t({32, 64}),
       b2 = t({32});
  auto penalty = [&](bool ours) {
    const auto y =
        ours ? lamps(x, w1, b1, w2, b2) : three_ops(x, w1, b1, w2, b2);
    const auto gx = torch::autograd::grad(
        {y.to(torch::kFloat).square().sum()}, {x}, {}, true, true)[0];
    return torch::autograd::grad(
        {gx.to(torch::kFloat).square().sum()}, {w1, b1, w2});
  };
  const auto ours = penalty(true);
  const auto theirs = penalty(false);
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto a = ours[i].to(torch::kFloat);
    const auto b = theirs[i].to(torch::kFloat);
    EXPECT_LT(
        (a - b).abs().max().item<double>(),
        0.05 * b.abs().max().item<double>() + 1e-3)
        << i;
  }
}

// A training step with gelu_mlp captured by GraphedStep and replayed equals
// the same steps run eagerly.
TEST_F(GeluMlpGpu, GraphedStepsEqualEagerSteps) {
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(4);
  const auto x = torch::randn({8, 16, 32}, cuda);
  const auto y = torch::randn({8, 16, 32}, cuda);
  auto train = [&](bool graphed) {
    torch::manual_seed(5);
    lamp::nn::Linear fc(32, 128), proj(128, 32);
    fc->to(cuda);
    proj->to(cuda);
    auto params = fc->parameters();
    for (const auto& p : proj->parameters()) {
      params.push_back(p);
    }
    lamp::optim::FusedAdamW opt(params, torch::optim::AdamWOptions(1e-3));
    auto step = [&](const std::vector<torch::Tensor>& in) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        loss = (lamp::nn::gelu_mlp(in[0], fc, proj).to(torch::kFloat) - in[1])
                   .pow(2)
                   .mean();
      }
      loss.backward();
      opt.step();
      return loss.detach();
    };
    lamp::test::run_steps(graphed, step, {x, y}, opt);
    return torch::cat(
        {fc->weight.detach().flatten(),
         fc->bias.detach(),
         proj->weight.detach().flatten()});
  };
  const auto eager = train(false);
  const auto graphed = train(true);
  EXPECT_TRUE(torch::equal(graphed, eager))
      << (graphed - eager).abs().max().item<double>();
}

} // namespace

} // namespace gelu_mlp_test
