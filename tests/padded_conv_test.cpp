// lamp::nn::padded_conv2d: the same output and gradients as torch::conv2d,
// padded (CUDA, channels-last, 3 channels; fp32 and under autocast) or not.
#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <tuple>

#include "support.h"

namespace {

struct Result {
  torch::Tensor y, dx, dw;
};

// The convolution's output and gradients for the same inputs and dy.
Result run(
    bool padded,
    const torch::Tensor& x0,
    const torch::Tensor& w0,
    std::optional<torch::Dtype> autocast) {
  auto x = x0.detach().clone(at::MemoryFormat::Preserve).requires_grad_();
  auto w = w0.detach().clone(at::MemoryFormat::Preserve).requires_grad_();
  torch::Tensor y;
  {
    std::optional<lamp::AutocastGuard> guard;
    if (autocast) {
      guard.emplace(x.device().type(), *autocast);
    }
    y = padded ? lamp::nn::padded_conv2d(x, w, {}, 2, 3)
               : torch::conv2d(x, w, {}, 2, 3);
  }
  torch::manual_seed(1);
  y.backward(torch::randn_like(y));
  return {y.detach(), x.grad(), w.grad()};
}

// Largest difference relative to the largest magnitude: the two paths may
// run different cuDNN kernels (TF32 in fp32), summing in other orders.
double error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto fa = a.to(torch::kFloat);
  const auto fb = b.to(torch::kFloat);
  return (fa - fb).abs().max().item<double>() / fb.abs().max().item<double>();
}

void expect_close(const Result& a, const Result& b, double tol) {
  EXPECT_EQ(a.y.scalar_type(), b.y.scalar_type());
  EXPECT_EQ(a.y.sizes(), b.y.sizes());
  EXPECT_EQ(a.dx.sizes(), b.dx.sizes());
  EXPECT_EQ(a.dw.sizes(), b.dw.sizes());
  EXPECT_LE(error(a.y, b.y), tol) << "output";
  EXPECT_LE(error(a.dx, b.dx), tol) << "input gradient";
  EXPECT_LE(error(a.dw, b.dw), tol) << "weight gradient";
}

TEST(PaddedConv, IsPlainConv2dOnTheCpu) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 3, 20, 20})
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto w = torch::randn({8, 3, 7, 7});
  const auto a = run(true, x, w, std::nullopt);
  const auto b = run(false, x, w, std::nullopt);
  EXPECT_TRUE(torch::equal(a.y, b.y));
  EXPECT_TRUE(torch::equal(a.dx, b.dx));
  EXPECT_TRUE(torch::equal(a.dw, b.dw));
}

class PaddedConvGpu : public lamp::test::GpuTest {};

TEST_F(PaddedConvGpu, EqualsConv2dInFp32AndUnderAutocast) {
  torch::manual_seed(0);
  const auto options = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto x = torch::randn({4, 3, 32, 32}, options)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto w = torch::randn({64, 3, 7, 7}, options)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  // fp32: cuDNN may pick other kernels for 3 and 4 channels (TF32 too).
  expect_close(
      run(true, x, w, std::nullopt), run(false, x, w, std::nullopt), 5e-3);
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(testing::Message() << dtype);
    const auto a = run(true, x, w, dtype);
    const auto b = run(false, x, w, dtype);
    EXPECT_EQ(a.y.scalar_type(), dtype);
    EXPECT_TRUE(a.y.is_contiguous(torch::MemoryFormat::ChannelsLast));
    expect_close(a, b, dtype == torch::kHalf ? 5e-3 : 3e-2);
  }
}

TEST_F(PaddedConvGpu, OtherInputsTakeThePlainConvolution) {
  const auto options = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto nchw = torch::randn({2, 3, 16, 16}, options); // not NHWC
  const auto four = torch::randn({2, 4, 16, 16}, options)
                        .contiguous(torch::MemoryFormat::ChannelsLast);
  for (const auto& x : {nchw, four}) {
    const auto w = torch::randn({8, x.size(1), 7, 7}, options);
    EXPECT_TRUE(torch::equal(
        lamp::nn::padded_conv2d(x, w, {}, 2, 3),
        torch::conv2d(x, w, {}, 2, 3)));
  }
}

} // namespace
