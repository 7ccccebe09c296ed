// lamp::nn::space_to_depth_conv2d: a stride-2 convolution computed as a
// stride-1 convolution of the input's 2x2 space-to-depth rearrangement.
// Compared with torch::conv2d in float64 on the CPU (every size parity of
// input and kernel, the gradients of both operands), under autocast (the
// input cast inside the rearrangement, as if cast first), and on a GPU:
// the rearrangement kernel against ATen's pixel_unshuffle bit for bit, and
// ResNet-50's stem in bf16 under autocast (no further from float64 than
// torch::conv2d).

#include "support.h"

#include <lamp/autocast.h>
#include <lamp/config.h>
#include <lamp/nn/space_to_depth_conv.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#if LAMP_WITH_CUDA
#include "nn/space_to_depth_cuda.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace space_to_depth_conv_test {

namespace {

struct Result {
  torch::Tensor out, input, weight;
};

Result run(
    const torch::Tensor& x,
    const torch::Tensor& w,
    int64_t padding,
    bool rearranged,
    const torch::Tensor& dy) {
  auto input = x.detach().clone().requires_grad_(true);
  auto weight = w.detach().clone().requires_grad_(true);
  auto out = rearranged
      ? lamp::nn::space_to_depth_conv2d(input, weight, padding)
      : torch::conv2d(input, weight, {}, /*stride=*/2, padding);
  out.backward(dy);
  return {out.detach(), input.grad(), weight.grad()};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble))
      .abs()
      .max()
      .item<double>();
}

