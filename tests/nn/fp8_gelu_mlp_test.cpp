// lamp::nn::gelu_mlp in an FP8 scope (src/nn/fp8_gelu_mlp.h): the GELU done
// inside the casts gives what the three FP8 ops give (lamp's FP8 linear,
// at::gelu, FP8 linear) -- the output, every gradient and both layers'
// delayed-scaling state, bit for bit -- under current and delayed scaling,
// in fp32 and under bf16 autocast, and in a checkpoint's recompute. On a GPU
// the cast kernels' GELU and its derivative are ATen's, bit for bit, and a
// graphed step is an eager one.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/fp8.h>
#include <lamp/nn/gelu_mlp.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "nn/fp8_linear.h"
#include "support.h"

#if LAMP_WITH_CUDA
#include "nn/fp8_cast_cuda.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp8_gelu_mlp_test {

namespace {

using lamp::nn::detail::Fp8CastOp;

lamp::Fp8Recipe delayed() {
  return lamp::Fp8Recipe()
      .scaling(lamp::Fp8Scaling::kDelayed)
      .amax_history_len(4);
}

// Everything two training steps of the MLP leave behind.
struct Run {
  std::vector<torch::Tensor> values;
  std::vector<std::string> names;
};

// Two forward and backward passes (delayed scaling's second uses the
// first's amaxes) of a 32 -> 128 -> 48 MLP, through gelu_mlp (`fused`) or
// as the three ops; with `recompute`, in lamp::checkpoint.
Run run(
    bool fused,
    const lamp::Fp8Recipe& recipe,
    torch::Device device,
    std::optional<torch::ScalarType> autocast,
    bool recompute = false) {
  torch::manual_seed(3);
  lamp::nn::Linear fc(32, 128), proj(128, 48);
  fc->to(device);
  proj->to(device);
  const auto x = torch::randn({4, 16, 32}, device).requires_grad_();
  Run out;
  for (int step = 0; step < 2; ++step) {
    for (auto* t : {&fc->weight, &fc->bias, &proj->weight, &proj->bias}) {
      t->mutable_grad() = torch::Tensor();
    }
    x.mutable_grad() = torch::Tensor();
    torch::Tensor y;
    {
      std::optional<lamp::AutocastGuard> guard;
      if (autocast) {
        guard.emplace(device.type(), *autocast);
      }
      lamp::Fp8AutocastGuard fp8(recipe);
      auto mlp = [&](const torch::Tensor& in) {
        return fused ? lamp::nn::gelu_mlp(in, fc, proj)
                     : proj(torch::gelu(fc(in), "tanh"));
      };
      y = recompute ? lamp::checkpoint(mlp, x) : mlp(x);
    }
    torch::manual_seed(10 + step);
    y.backward(torch::randn(y.sizes(), y.options()));
    out.values = {
        y.detach(),
        x.grad(),
        fc->weight.grad(),
        fc->bias.grad(),
        proj->weight.grad(),
        proj->bias.grad()};
    out.names = {"y", "dx", "dW1", "db1", "dW2", "db2"};
  }
  for (auto* layer : {fc.get(), proj.get()}) {
    if (layer->fp8_amax_history.defined()) {
      out.values.push_back(layer->fp8_amax_history.clone());
      out.values.push_back(layer->fp8_scale.clone());
      out.names.push_back("amax history");
      out.names.push_back("scale");
    }
  }
  return out;
}

void expect_same_runs(
    torch::Device device,
    std::optional<torch::ScalarType> autocast) {
  for (const auto& recipe : {lamp::Fp8Recipe(), delayed()}) {
    const bool is_delayed = recipe.scaling() == lamp::Fp8Scaling::kDelayed;
    const auto three = run(false, recipe, device, autocast);
    const auto fused = run(true, recipe, device, autocast);
    ASSERT_EQ(three.values.size(), fused.values.size());
    EXPECT_EQ(three.values.size(), is_delayed ? 10u : 6u);
    for (size_t i = 0; i < three.values.size(); ++i) {
      const auto what = three.names[i] + (is_delayed ? " (delayed)" : "") +
          (autocast ? " (bf16)" : " (fp32)");
      ASSERT_TRUE(fused.values[i].defined()) << what;
      EXPECT_EQ(fused.values[i].scalar_type(), three.values[i].scalar_type())
          << what;
      EXPECT_TRUE(torch::equal(fused.values[i], three.values[i])) << what;
    }
  }
}

TEST(Fp8GeluMlp, IsTheThreeFp8OpsBitForBit) {
  expect_same_runs(torch::kCPU, std::nullopt);
  expect_same_runs(torch::kCPU, torch::kBFloat16);
}

// A checkpointed MLP's recompute runs the fused path again with the
// forward call's scales (not updated twice): the run equals the plain one.
TEST(Fp8GeluMlp, ARecomputeKeepsTheForwardCallsScales) {
  for (const auto& recipe : {lamp::Fp8Recipe(), delayed()}) {
    const auto plain = run(true, recipe, torch::kCPU, torch::kBFloat16);
    const auto again =
        run(true, recipe, torch::kCPU, torch::kBFloat16, /*recompute=*/true);
    ASSERT_EQ(plain.values.size(), again.values.size());
    for (size_t i = 0; i < plain.values.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain.values[i], again.values[i]))
          << plain.names[i];
    }
  }
}

