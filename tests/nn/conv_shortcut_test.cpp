// lamp::nn::conv1x1_and_shortcut: a 1x1 convolution whose input also feeds
// a residual shortcut, with the two input gradients summed inside the
// convolution's matrix product. Compared with the unfused block, on the CPU
// (every path of the backward) and on a GPU (fp16 with lamp's fused
// BatchNorm, as in ResNet-50).

#include "support.h"

#include <lamp/autocast.h>
#include <lamp/nn/batch_norm_act.h>
#include <lamp/nn/conv_shortcut.h>
#include <lamp/nn/diagnostics.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace conv_shortcut_test {

namespace {

using lamp::nn::ShortcutGradient;
using lamp::nn::detail::conv_shortcut_gradient_count;

struct Grads {
  torch::Tensor out, input, weight;
};

// Runs `block(conv output, shortcut)` on x and w, fused or not, and returns
// the block's output and the gradients of x and w for output gradient dy.
using Block =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;
Grads run(
    const torch::Tensor& x,
    const torch::Tensor& w,
    const Block& block,
    bool fused,
    const torch::Tensor& dy) {
  auto input = x.detach().clone().requires_grad_(true);
  auto weight = w.detach().clone().requires_grad_(true);
  auto [y, shortcut] = fused ? lamp::nn::conv1x1_and_shortcut(input, weight)
                             : std::pair{torch::conv2d(input, weight), input};
  auto out = block(y, shortcut);
  out.backward(dy);
  return {out.detach(), input.grad(), weight.grad()};
}

torch::Tensor channels_last(torch::Tensor t) {
  return t.contiguous(torch::MemoryFormat::ChannelsLast);
}

void expect_close(const Grads& a, const Grads& b, double tol) {
  EXPECT_TRUE(torch::allclose(a.out, b.out, tol, tol));
  EXPECT_TRUE(torch::allclose(a.input, b.input, tol, tol))
      << (a.input - b.input).abs().max();
  EXPECT_TRUE(torch::allclose(a.weight, b.weight, tol, tol));
  EXPECT_TRUE(a.input.is_contiguous(torch::MemoryFormat::ChannelsLast));
}

// Each way the shortcut's gradient can arrive, in double on the CPU: the
// results equal the unfused block's, and the backward took the expected
// way to sum.
TEST(ConvShortcut, EqualsTheUnfusedBlockOnEveryBackwardPath) {
  torch::manual_seed(0);
  const auto x = channels_last(torch::randn({2, 16, 6, 5}, torch::kDouble));
  const auto w = torch::randn({8, 16, 1, 1}, torch::kDouble);
  const auto w2 = torch::randn({8, 16, 1, 1}, torch::kDouble);
  const auto w3 = torch::randn({16, 8, 1, 1}, torch::kDouble);
  torch::Tensor kept;
  struct Case {
    const char* name;
    Block block;
    ShortcutGradient expected;
  };
  const Case cases[] = {
      // ResNet's identity block: the add's gradient, which nothing else
      // holds once conv3's backward has run: summed in place.
      {"relu(conv(y) + shortcut)",
       [&](const torch::Tensor& y, const torch::Tensor& s) {
         return torch::relu(torch::conv2d(y, w3) + s);
       },
       ShortcutGradient::kInPlace},
      // A downsampling convolution: its fresh input gradient.
      {"y + conv(shortcut)",
       [&](const torch::Tensor& y, const torch::Tensor& s) {
         return y + torch::conv2d(s, w2);
       },
       ShortcutGradient::kInPlace},
      // A hook keeps the shortcut's gradient: not ours to overwrite.
      {"hooked shortcut",
       [&](const torch::Tensor& y, const torch::Tensor& s) {
         if (s.requires_grad()) {
           s.register_hook([&](const torch::Tensor& g) { kept = g; });
         }
         return torch::relu(torch::conv2d(y, w3) + s);
       },
       ShortcutGradient::kCopy},
      // The shortcut unused: the product alone.
      {"y alone",
       [&](const torch::Tensor& y, const torch::Tensor&) { return y * 2; },
       ShortcutGradient::kNoShortcutGradient},
  };
  for (const auto& c : cases) {
    const auto plain = c.block(torch::conv2d(x, w), x);
    const auto dy = torch::randn(plain.sizes(), torch::kDouble);
    const auto before = conv_shortcut_gradient_count(c.expected);
    const auto fused = run(x, w, c.block, /*fused=*/true, dy);
    EXPECT_EQ(conv_shortcut_gradient_count(c.expected), before + 1) << c.name;
    if (c.expected == ShortcutGradient::kCopy) {
      // What the hook kept is still the shortcut's own gradient.
      EXPECT_TRUE(torch::equal(kept, dy * (fused.out > 0))) << c.name;
    }
    expect_close(fused, run(x, w, c.block, /*fused=*/false, dy), 1e-12);
  }
}

TEST(ConvShortcut, OtherInputsTakeTheUnfusedOps) {
  // NCHW: the unfused ops; the shortcut is the input itself.
  const auto x = torch::randn({2, 4, 3, 3}, torch::requires_grad());
  const auto w = torch::randn({6, 4, 1, 1});
  const auto [y, shortcut] = lamp::nn::conv1x1_and_shortcut(x, w);
  EXPECT_TRUE(shortcut.is_same(x));
  EXPECT_TRUE(torch::allclose(y, torch::conv2d(x, w)));
  // Nothing needs a gradient, or no grad mode: the unfused ops too.
  const auto c = channels_last(torch::randn({2, 4, 3, 3}));
  EXPECT_TRUE(lamp::nn::conv1x1_and_shortcut(c, w).second.is_same(c));
  const auto r = c.clone().requires_grad_();
  const torch::NoGradGuard no_grad;
  EXPECT_TRUE(lamp::nn::conv1x1_and_shortcut(r, w).second.is_same(r));
}

TEST(ConvShortcut, BadWeightIsAClearError) {
  const auto x = torch::randn({1, 4, 3, 3});
  lamp::test::expect_error(
      [&] {
        lamp::nn::conv1x1_and_shortcut(x, torch::randn({6, 4, 3, 3}));
      },
      "expected a 1x1 convolution weight (Cout, Cin, 1, 1), got sizes [6, 4, "
      "3, 3]");
}

TEST(ConvShortcut, NoDoubleBackwardOnTheFusedPath) {
  auto x = channels_last(torch::randn({1, 4, 3, 3})).requires_grad_();
  const auto w = torch::randn({6, 4, 1, 1}, torch::requires_grad());
  auto [y, s] = lamp::nn::conv1x1_and_shortcut(x, w);
  lamp::test::expect_error(
      [&] {
        torch::autograd::grad(
            {y.sum() + s.sum()},
            {x},
            {},
            /*retain_graph=*/true,
            /*create_graph=*/true);
      },
      "no double backward");
}

class ConvShortcutGpu : public lamp::test::GpuTest {};

// ResNet-50's identity block at layer1's shapes under autocast, with lamp's
// fused BatchNorm taking the shortcut as its residual: the fused sum is
// taken in place, and the gradients agree with the unfused block's (both
// against the block in fp32: the fused one is no further from it).
TEST_F(ConvShortcutGpu, ResNetIdentityBlockUnderAutocast) {
  torch::manual_seed(3);
  const auto x = channels_last(torch::relu(
      torch::randn({32, 256, 56, 56}, torch::kCUDA).to(torch::kHalf)));
  const auto w = torch::randn({64, 256, 1, 1}, torch::kCUDA) * 0.06;
  const auto w3 = torch::randn({256, 64, 1, 1}, torch::kCUDA) * 0.12;
  lamp::nn::BatchNormAct2d bn1(64), bn3(256);
  bn1->to(torch::kCUDA);
  bn3->to(torch::kCUDA);
  const Block block = [&](const torch::Tensor& y, const torch::Tensor& s) {
    return bn3(torch::conv2d(bn1(y), w3), s);
  };
  const auto dy =
      channels_last(torch::randn(x.sizes(), torch::kCUDA).to(torch::kHalf));
  const auto in_place =
      conv_shortcut_gradient_count(ShortcutGradient::kInPlace);
  Grads fused, plain;
  {
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
    fused = run(x, w, block, /*fused=*/true, dy);
    plain = run(x, w, block, /*fused=*/false, dy);
  }
  EXPECT_EQ(
      conv_shortcut_gradient_count(ShortcutGradient::kInPlace), in_place + 1);
  EXPECT_EQ(fused.weight.scalar_type(), torch::kFloat);
  const auto reference =
      run(x.to(torch::kFloat), w, block, /*fused=*/false, dy.to(torch::kFloat));
  // Against fp32 a few elements differ by a whole dy where fp16 rounding
  // flipped a ReLU: compare mean errors, and fused with unfused directly
  // (same forward, same masks: the sums differ by their rounding alone).
  const auto mean_error = [&](const torch::Tensor& a) {
    return (a.to(torch::kFloat) - reference.input).abs().mean().item<double>();
  };
  const double fused_error = mean_error(fused.input);
  const double plain_error = mean_error(plain.input);
  std::cout << "input gradient, mean error against fp32: fused " << fused_error
            << ", unfused " << plain_error << "\n";
  EXPECT_LE(fused_error, 1.05 * plain_error);
  EXPECT_TRUE(torch::allclose(
      fused.input.to(torch::kFloat), plain.input.to(torch::kFloat), 1e-2, 1e-2))
      << (fused.input.to(torch::kFloat) - plain.input.to(torch::kFloat))
             .abs()
             .max();
  EXPECT_TRUE(torch::equal(fused.out, plain.out));
  EXPECT_TRUE(torch::allclose(fused.weight, plain.weight, 2e-2, 2e-2));
}

} // namespace

} // namespace conv_shortcut_test
