// lamp::nn::gelu_mlp in an FP8 scope (src/nn/fp8_gelu_mlp.h): the GELU done
// inside the casts gives what the three FP8 ops give (lamp's FP8 linear,
// at::gelu, FP8 linear) -- the output, every gradient and both layers'
// delayed-scaling state, bit for bit -- under current and delayed scaling,
// in fp32 and under bf16 autocast, and in a checkpoint's recompute. On a GPU
// the cast kernels' GELU (ATen's formula, a faster tanh) and its derivative
// (rewritten without cancellation) are within a rounding of the exact
// values, and a graphed step is an eager one.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/fp8.h>
#include <lamp/nn/gelu_mlp.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
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

// Bit for bit where `tolerance` is 0, else each value within it
// (relative and absolute).
void expect_same_runs(
    torch::Device device,
    std::optional<torch::ScalarType> autocast,
    double tolerance = 0) {
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
      if (tolerance == 0) {
        EXPECT_TRUE(torch::equal(fused.values[i], three.values[i])) << what;
      } else {
        EXPECT_TRUE(torch::allclose(
            fused.values[i], three.values[i], tolerance, tolerance))
            << what << ": largest difference "
            << (fused.values[i] - three.values[i]).abs().max().item<double>();
      }
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

// The value an FP8 tensor's bytes stand for: its elements times the
// inverse scale, in double.
torch::Tensor dequantised(const torch::Tensor& q, const torch::Tensor& inv) {
  return q.to(torch::kDouble).cpu() * inv.to(torch::kDouble).cpu();
}

// The fraction of `a`'s bytes that differ from `b`'s.
double differing(const torch::Tensor& a, const torch::Tensor& b) {
  return a.view(torch::kUInt8).ne(b.view(torch::kUInt8)).sum().item<double>() /
      static_cast<double>(a.numel());
}

// `fused`'s bytes against `plain`'s, cast with (nearly) the same scale:
// each within one FP8 step (the spacing of the format at the value, or its
// smallest subnormal) plus `scale_error` of the value, and at most
// `max_differing` of the bytes different at all.
void expect_within_a_step(
    const torch::Tensor& fused,
    const torch::Tensor& fused_inv,
    const torch::Tensor& plain,
    const torch::Tensor& plain_inv,
    double scale_error,
    double max_differing,
    const std::string& what) {
  const bool e4m3 = plain.scalar_type() == torch::kFloat8_e4m3fn;
  const double step = e4m3 ? 0.125 : 0.25; // 2^-mantissa bits
  const double subnormal = e4m3 ? 1.0 / 512 : 1.0 / 65536;
  const auto f = dequantised(fused, fused_inv);
  const auto p = dequantised(plain, plain_inv);
  const double inv = plain_inv.item<double>();
  EXPECT_TRUE(torch::allclose(f, p, step + scale_error, subnormal * inv * 1.01))
      << what << ": largest difference " << (f - p).abs().max().item<double>();
  const double differing = fused.view(torch::kUInt8)
                               .ne(plain.view(torch::kUInt8))
                               .sum()
                               .item<double>() /
      static_cast<double>(plain.numel());
  EXPECT_LE(differing, max_differing) << what;
}

// gelu'(x) * dy (tanh form) in fp64, rounded to `dtype`: the derivative as
// er (1 + 2xr beta (1 + 3 kappa x^2)) with e = e^(2u), r = 1 / (1 + e),
// equal to ATen's 0.5 (1 + t) + 0.5 x (1 - t^2) beta (...) but with
// nothing to cancel, so exact to fp64's precision.
torch::Tensor exact_gelu_backward(
    const torch::Tensor& dy,
    const torch::Tensor& x,
    torch::ScalarType dtype) {
  const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
  const auto xd = x.to(torch::kDouble);
  const auto u = beta * (xd + kappa * xd.pow(3));
  const auto e = (2 * u).exp();
  const auto r = 1 / (1 + e);
  // e r as 1 - r where e is large (inf times 0 otherwise).
  const auto er = torch::where(e < 1, e * r, 1 - r);
  const auto d = er * (1 + 2 * xd * r * beta * (1 + 3 * kappa * xd * xd));
  return (dy.to(torch::kDouble) * d).to(dtype);
}

// The cast kernels' GELU is ATen's formula with a faster tanh (~1e-6 from
// tanhf, fp8_cast_kernel.cu): rounded to the operand's type a value can
// differ from ATen's by one unit where it lies that close to a rounding
// boundary, an FP8 byte rarely at all. Its derivative is rewritten so that
// nothing cancels: compared with the exact derivative (fp64), as close as
// ATen's op is or closer (ATen's loses the small derivatives of x below
// about -2).
TEST(Fp8GeluMlpGpu, CastOpsAreWithinARoundingOfTheExactOps) {
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
      const bool eight_wide = cols % 8 == 0;
      for (const auto op : {Fp8CastOp::kGelu, Fp8CastOp::kGeluBackward}) {
        const bool bwd = op == Fp8CastOp::kGeluBackward;
        const auto& x = bwd ? dy : pre;
        const auto aux = bwd ? pre : torch::Tensor();
        const auto aten = fp8_reference_op(x, op, aux);
        // What the kernel is held to: ATen's GELU, the exact derivative
        // (the 2-wide path runs ATen's op).
        const auto source =
            bwd && eight_wide ? exact_gelu_backward(dy, pre, dtype) : aten;
        const auto what = std::to_string(rows) + "x" + std::to_string(cols) +
            " " + std::string(c10::toString(dtype)) +
            (bwd ? " dgelu" : " gelu");
        const auto fp8 = bwd ? torch::kFloat8_e5m2 : torch::kFloat8_e4m3fn;
        // A unit of the operand's type, relative (2^-7 of the value for
        // bf16).
        const double unit = dtype == torch::kBFloat16 ? 1.0 / 128
            : dtype == torch::kHalf                   ? 1.0 / 1024
                                                      : 1e-5;
        // Current scaling: the amax (so the scale), every byte, the sums.
        const auto fused =
            fp8_cast_tensorwise_cuda(x, fp8, true, true, true, op, aux);
        const auto plain =
            fp8_cast_tensorwise_cuda(source, fp8, true, true, true);
        EXPECT_TRUE(
            torch::allclose(fused.inverse_scale, plain.inverse_scale, unit, 0))
            << what;
        expect_within_a_step(
            fused.data,
            fused.inverse_scale,
            plain.data,
            plain.inverse_scale,
            unit,
            0.05,
            what + " (current)");
        EXPECT_TRUE(torch::equal(
            fused.data_t.t().contiguous().view(torch::kUInt8),
            fused.data.view(torch::kUInt8)))
            << what;
        ASSERT_EQ(fused.column_sums.defined(), plain.column_sums.defined())
            << what;
        if (fused.column_sums.defined()) {
          // Sums of up to 256 values, each within a unit of the source's.
          const auto size = source.to(torch::kFloat).abs().sum(0);
          EXPECT_TRUE(((fused.column_sums - plain.column_sums).abs() <=
                       size * unit + 1e-6)
                          .all()
                          .item<bool>())
              << what;
        }
        // Delayed scaling, one scale for all: the recorded amax, and the
        // bytes, nearly all equal.
        const auto f32 = torch::TensorOptions(cuda).dtype(torch::kFloat);
        const auto scale = torch::full({}, 2.0f, f32);
        auto amax_fused = torch::zeros({}, f32);
        auto amax_plain = torch::zeros({}, f32);
        auto amax_aten = torch::zeros({}, f32);
        const auto d_fused = fp8_cast_delayed_cuda(
            x, fp8, scale, amax_fused, true, false, false, op, aux);
        const auto d_plain = fp8_cast_delayed_cuda(
            source, fp8, scale, amax_plain, true, false, false);
        const auto d_aten = fp8_cast_delayed_cuda(
            aten, fp8, scale, amax_aten, true, false, false);
        EXPECT_TRUE(torch::allclose(amax_fused, amax_plain, unit, 0)) << what;
        expect_within_a_step(
            d_fused.data,
            d_fused.inverse_scale,
            d_plain.data,
            d_plain.inverse_scale,
            0,
            0.002,
            what + " (delayed)");
        if (bwd) {
          EXPECT_LE(
              differing(d_fused.data, d_plain.data),
              differing(d_aten.data, d_plain.data))
              << what << ": farther from the exact values than ATen's op";
        }
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

// On a GPU the casts' GELU has the faster tanh and its derivative the
// form without cancellation (above): an FP8 byte of the hidden activations
// or their gradient one step off now and then (12 % of that value), the
// small derivatives of negative pre-activations closer to exact, nothing
// more.
TEST(Fp8GeluMlpGpu, IsTheThreeFp8OpsWithinTheCastsRounding) {
  LAMP_SKIP_WITHOUT_CUDA();
  expect_same_runs(torch::Device(torch::kCUDA), torch::kBFloat16, 0.02);
  expect_same_runs(torch::Device(torch::kCUDA), std::nullopt, 0.02);
}

#endif

} // namespace

} // namespace fp8_gelu_mlp_test
