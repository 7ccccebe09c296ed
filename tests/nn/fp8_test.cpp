// lamp::Fp8AutocastGuard and lamp::nn::Linear's FP8 GEMMs: tensorwise
// scales as torchao and Transformer Engine define them (fp8 max / amax,
// saturated casts); the forward output and both gradients equal to the
// GEMMs of the dequantised operands; nothing changes outside the scope; a
// non-finite input stays visible; a small model trains in FP8 as in bf16.
// On a GPU: the same against cuBLASLt's FP8 GEMMs, with and without fast
// accumulation in the forward GEMM, and inside GraphedStep.

#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/fp8.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "nn/fp8_linear.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp8_test {

namespace {

using lamp::nn::detail::quantize_tensorwise;

torch::Tensor dequantised(const torch::Tensor& x, torch::ScalarType fp8) {
  auto [data, inv] = quantize_tensorwise(x, fp8);
  return data.to(torch::kFloat) * inv;
}

double rel_max_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble);
  const auto y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).abs().max() / y.abs().max()).item<double>();
}

TEST(Fp8, TensorwiseScalesAreFp8MaxOverAmax) {
  torch::manual_seed(0);
  const auto x = torch::randn({64, 32}) * 3;
  for (const auto [fp8, max] :
       {std::tuple{torch::kFloat8_e4m3fn, 448.0},
        std::tuple{torch::kFloat8_e5m2, 57344.0}}) {
    auto [data, inv] = quantize_tensorwise(x, fp8);
    EXPECT_EQ(data.scalar_type(), fp8);
    const double amax = x.abs().max().item<double>();
    EXPECT_FLOAT_EQ(inv.item<float>(), static_cast<float>(amax / max));
    // The largest element lands on the format's largest value.
    EXPECT_EQ(data.to(torch::kFloat).abs().max().item<double>(), max);
    // Round to nearest: e4m3 keeps 3 mantissa bits, e5m2 2 (half an ulp of
    // relative error for normal numbers).
    const auto back = data.to(torch::kFloat) * inv;
    const double half_ulp = fp8 == torch::kFloat8_e4m3fn ? 1.0 / 16 : 1.0 / 8;
    const auto normal = x.abs() > amax / 64;
    EXPECT_LE(
        ((back - x).abs() / x.abs()).masked_select(normal).max().item<double>(),
        half_ulp + 1e-6);
  }
  // An all-zero tensor: scale from torchao's eps, data zero, no NaN.
  auto [zeros, inv] =
      quantize_tensorwise(torch::zeros({4}), torch::kFloat8_e4m3fn);
  EXPECT_TRUE(zeros.to(torch::kFloat).eq(0).all().item<bool>());
  EXPECT_TRUE(std::isfinite(inv.item<double>()));
}

