// lamp::nn::max_pool2d: on the CPU it is torch::max_pool2d; on CUDA
// channels-last fp16/bf16 it runs cuDNN's max pooling, compared here with
// ATen's forward and backward on ResNet's stem shape.

#include "support.h"

#include <lamp/nn/max_pool.h>
#include <torch/torch.h>

#include <iostream>

namespace {

// y and dx of max_pool2d (3, 2, 1) for input x and output gradient dy.
std::pair<torch::Tensor, torch::Tensor> pool_and_grad(
    const torch::Tensor& x,
    const torch::Tensor& dy,
    bool lamp_pool) {
  auto input = x.detach().clone().requires_grad_(true);
  auto y = lamp_pool ? lamp::nn::max_pool2d(input, 3, 2, 1)
                     : torch::max_pool2d(input, 3, 2, 1);
  y.backward(dy);
  return {y.detach(), input.grad()};
}

TEST(MaxPool, IsATensOnTheCpu) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 5, 13, 12}, torch::kDouble);
  const auto dy = torch::randn({2, 5, 7, 6}, torch::kDouble);
  const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
  const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
  EXPECT_TRUE(torch::equal(y1, y2));
  EXPECT_TRUE(torch::equal(dx1, dx2));
}

TEST(MaxPool, BadArgumentsAreClearErrors) {
  const auto x = torch::randn({1, 1, 8, 8});
  lamp::test::expect_error(
      [&] { lamp::nn::max_pool2d(x, 3, 2, 2); },
      "0 <= padding <= kernel_size / 2; got kernel_size 3, stride 2, "
      "padding 2");
  lamp::test::expect_error(
      [&] { lamp::nn::max_pool2d(x, 3, 0, 1); }, "stride > 0");
}

class MaxPoolGpu : public lamp::test::GpuTest {};

// Gradients equal up to the order in which an element's share of
// overlapping windows (up to four) is summed: within two units in the last
// place of the dtype. Prints how many differ at all.
void expect_same_gradient(
    const torch::Tensor& a,
    const torch::Tensor& b,
    const char* what) {
  const double ulp = a.scalar_type() == torch::kHalf ? 1.0 / 1024 : 1.0 / 128;
  std::cout << what << " (" << a.scalar_type()
            << "): " << a.ne(b).to(torch::kDouble).mean().item<double>()
            << " of the elements differ\n";
  EXPECT_TRUE(
      torch::allclose(a.to(torch::kFloat), b.to(torch::kFloat), 2 * ulp, 1e-6))
      << what << ": largest difference "
      << (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max().item<float>();
}

// Values that no 3x3 window repeats (a per-plane permutation of 9 levels
// by (row % 3, column % 3)), negative ones included, so that the padding
// counts as -inf and the argmax is unique: forward and backward must equal
// ATen's exactly.
TEST_F(MaxPoolGpu, EqualsATenWhereEveryWindowHasOneMaximum) {
  torch::manual_seed(1);
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    const int64_t n = 8, c = 64, h = 112, w = 112;
    const auto levels =
        torch::rand({n, c, 9}).argsort(/*dim=*/int64_t{-1}).to(torch::kFloat);
    const auto rows = torch::arange(h).remainder(3).view({h, 1});
    const auto cols = torch::arange(w).remainder(3).view({1, w});
    const auto slot = (rows * 3 + cols).view({1, 1, h * w}).expand({n, c, -1});
    const auto x = (levels.gather(2, slot).view({n, c, h, w}) - 4.0)
                       .to(torch::kCUDA, dtype)
                       .contiguous(torch::MemoryFormat::ChannelsLast);
    const auto dy = torch::randn({n, c, 56, 56}, torch::kCUDA)
                        .to(dtype)
                        .contiguous(torch::MemoryFormat::ChannelsLast);
    const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
    const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
    EXPECT_TRUE(y1.is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::equal(y1, y2)) << dtype;
    expect_same_gradient(dx1, dx2, "input gradient");
  }
}

// ResNet's case: the input is a ReLU's output, so windows of zeros tie. The
// gradient may go to another zero than ATen's; the ReLU's backward then
// drops it. What reaches the layer below must be equal.
TEST_F(MaxPoolGpu, TiesAfterAReluReachTheSameGradientThroughIt) {
  torch::manual_seed(2);
  const auto x = torch::relu(torch::randn({16, 64, 112, 112}, torch::kCUDA))
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto dy = torch::randn({16, 64, 56, 56}, torch::kCUDA)
                      .to(torch::kHalf)
                      .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
  const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
  EXPECT_TRUE(torch::equal(y1, y2));
  const auto positive = x > 0;
  std::cout << "all elements: "
            << dx1.ne(dx2).to(torch::kDouble).mean().item<double>()
            << " differ\n";
  expect_same_gradient(dx1 * positive, dx2 * positive, "behind the ReLU");
  // Every output's gradient lands somewhere: the sums agree.
  EXPECT_NEAR(
      dx1.to(torch::kDouble).sum().item<double>(),
      dx2.to(torch::kDouble).sum().item<double>(),
      1e-3 * dy.to(torch::kDouble).abs().sum().item<double>());
}

TEST_F(MaxPoolGpu, OtherInputsTakeATensPath) {
  // fp32 and contiguous NCHW fp16: torch::max_pool2d, so ATen's indices.
  const auto x = torch::randn({2, 3, 9, 9}, torch::kCUDA);
  EXPECT_TRUE(torch::equal(
      lamp::nn::max_pool2d(x, 3, 2, 1), torch::max_pool2d(x, 3, 2, 1)));
  const auto h = x.to(torch::kHalf);
  EXPECT_TRUE(torch::equal(
      lamp::nn::max_pool2d(h, 3, 2, 1), torch::max_pool2d(h, 3, 2, 1)));
}

} // namespace