TEST(Fp8GeluMlp, TheFunctionalFormTakesTheFp8Path) {
  torch::manual_seed(4);
  const auto x = torch::randn({16, 32});
  const auto w1 = torch::randn({64, 32}) * 0.2;
  const auto b1 = torch::randn({64});
  const auto w2 = torch::randn({16, 64}) * 0.2;
  const auto b2 = torch::randn({16});
  lamp::Fp8AutocastGuard fp8;
  const auto fused = lamp::nn::gelu_mlp(x, w1, b1, w2, b2);
  const auto three = lamp::nn::linear(
      torch::gelu(lamp::nn::linear(x, w1, b1), "tanh"), w2, b2);
  EXPECT_TRUE(torch::equal(fused, three));
  // And not the plain GELU MLP's values: FP8 rounding.
  EXPECT_FALSE(torch::allclose(
      fused,
      torch::linear(torch::gelu(torch::linear(x, w1, b1), "tanh"), w2, b2),
      1e-4,
      1e-4));
}

#if LAMP_WITH_CUDA

TEST(Fp8GeluMlpGpu, CastOpsAreAtensOpsBitForBit) {
  LAMP_SKIP_WITHOUT_CUDA();
  using lamp::nn::detail::fp8_cast_delayed_cuda;
  using lamp::nn::detail::fp8_cast_tensorwise_cuda;
  using lamp::nn::detail::fp8_reference_op;
  const torch::Device cuda(torch::kCUDA);
  // 8-wide shapes (the kernels' ops) and one the 2-wide path takes (ATen's
  // op first).
  for (const auto [rows, cols] :
       {std::pair<int64_t, int64_t>{256, 3072}, {64, 72}, {6, 10}}) {
    for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
      torch::manual_seed(rows + cols);
      // Pre-activations over GELU's whole curve, and their gradients.
      const auto pre = (torch::randn({rows, cols}, cuda) * 4).to(dtype);
      const auto dy = torch::randn({rows, cols}, cuda).to(dtype);
      for (const auto op : {Fp8CastOp::kGelu, Fp8CastOp::kGeluBackward}) {
        const bool bwd = op == Fp8CastOp::kGeluBackward;
        const auto& x = bwd ? dy : pre;
        const auto aux = bwd ? pre : torch::Tensor();
        const auto source = fp8_reference_op(x, op, aux);
        const auto what = std::to_string(rows) + "x" + std::to_string(cols) +
            " " + std::string(c10::toString(dtype)) +
            (bwd ? " dgelu" : " gelu");
        const auto fp8 = bwd ? torch::kFloat8_e5m2 : torch::kFloat8_e4m3fn;
        // Current scaling: the amax (so the scale) and every byte.
        const auto fused =
            fp8_cast_tensorwise_cuda(x, fp8, true, true, true, op, aux);
        const auto plain =
            fp8_cast_tensorwise_cuda(source, fp8, true, true, true);
        EXPECT_TRUE(torch::equal(fused.inverse_scale, plain.inverse_scale))
            << what;
        EXPECT_TRUE(torch::equal(
            fused.data.view(torch::kUInt8), plain.data.view(torch::kUInt8)))
            << what;
        EXPECT_TRUE(torch::equal(
            fused.data_t.view(torch::kUInt8), plain.data_t.view(torch::kUInt8)))
            << what;
        ASSERT_EQ(fused.column_sums.defined(), plain.column_sums.defined())
            << what;
        if (fused.column_sums.defined()) {
          EXPECT_TRUE(torch::equal(fused.column_sums, plain.column_sums))
              << what;
        }
        // Delayed scaling: the recorded amax.
        const auto f32 = torch::TensorOptions(cuda).dtype(torch::kFloat);
        const auto scale = torch::full({}, 2.0f, f32);
        auto amax_fused = torch::zeros({}, f32);
        auto amax_plain = torch::zeros({}, f32);
        const auto d_fused = fp8_cast_delayed_cuda(
            x, fp8, scale, amax_fused, true, false, false, op, aux);
        const auto d_plain = fp8_cast_delayed_cuda(
            source, fp8, scale, amax_plain, true, false, false);
        EXPECT_TRUE(torch::equal(amax_fused, amax_plain)) << what;
        EXPECT_TRUE(torch::equal(
            d_fused.data.view(torch::kUInt8), d_plain.data.view(torch::kUInt8)))
            << what;
      }
    }
  }
}