// y = x W^T + b and its gradients, in FP8 under CPU bf16 autocast, against
// fp32 GEMMs of the dequantised operands (what the FP8 GEMM computes,
// before rounding its output).
void expect_gemms_of_dequantised_operands(torch::Device device) {
  torch::manual_seed(1);
  lamp::nn::Linear fc(32, 48);
  fc->to(device);
  const auto x = torch::randn({4, 8, 32}, device).requires_grad_();
  const auto gy = torch::randn({4, 8, 48}, device);
  torch::Tensor y;
  {
    lamp::AutocastGuard autocast(device.type(), torch::kBFloat16);
    lamp::Fp8AutocastGuard fp8;
    y = fc(x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  y.backward(gy.to(torch::kBFloat16));

  // The input is cast to autocast's dtype first, as torchao does.
  const auto xq = dequantised(
      x.detach().to(torch::kBFloat16).reshape({-1, 32}), torch::kFloat8_e4m3fn);
  const auto wq = dequantised(fc->weight.detach(), torch::kFloat8_e4m3fn);
  const auto gq = dequantised(
      gy.to(torch::kBFloat16).reshape({-1, 48}), torch::kFloat8_e5m2);
  const auto y_ref = xq.matmul(wq.t()) + fc->bias.detach();
  // bf16 output: within two bf16 ulps (2^-7) of the largest value: the GEMM
  // is rounded to bf16, then the bf16 bias added and rounded again.
  EXPECT_LT(rel_max_error(y.reshape({-1, 48}), y_ref), 8e-3);
  const auto dx_ref = gq.matmul(wq).reshape({4, 8, 32});
  EXPECT_LT(rel_max_error(x.grad(), dx_ref), 8e-3);
  EXPECT_EQ(fc->weight.grad().scalar_type(), torch::kFloat);
  // NOTE: an fp32 output, but Hopper's FP8 tensor cores accumulate with
  // fewer bits than fp32 (measured 9e-5 on an H100; the CPU: 1e-7).
  EXPECT_LT(
      rel_max_error(fc->weight.grad(), gq.t().matmul(xq)),
      device.is_cuda() ? 1e-3 : 1e-5);
  // The bias's gradient in high precision, from the unquantised gradient.
  EXPECT_LT(
      rel_max_error(
          fc->bias.grad(),
          gy.to(torch::kBFloat16).to(torch::kFloat).sum(at::IntArrayRef{0, 1})),
      1e-6);
}

TEST(Fp8, LinearIsTheGemmsOfTheDequantisedOperands) {
  expect_gemms_of_dequantised_operands(torch::kCPU);
}

TEST(Fp8, OutsideTheScopeNothingChanges) {
  torch::manual_seed(2);
  lamp::nn::Linear fc(32, 16);
  const auto x = torch::randn({5, 32});
  const auto plain = at::linear(x, fc->weight, fc->bias);
  EXPECT_TRUE(torch::equal(fc(x), plain));
  {
    lamp::Fp8AutocastGuard off(lamp::Fp8Recipe(), /*enabled=*/false);
    EXPECT_FALSE(lamp::Fp8AutocastGuard::is_enabled());
    EXPECT_TRUE(torch::equal(fc(x), plain));
  }
  {
    lamp::Fp8AutocastGuard on;
    EXPECT_TRUE(lamp::Fp8AutocastGuard::is_enabled());
    EXPECT_FALSE(torch::equal(fc(x), plain)); // FP8 rounds
  }
  EXPECT_FALSE(lamp::Fp8AutocastGuard::is_enabled()); // restored
}

// An inf in the input gives a zero scale and a non-finite output, which a
// GradScaler (fp16) then sees, as without FP8.
TEST(Fp8, ANonFiniteInputMakesANonFiniteOutput) {
  lamp::nn::Linear fc(32, 16);
  auto x = torch::randn({4, 32});
  x[1][3] = std::numeric_limits<float>::infinity();
  lamp::Fp8AutocastGuard fp8;
  EXPECT_FALSE(torch::isfinite(fc(x)).all().item<bool>());
}

// A small MLP on a teacher's labels: FP8 (bf16 autocast + FP8 GEMMs)
// learns as bf16 does, with current and with delayed scales.
TEST(Fp8, AModelTrainsInFp8AsInBf16) {
  auto train = [](bool fp8, lamp::Fp8Recipe recipe = {}) {
    torch::manual_seed(3);
    torch::nn::Sequential net(
        lamp::nn::Linear(32, 64), torch::nn::ReLU(), lamp::nn::Linear(64, 16));
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(3e-3));
    // NOTE: 128 rows and 60 steps: ATen's CPU _scaled_mm is slow (~50 ms a
    // call at 256 rows); the loss is still falling, so FP8 and bf16 are
    // compared on the way down, not both at ~0.
    const auto x = torch::randn({128, 32});
    const auto y = x.matmul(torch::randn({32, 16})).argmax(1);
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
        lamp::Fp8AutocastGuard scope(recipe, fp8);
        loss = torch::cross_entropy_loss(net->forward(x).to(torch::kFloat), y);
      }
      loss.backward();
      opt.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    return std::pair{first, last};
  };
  const auto [first16, last16] = train(false);
  EXPECT_LT(last16, 0.5 * first16);
  for (const auto scaling :
       {lamp::Fp8Scaling::kCurrent, lamp::Fp8Scaling::kDelayed}) {
    const auto [first8, last8] =
        train(true, lamp::Fp8Recipe().scaling(scaling).amax_history_len(16));
    EXPECT_LT(last8, 0.5 * first8);
    EXPECT_NEAR(last8, last16, 0.1 * last16 + 0.02);
  }
}