TEST(SpaceToDepthConv, EqualsTheStrideTwoConvolutionInFloat64) {
  torch::manual_seed(0);
  struct Case {
    int64_t channels, out_channels, kernel_h, kernel_w, padding, h, w;
  };
  // ResNet's stem; odd and even kernels and padded sizes (the rearranged
  // output one row longer, cut off); 4 * C already a multiple of 8; no
  // padding; a kernel as large as the padded input.
  const std::vector<Case> cases = {
      {3, 8, 7, 7, 3, 30, 30},
      {3, 5, 3, 3, 1, 17, 16},
      {1, 4, 4, 4, 1, 15, 15},
      {2, 6, 5, 2, 0, 20, 13},
      {4, 3, 1, 1, 0, 9, 10},
      {3, 2, 6, 6, 1, 4, 5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(
        "C " + std::to_string(c.channels) + " k " + std::to_string(c.kernel_h) +
        "x" + std::to_string(c.kernel_w) + " p " + std::to_string(c.padding) +
        " " + std::to_string(c.h) + "x" + std::to_string(c.w));
    const auto opts = torch::dtype(torch::kDouble);
    const auto x = torch::randn({2, c.channels, c.h, c.w}, opts);
    const auto w = torch::randn(
        {c.out_channels, c.channels, c.kernel_h, c.kernel_w}, opts);
    const auto ref_out = torch::conv2d(x, w, {}, /*stride=*/2, c.padding);
    const auto dy = torch::randn(ref_out.sizes(), opts);
    const Result ref = run(x, w, c.padding, /*rearranged=*/false, dy);
    const Result got = run(x, w, c.padding, /*rearranged=*/true, dy);
    ASSERT_EQ(got.out.sizes(), ref.out.sizes());
    EXPECT_TRUE(got.out.is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_LT(max_diff(got.out, ref.out), 1e-12);
    ASSERT_EQ(got.input.sizes(), x.sizes());
    EXPECT_LT(max_diff(got.input, ref.input), 1e-12);
    ASSERT_EQ(got.weight.sizes(), w.sizes());
    EXPECT_LT(max_diff(got.weight, ref.weight), 1e-10);
  }
}

TEST(SpaceToDepthConv, GradientsKeepTheOperandsLayouts) {
  torch::manual_seed(1);
  const auto opts = torch::dtype(torch::kDouble);
  const auto x = torch::randn({2, 3, 16, 16}, opts)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto w = torch::randn({4, 3, 3, 3}, opts);
  const auto dy = torch::randn({2, 4, 8, 8}, opts);
  const Result got = run(x, w, 1, /*rearranged=*/true, dy);
  EXPECT_TRUE(got.input.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(got.weight.is_contiguous());
  // Only the weight needs a gradient: the input's is not computed; and
  // the other way round.
  auto weight = w.clone().requires_grad_(true);
  lamp::nn::space_to_depth_conv2d(x, weight, 1).backward(dy);
  EXPECT_LT(max_diff(weight.grad(), got.weight), 1e-12);
  auto input = x.clone().requires_grad_(true);
  lamp::nn::space_to_depth_conv2d(input, w, 1).backward(dy);
  EXPECT_LT(max_diff(input.grad(), got.input), 1e-12);
}

TEST(SpaceToDepthConv, BadArgumentsAreClearErrors) {
  const auto x = torch::randn({1, 3, 8, 8});
  EXPECT_THROW(
      lamp::nn::space_to_depth_conv2d(x, torch::randn({4, 2, 3, 3})),
      c10::ValueError);
  EXPECT_THROW(
      lamp::nn::space_to_depth_conv2d(x[0], torch::randn({4, 3, 3, 3})),
      c10::ValueError);
  EXPECT_THROW(
      lamp::nn::space_to_depth_conv2d(x, torch::randn({4, 3, 9, 9})),
      c10::ValueError);
  EXPECT_THROW(
      lamp::nn::space_to_depth_conv2d(x, torch::randn({4, 3, 3, 3}), -1),
      c10::ValueError);
  EXPECT_THROW(
      lamp::nn::space_to_depth_conv2d(
          x, torch::randn({4, 3, 3, 3}, torch::kDouble)),
      c10::ValueError);
}

// Under autocast the input is cast in the rearrangement, not before it:
// the same output and gradients as for the input cast first, the input's
// gradient in the input's dtype.
void expect_autocast_casts_the_input(torch::Device device, torch::Dtype dtype) {
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions(device);
  const auto x = torch::randn({2, 3, 19, 18}, opts)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto w = torch::randn({8, 3, 7, 7}, opts) * 0.1;
  const auto dy = torch::randn({2, 8, 10, 9}, opts).to(dtype);
  Result got, cast_first;
  {
    lamp::AutocastGuard autocast(device.type(), dtype);
    got = run(x, w, 3, /*rearranged=*/true, dy);
    cast_first = run(x.to(dtype), w, 3, /*rearranged=*/true, dy);
  }
  EXPECT_EQ(got.out.scalar_type(), dtype);
  EXPECT_TRUE(torch::equal(got.out, cast_first.out));
  EXPECT_EQ(got.input.scalar_type(), torch::kFloat);
  EXPECT_TRUE(got.input.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::equal(got.input, cast_first.input.to(torch::kFloat)));
  EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
  EXPECT_LT(max_diff(got.weight, cast_first.weight), 1e-6);
}

TEST(SpaceToDepthConv, AutocastCastsTheInputInTheRearrangement) {
  expect_autocast_casts_the_input(torch::kCPU, torch::kBFloat16);
}

TEST(SpaceToDepthConv, NoDoubleBackward) {
  auto x = torch::randn({1, 3, 8, 8}, torch::requires_grad());
  auto w = torch::randn({4, 3, 3, 3}, torch::requires_grad());
  auto out = lamp::nn::space_to_depth_conv2d(x, w, 1);
  EXPECT_THROW(
      torch::autograd::grad(
          {out.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
      c10::Error);
}

class SpaceToDepthConvGpu : public lamp::test::GpuTest {};

#if LAMP_WITH_CUDA
// The CUDA kernel's rearrangement (pad, cast, space-to-depth, zero
// channels) equals ATen's ops bit for bit: every dtype pair, three input
// layouts, channel counts with and without zero channels, odd sizes.
TEST_F(SpaceToDepthConvGpu, KernelEqualsPaddedPixelUnshuffle) {
  torch::manual_seed(4);
  struct Case {
    int64_t n, c, h, w, pad;
  };
  const std::vector<Case> cases = {
      {2, 3, 9, 11, 3}, {1, 1, 8, 8, 0}, {3, 4, 7, 6, 2}, {2, 5, 5, 5, 1}};
  const std::vector<torch::Dtype> dtypes = {
      torch::kFloat, torch::kHalf, torch::kBFloat16};
  for (const Case& c : cases) {
    for (const auto in : dtypes) {
      for (const auto out : dtypes) {
        for (int layout = 0; layout < 3; ++layout) {
          SCOPED_TRACE(
              "C " + std::to_string(c.c) + " " + std::to_string(c.h) + "x" +
              std::to_string(c.w) + " pad " + std::to_string(c.pad) +
              " layout " + std::to_string(layout) + " in " + c10::toString(in) +
              " out " + c10::toString(out));
          auto x = torch::randn({c.n, c.c, c.h, c.w + 1}, torch::kCUDA)
                       .mul(100)
                       .to(in);
          // NCHW, NHWC, and a view with a column cut off (no dense layout).
          x = layout == 0   ? x.narrow(3, 0, c.w).contiguous()
              : layout == 1 ? x.narrow(3, 0, c.w).contiguous(
                                  torch::MemoryFormat::ChannelsLast)
                            : x.narrow(3, 1, c.w);
          const int64_t h2 = (c.h + 2 * c.pad + 1) / 2;
          const int64_t w2 = (c.w + 2 * c.pad + 1) / 2;
          const int64_t channels = (4 * c.c + 7) / 8 * 8;
          const auto got = lamp::nn::detail::cuda_input_to_depth(
              x, c.pad, h2, w2, channels, out);
          ASSERT_TRUE(got.has_value());
          auto ref = torch::pixel_unshuffle(
              torch::constant_pad_nd(
                  x.to(out),
                  {c.pad, 2 * w2 - c.w - c.pad, c.pad, 2 * h2 - c.h - c.pad}),
              2);
          ref =
              torch::constant_pad_nd(ref, {0, 0, 0, 0, 0, channels - 4 * c.c});
          ASSERT_EQ(got->sizes(), ref.sizes());
          EXPECT_EQ(got->scalar_type(), out);
          EXPECT_TRUE(got->is_contiguous(torch::MemoryFormat::ChannelsLast));
          EXPECT_TRUE(torch::equal(*got, ref));
        }
      }
    }
  }
  // Not for it: fp64, or too few channels for the rearrangement.
  const auto x = torch::randn({1, 3, 4, 4}, torch::kCUDA);
  EXPECT_FALSE(lamp::nn::detail::cuda_input_to_depth(
                   x.to(torch::kDouble), 0, 2, 2, 16, torch::kFloat)
                   .has_value());
  EXPECT_FALSE(
      lamp::nn::detail::cuda_input_to_depth(x, 0, 2, 2, 8, torch::kFloat)
          .has_value());
}
#endif

TEST_F(SpaceToDepthConvGpu, AutocastCastsTheInputInTheRearrangement) {
  expect_autocast_casts_the_input(torch::kCUDA, torch::kBFloat16);
  expect_autocast_casts_the_input(torch::kCUDA, torch::kHalf);
}

// ResNet-50's stem (3 -> 64, 7x7, stride 2, padding 3) in bf16 under
// autocast, channels-last: output and gradients no further from float64
// (on the same bf16 operands) than torch::conv2d's.
TEST_F(SpaceToDepthConvGpu, ResNetStemInBf16UnderAutocast) {
  torch::manual_seed(2);
  const auto x = torch::randn({16, 3, 224, 224}, torch::kCUDA)
                     .to(torch::kBFloat16)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto w = (torch::randn({64, 3, 7, 7}, torch::kCUDA) * 0.05)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  const auto dy = torch::randn({16, 64, 112, 112}, torch::kCUDA)
                      .to(torch::kBFloat16)
                      .contiguous(torch::MemoryFormat::ChannelsLast);
  Result got, plain;
  {
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    got = run(x, w, 3, /*rearranged=*/true, dy);
    plain = run(x, w, 3, /*rearranged=*/false, dy);
  }
  EXPECT_EQ(got.out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(got.out.is_contiguous(torch::MemoryFormat::ChannelsLast));
  // float64 on the operands autocast gave both (w rounded to bf16).
  const auto wb = w.to(torch::kBFloat16);
  const Result ref =
      run(x.to(torch::kDouble),
          wb.to(torch::kDouble),
          3,
          /*rearranged=*/false,
          dy.to(torch::kDouble));
  const auto mean_error = [](const torch::Tensor& a, const torch::Tensor& r) {
    return (a.to(torch::kDouble) - r).abs().mean().item<double>();
  };
  for (const auto& [name, a, b, r] :
       {std::tuple{"output", got.out, plain.out, ref.out},
        std::tuple{"input gradient", got.input, plain.input, ref.input},
        std::tuple{"weight gradient", got.weight, plain.weight, ref.weight}}) {
    const double e_got = mean_error(a, r);
    const double e_plain = mean_error(b, r);
    std::cout << name << ", mean error against float64: rearranged " << e_got
              << ", torch::conv2d " << e_plain << "\n";
    EXPECT_LE(e_got, 1.25 * e_plain + 1e-6) << name;
  }
}

} // namespace

} // namespace space_to_depth_conv_test
