// lamp::nn::max_pool2d: on the CPU it is torch::max_pool2d; on CUDA
// channels-last fp16/bf16 it runs lamp's own kernels, compared here bit for
// bit with ATen's forward and backward (ties, NaN and -inf included).

#include "support.h"

#include <lamp/config.h>
#include <lamp/nn/max_pool.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace max_pool_test {

namespace {

struct Pool {
  int64_t kernel = 3;
  int64_t stride = 2;
  int64_t padding = 1;
};

// y and dx of max_pool2d for input x and output gradient dy.
std::pair<torch::Tensor, torch::Tensor> pool_and_grad(
    const torch::Tensor& x,
    const torch::Tensor& dy,
    bool lamp_pool,
    Pool p = {}) {
  auto input = x.detach().clone().requires_grad_(true);
  auto y = lamp_pool
      ? lamp::nn::max_pool2d(input, p.kernel, p.stride, p.padding)
      : torch::max_pool2d(input, p.kernel, p.stride, p.padding);
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

// Equal, NaN where NaN.
bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
      a.scalar_type() == b.scalar_type() &&
      ((a == b) | (a.isnan() & b.isnan())).all().item<bool>();
}

// Channels-last fp16/bf16 of few levels, so that windows tie often, with
// some NaN and -inf: where ATen's choice of maximum is easiest to miss.
torch::Tensor tied_input(std::vector<int64_t> sizes, torch::ScalarType dtype) {
  auto x = torch::randint(-2, 3, sizes, torch::kCUDA).to(torch::kFloat);
  const auto u = torch::rand(sizes, torch::kCUDA);
  x.masked_fill_(u < 0.01, std::numeric_limits<float>::quiet_NaN());
  x.masked_fill_(u > 0.99, -std::numeric_limits<float>::infinity());
  return x.to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
}

// Output and input gradient equal ATen's bit for bit: ResNet's stem (eight
// channels a thread), odd sizes, channel counts that are not multiples of 8
// (one a thread), other windows.
TEST_F(MaxPoolGpu, EqualsATenBitForBit) {
  torch::manual_seed(1);
  struct Case {
    std::vector<int64_t> sizes;
    Pool pool;
  };
  const Case cases[] = {
      {{8, 64, 112, 112}, {3, 2, 1}},
      {{3, 24, 17, 13}, {3, 2, 1}},
      {{2, 5, 9, 11}, {3, 1, 1}},
      {{2, 12, 10, 10}, {2, 2, 0}},
      {{2, 16, 15, 16}, {5, 3, 2}},
      {{1, 8, 3, 3}, {3, 2, 1}}};
  int64_t nan_outputs = 0;
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const auto& c : cases) {
      const auto x = tied_input(c.sizes, dtype);
      const auto out =
          torch::max_pool2d(x, c.pool.kernel, c.pool.stride, c.pool.padding);
      const auto dy = torch::randn(out.sizes(), torch::kCUDA)
                          .to(dtype)
                          .contiguous(torch::MemoryFormat::ChannelsLast);
      const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true, c.pool);
      const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false, c.pool);
      EXPECT_TRUE(same(y1, y2)) << dtype << " " << x.sizes();
      EXPECT_TRUE(same(dx1, dx2)) << dtype << " " << x.sizes();
      nan_outputs += y2.isnan().sum().item<int64_t>();
    }
  }
  EXPECT_GT(nan_outputs, 0); // NaN was in play
}

// Past 2^30 padded input elements the kernels index in 64 bits: still
// ATen's results (an 8-channel 11590 x 11590 fp16 image, 2.1 GB).
TEST_F(MaxPoolGpu, LargeInputIndexesIn64Bits) {
  torch::manual_seed(4);
  const auto x = tied_input({1, 8, 11590, 11590}, torch::kHalf);
  const auto dy = torch::randn({1, 8, 5795, 5795}, torch::kCUDA)
                      .to(torch::kHalf)
                      .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
  const auto [y2, dx2] = pool_and_grad(x, dy, /*lamp_pool=*/false);
  EXPECT_TRUE(same(y1, y2));
  EXPECT_TRUE(same(dx1, dx2));
}

// A gradient in NCHW layout (what a transposing op may hand back) gives the
// same input gradient.
TEST_F(MaxPoolGpu, AnyGradientLayout) {
  torch::manual_seed(2);
  const auto x = tied_input({4, 32, 20, 20}, torch::kHalf);
  const auto dy = torch::randn({4, 32, 10, 10}, torch::kCUDA).to(torch::kHalf);
  const auto [y1, dx1] = pool_and_grad(x, dy, /*lamp_pool=*/true);
  const auto [y2, dx2] = pool_and_grad(
      x, dy.contiguous(torch::MemoryFormat::ChannelsLast), /*lamp_pool=*/true);
  EXPECT_TRUE(same(dx1, dx2));
}

#if LAMP_WITH_CUDA
// What forward keeps for backward: one byte per output element, not the
// input, output or int64 indices.
TEST_F(MaxPoolGpu, SavesOneByteAnOutputElement) {
  const auto x = torch::randn({16, 64, 112, 112}, torch::kCUDA)
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast)
                     .requires_grad_();
  const auto allocated = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
        .allocated_bytes[0]
        .current;
  };
  const auto before = allocated();
  auto y = lamp::nn::max_pool2d(x, 3, 2, 1);
  const auto outputs = y.numel();
  const auto with_output = allocated() - before;
  y = torch::Tensor(); // the graph keeps only what backward needs
  EXPECT_EQ(with_output, outputs * 2 + outputs);
  // y's grad_fn is gone with y: nothing of the forward stays.
  EXPECT_EQ(allocated(), before);
}
#endif // LAMP_WITH_CUDA

TEST_F(MaxPoolGpu, OtherInputsTakeATensPath) {
  // fp32 and contiguous NCHW fp16: torch::max_pool2d, so ATen's indices.
  const auto x = torch::randn({2, 3, 9, 9}, torch::kCUDA);
  EXPECT_TRUE(torch::equal(
      lamp::nn::max_pool2d(x, 3, 2, 1), torch::max_pool2d(x, 3, 2, 1)));
  const auto h = x.to(torch::kHalf);
  EXPECT_TRUE(torch::equal(
      lamp::nn::max_pool2d(h, 3, 2, 1), torch::max_pool2d(h, 3, 2, 1)));
}

// lamp's kernels have no double backward: a clear error, not a second
// derivative silently missing.
TEST_F(MaxPoolGpu, NoDoubleBackward) {
  const auto x = torch::randn({1, 8, 6, 6}, torch::kCUDA)
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast)
                     .requires_grad_();
  const auto y = lamp::nn::max_pool2d(x, 3, 2, 1);
  lamp::test::expect_error(
      [&] {
        torch::autograd::grad(
            {y.sum()},
            {x},
            {},
            /*retain_graph=*/true,
            /*create_graph=*/true);
      },
      "no double backward");
}

} // namespace

} // namespace max_pool_test