// Steps of the fused MLP under delayed scaling captured by GraphedStep
// (casts, GELU, amax histories and scale updates in the graph) train as
// eager steps do.
TEST(Fp8GeluMlpGpu, GraphedStepsEqualEagerSteps) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(4);
  const auto x = torch::randn({64, 32}, cuda);
  const auto y = torch::randn({64, 48}, cuda);
  auto train = [&](bool graphed) {
    torch::manual_seed(5);
    lamp::nn::Linear fc(32, 128), proj(128, 48);
    fc->to(cuda);
    proj->to(cuda);
    fc->init_fp8_state(delayed());
    proj->init_fp8_state(delayed());
    std::vector<torch::Tensor> params = fc->parameters();
    for (const auto& p : proj->parameters()) {
      params.push_back(p);
    }
    lamp::optim::FusedAdamW opt(params, torch::optim::AdamWOptions(1e-3));
    auto step = [&](const std::vector<torch::Tensor>& in) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        lamp::Fp8AutocastGuard fp8(delayed());
        loss = (lamp::nn::gelu_mlp(in[0], fc, proj).to(torch::kFloat) - in[1])
                   .pow(2)
                   .mean();
      }
      loss.backward();
      opt.step();
      return loss.detach();
    };
    lamp::test::run_steps(graphed, step, {x, y}, opt);
    return std::make_pair(
        fc->weight.detach().clone(), proj->fp8_amax_history.clone());
  };
  const auto [eager_w, eager_history] = train(false);
  const auto [graphed_w, graphed_history] = train(true);
  EXPECT_TRUE(torch::allclose(graphed_w, eager_w, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(graphed_history, eager_history));
}

TEST(Fp8GeluMlpGpu, IsTheThreeFp8OpsBitForBit) {
  LAMP_SKIP_WITHOUT_CUDA();
  expect_same_runs(torch::Device(torch::kCUDA), torch::kBFloat16);
  expect_same_runs(torch::Device(torch::kCUDA), std::nullopt);
}

#endif

} // namespace

} // namespace fp8_gelu_mlp_test
