// lamp::nn::global_avg_pool2d: torch::adaptive_avg_pool2d(x, {1, 1}) whose
// backward, for CUDA channels-last input, writes the channels-last gradient
// in one kernel of lamp's; compared here bit for bit with ATen's.

#include "support.h"

#include <lamp/config.h>
#include <lamp/nn/avg_pool.h>
#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <vector>

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace avg_pool_test {

namespace {

// y and dx of the global average pooling of x for output gradient dy.
std::pair<torch::Tensor, torch::Tensor> pool_and_grad(
    const torch::Tensor& x,
    const torch::Tensor& dy,
    bool lamp_pool) {
  auto input = x.detach().clone().requires_grad_(true);
  auto y = lamp_pool ? lamp::nn::global_avg_pool2d(input)
                     : torch::adaptive_avg_pool2d(input, {1, 1});
  y.backward(dy);
  return {y.detach(), input.grad()};
}

TEST(GlobalAvgPool, IsATensOnTheCpu) {
  torch::manual_seed(0);
  for (const auto format :
       {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
    const auto x =
        torch::randn({3, 5, 7, 6}, torch::kDouble).contiguous(format);
    const auto dy = torch::randn({3, 5, 1, 1}, torch::kDouble);
    const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
    const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
    EXPECT_TRUE(torch::equal(y1, y2));
    EXPECT_EQ(y1.strides(), y2.strides());
    EXPECT_TRUE(torch::equal(dx1, dx2));
  }
  // A 3-D (C, H, W) input, as adaptive_avg_pool2d takes.
  const auto x = torch::randn({4, 5, 5});
  EXPECT_TRUE(torch::equal(
      lamp::nn::global_avg_pool2d(x), torch::adaptive_avg_pool2d(x, {1, 1})));
}

TEST(GlobalAvgPool, BadInputIsATensError) {
  // NOTE: the error is ATen's own: a 1-D tensor has no H and W.
  EXPECT_THROW(lamp::nn::global_avg_pool2d(torch::randn({6})), c10::Error);
  EXPECT_THROW(
      torch::adaptive_avg_pool2d(torch::randn({6}), {1, 1}), c10::Error);
}

class GlobalAvgPoolGpu : public lamp::test::GpuTest {};

// Output and input gradient equal ATen's bit for bit for ResNet-50's head
// (64 x 2048 x 7 x 7), channel counts that do and do not take the 16-byte
// path, fp32/fp16/bf16; the gradient is channels-last.
TEST_F(GlobalAvgPoolGpu, EqualsATenBitForBit) {
  torch::manual_seed(0);
  const std::vector<std::vector<int64_t>> shapes = {
      {64, 2048, 7, 7}, {3, 20, 5, 5}, {2, 12, 3, 4}, {1, 8, 1, 1}};
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const auto& sizes : shapes) {
      SCOPED_TRACE(
          testing::Message() << dtype << " " << torch::IntArrayRef(sizes));
      const auto x = torch::randn(sizes, torch::kCUDA)
                         .to(dtype)
                         .contiguous(torch::MemoryFormat::ChannelsLast);
      const auto dy =
          torch::randn({sizes[0], sizes[1], 1, 1}, torch::kCUDA).to(dtype);
      const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
      const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
      EXPECT_TRUE(torch::equal(y1, y2));
      EXPECT_EQ(y1.strides(), y2.strides());
      EXPECT_TRUE(torch::equal(dx1, dx2));
      EXPECT_TRUE(dx1.is_contiguous(torch::MemoryFormat::ChannelsLast));
    }
  }
}

// The gradient arrives in any layout: the (N, C) matrix of a flatten's
// backward, or a transposed one.
TEST_F(GlobalAvgPoolGpu, AnyGradientLayout) {
  torch::manual_seed(1);
  const auto x = torch::randn({4, 16, 5, 5}, torch::kCUDA)
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto dy = torch::randn({16, 4}, torch::kCUDA)
                      .to(torch::kHalf)
                      .t()
                      .unsqueeze(2)
                      .unsqueeze(3); // strides (1, 4, 1, 1)
  const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
  const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
  EXPECT_TRUE(torch::equal(dx1, dx2));
  // And through flatten(1), as ResNet's head uses it.
  auto a = x.detach().clone().requires_grad_(true);
  auto b = x.detach().clone().requires_grad_(true);
  const auto g = torch::randn({4, 16}, torch::kCUDA).to(torch::kHalf);
  lamp::nn::global_avg_pool2d(a).flatten(1).backward(g);
  torch::adaptive_avg_pool2d(b, {1, 1}).flatten(1).backward(g);
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
}

// Backward with create_graph=true runs ATen's ops: a double backward
// (here the gradient of a function of dx with respect to dy) equals ATen's.
TEST_F(GlobalAvgPoolGpu, DoubleBackwardEqualsATens) {
  torch::manual_seed(3);
  const auto x = torch::randn({2, 16, 3, 3}, torch::kCUDA)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto v = torch::randn_like(x);
  const auto g = torch::randn({2, 16, 1, 1}, torch::kCUDA);
  auto second = [&](bool lamp_pool) {
    auto input = x.detach().clone().requires_grad_(true);
    auto dy = g.clone().requires_grad_(true);
    auto y = lamp_pool ? lamp::nn::global_avg_pool2d(input)
                       : torch::adaptive_avg_pool2d(input, {1, 1});
    auto dx = torch::autograd::grad(
        {y}, {input}, {dy}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    (dx * v).sum().backward();
    return dy.grad();
  };
  const auto lamp_grad = second(true);
  ASSERT_TRUE(lamp_grad.defined());
  EXPECT_TRUE(torch::allclose(lamp_grad, second(false)));
}

// Where lamp's kernel does not apply the result is ATen's all the same:
// NCHW input, double, no gradient needed.
TEST_F(GlobalAvgPoolGpu, OtherInputsTakeATensPath) {
  torch::manual_seed(2);
  const auto nchw = torch::randn({2, 8, 6, 6}, torch::kCUDA).to(torch::kHalf);
  const auto dy = torch::randn({2, 8, 1, 1}, torch::kCUDA).to(torch::kHalf);
  auto [y1, dx1] = pool_and_grad(nchw, dy, /*lamp_pool=*/true);
  auto [y2, dx2] = pool_and_grad(nchw, dy, /*lamp_pool=*/false);
  EXPECT_TRUE(torch::equal(dx1, dx2));
  EXPECT_EQ(dx1.strides(), dx2.strides());
  const auto dbl = torch::randn({2, 8, 6, 6}, torch::kCUDA)
                       .to(torch::kDouble)
                       .contiguous(torch::MemoryFormat::ChannelsLast);
  std::tie(y1, dx1) = pool_and_grad(dbl, dy.to(torch::kDouble), true);
  std::tie(y2, dx2) = pool_and_grad(dbl, dy.to(torch::kDouble), false);
  EXPECT_TRUE(torch::equal(dx1, dx2));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(
      lamp::nn::global_avg_pool2d(nchw),
      torch::adaptive_avg_pool2d(nchw, {1, 1})));
}

} // namespace

} // namespace avg_pool_test