TEST(Fp8Gpu, LinearIsTheGemmsOfTheDequantisedOperands) {
  LAMP_SKIP_WITHOUT_CUDA();
  expect_gemms_of_dequantised_operands(torch::kCUDA);
}

// Fp8Recipe::fast_accum_forward changes the forward GEMM only: either way
// the output is the GEMM of the dequantised operands (to bf16 rounding), and
// the gradients are the same bits.
TEST(Fp8Gpu, FastAccumulationIsTheForwardGemmsOnly) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(6);
  // A long reduction (K = 4,096), where the accumulators' precision shows.
  lamp::nn::Linear fc(4096, 256);
  fc->to(cuda);
  const auto x0 = torch::randn({512, 4096}, cuda);
  const auto gy = torch::randn({512, 256}, cuda).to(torch::kBFloat16);
  auto run = [&](bool fast) {
    fc->zero_grad();
    const auto x = x0.clone().requires_grad_();
    torch::Tensor y;
    {
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      lamp::Fp8AutocastGuard fp8(lamp::Fp8Recipe().fast_accum_forward(fast));
      y = fc(x);
    }
    y.backward(gy);
    return std::make_tuple(
        y.detach(), x.grad().clone(), fc->weight.grad().clone());
  };
  const auto [y_fast, dx_fast, dw_fast] = run(true);
  const auto [y_exact, dx_exact, dw_exact] = run(false);
  const auto xq = dequantised(x0.to(torch::kBFloat16), torch::kFloat8_e4m3fn);
  const auto wq = dequantised(fc->weight.detach(), torch::kFloat8_e4m3fn);
  const auto y_ref = xq.matmul(wq.t()) + fc->bias.detach();
  EXPECT_LT(rel_max_error(y_fast, y_ref), 8e-3);
  EXPECT_LT(rel_max_error(y_exact, y_ref), 8e-3);
  EXPECT_TRUE(torch::equal(dx_fast, dx_exact));
  EXPECT_TRUE(torch::equal(dw_fast, dw_exact));
}

// The scales live on the device (no host sync), so a step with FP8 GEMMs
// is captured and replayed like any other.
TEST(Fp8Gpu, GraphedStepsEqualEagerSteps) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(4);
  const auto x = torch::randn({64, 32}, cuda);
  const auto y = torch::randn({64, 16}, cuda);
  auto train = [&](bool graphed) {
    torch::manual_seed(5);
    torch::nn::Sequential net(
        lamp::nn::Linear(32, 64), torch::nn::ReLU(), lamp::nn::Linear(64, 16));
    net->to(cuda);
    lamp::optim::FusedAdamW opt(
        net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto step = [&](const std::vector<torch::Tensor>& in) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        lamp::Fp8AutocastGuard fp8;
        loss = (net->forward(in[0]).to(torch::kFloat) - in[1]).pow(2).mean();
      }
      loss.backward();
      opt.step();
      return loss.detach();
    };
    lamp::test::run_steps(graphed, step, {x, y}, opt);
    return net->parameters()[0].detach().clone();
  };
  const auto eager = train(false);
  const auto graphed = train(true);
  EXPECT_LT(rel_max_error(graphed, eager), 1e-5);
}

} // namespace

} // namespace fp8_test
