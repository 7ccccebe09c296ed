// lamp::nn::linear_cross_entropy against ATen's own composition, the ops
// Python runs for F.cross_entropy(F.linear(x, W), t): the loss and both
// gradients for any chunking (one chunk, several, a partial last one),
// ignored targets, sum and mean, inputs of rank 2 and 3, autocast; its
// errors; on a GPU lamp's kernel in fp32, bf16 and fp16 (vector and scalar
// paths), logits of -inf, and inside a CUDA graph.

#include <lamp/autocast.h>
#include <lamp/config.h>
#include <lamp/nn/linear.h>
#include <lamp/nn/linear_cross_entropy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include "nn/cross_entropy_cuda.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace linear_cross_entropy_test {

namespace {

using lamp::nn::LinearCrossEntropyOptions;

struct Result {
  torch::Tensor loss, dx, dw;
};

struct Problem {
  torch::Tensor x, w, t;
};

// Rows of `shape` (last dim C), V classes, some targets ignored.
Problem problem(
    std::vector<int64_t> shape,
    int64_t classes,
    torch::Device device = torch::kCPU,
    torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(7);
  Problem p;
  p.x = (torch::randn(shape) * 2).to(device, dtype);
  p.w = (torch::randn({classes, shape.back()}) * 0.5).to(device, dtype);
  shape.pop_back();
  p.t = torch::randint(classes, shape, torch::kLong);
  p.t.view(-1)[1] = -100;
  p.t.view(-1)[-1] = -100;
  p.t = p.t.to(device);
  return p;
}

// The loss of `f(x, w, t)` and the gradients of x and w.
template <typename F>
Result run(const Problem& p, const F& f) {
  auto x = p.x.detach().clone().requires_grad_();
  auto w = p.w.detach().clone().requires_grad_();
  auto loss = f(x, w, p.t);
  loss.backward();
  return {loss.detach(), x.grad(), w.grad()};
}

Result aten(const Problem& p, bool sum = false) {
  return run(p, [&](auto& x, auto& w, auto& t) {
    auto logits = lamp::nn::linear(x, w);
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}),
        t.reshape(-1),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            sum ? torch::nn::CrossEntropyLossOptions::reduction_t(torch::kSum)
                : torch::kMean));
  });
}

Result fused(const Problem& p, LinearCrossEntropyOptions o = {}) {
  return run(p, [&](auto& x, auto& w, auto& t) {
    return lamp::nn::linear_cross_entropy(x, w, t, o);
  });
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble);
  const auto y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).norm() / y.norm()).item<double>();
}

void expect_close(const Result& a, const Result& b, double tol) {
  EXPECT_EQ(a.loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(a.loss.dim(), 0);
  EXPECT_LE(rel_error(a.loss, b.loss), tol);
  EXPECT_EQ(a.dx.scalar_type(), b.dx.scalar_type());
  EXPECT_EQ(a.dx.sizes(), b.dx.sizes());
  EXPECT_LE(rel_error(a.dx, b.dx), tol);
  EXPECT_EQ(a.dw.scalar_type(), b.dw.scalar_type());
  EXPECT_LE(rel_error(a.dw, b.dw), tol);
}

TEST(LinearCrossEntropy, EqualsAtensCompositionForAnyChunking) {
  const auto p = problem({10, 6}, 13);
  const auto expected = aten(p);
  for (const int64_t chunk : {0, 1, 3, 10, 64}) {
    SCOPED_TRACE(chunk);
    expect_close(
        fused(p, LinearCrossEntropyOptions().chunk_size(chunk)),
        expected,
        1e-6);
  }
}

TEST(LinearCrossEntropy, SumReductionAndRankThreeInputs) {
  const auto p = problem({2, 5, 6}, 11);
  expect_close(
      fused(
          p, LinearCrossEntropyOptions().reduction(torch::kSum).chunk_size(4)),
      aten(p, /*sum=*/true),
      1e-6);
  expect_close(fused(p), aten(p), 1e-6);
}

TEST(LinearCrossEntropy, UnderAutocastTheGemmsRunInItsDtype) {
  const auto p = problem({2, 8, 16}, 37);
  Result expected, got;
  {
    lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    expected = aten(p);
    got = fused(p, LinearCrossEntropyOptions().chunk_size(5));
  }
  // bf16 GEMMs: Python's logits are rounded once, so are ours; the
  // gradients' roundings differ (ours: unscaled, fp32 sums).
  expect_close(got, expected, 2e-2);
  EXPECT_EQ(got.dx.scalar_type(), torch::kFloat);
}

// Under autocast the weight is cast inside the op: an fp32 weight gets its
// fp32 gradient as summed (not rounded to bf16, as Python's is, and cast
// back); a weight autocast would not cast (float64) is an error, as in
// Python's F.linear.
TEST(LinearCrossEntropy, UnderAutocastAnFp32WeightGetsAnUnroundedGradient) {
  const auto p = problem({2, 8, 16}, 37);
  Result got;
  {
    lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    got = fused(p, LinearCrossEntropyOptions().chunk_size(5));
  }
  ASSERT_EQ(got.dw.scalar_type(), torch::kFloat);
  EXPECT_FALSE(
      torch::equal(got.dw, got.dw.to(torch::kBFloat16).to(torch::kFloat)));
  lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { lamp::nn::linear_cross_entropy(p.x, p.w.to(torch::kDouble), p.t); },
      "input and weight must be floating point of one dtype");
}

// The loss's gradient (a loss scale, here 4) scales both gradients; the
// saved gradients are not scaled in place, so a second backward of the same
// graph (retain_graph) adds the same again.
TEST(LinearCrossEntropy, TheLossGradientScalesAndASecondBackwardAddsTheSame) {
  const auto p = problem({2, 5, 6}, 11);
  const auto expected = aten(p);
  auto x = p.x.detach().clone().requires_grad_();
  auto w = p.w.detach().clone().requires_grad_();
  const auto loss = lamp::nn::linear_cross_entropy(
      x, w, p.t, LinearCrossEntropyOptions().chunk_size(4));
  (loss * 4).backward({}, /*retain_graph=*/true);
  EXPECT_LE(rel_error(x.grad(), expected.dx * 4), 1e-6);
  EXPECT_LE(rel_error(w.grad(), expected.dw * 4), 1e-6);
  (loss * 4).backward();
  EXPECT_LE(rel_error(x.grad(), expected.dx * 8), 1e-6);
  EXPECT_LE(rel_error(w.grad(), expected.dw * 8), 1e-6);
}

TEST(LinearCrossEntropy, NoGradientsWhenNoneAreWanted) {
  const auto p = problem({4, 6}, 9);
  const auto expected = aten(p).loss;
  torch::NoGradGuard no_grad;
  const auto loss = lamp::nn::linear_cross_entropy(
      p.x.requires_grad_(),
      p.w,
      p.t,
      LinearCrossEntropyOptions().chunk_size(3));
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_LE(rel_error(loss, expected), 1e-6);
}

TEST(LinearCrossEntropy, BadInputIsAClearError) {
  const auto p = problem({4, 6}, 9);
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::nn::linear_cross_entropy(
            p.x, p.w, p.t, LinearCrossEntropyOptions().reduction(torch::kNone));
      },
      "reduction kNone is not supported");
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { lamp::nn::linear_cross_entropy(p.x, p.w.t(), p.t); },
      "expected input (..., C) and weight (V, C), got sizes [4, 6] and [6, 9]");
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { lamp::nn::linear_cross_entropy(p.x, p.w, p.t.to(torch::kInt)); },
      "expected int64 targets, one per row of the input (4)");
  auto bad = p.t.clone();
  bad[0] = 9;
  lamp::test::expect_error_of<c10::IndexError>(
      [&] { lamp::nn::linear_cross_entropy(p.x, p.w, bad); },
      "a target is outside [0, 9) and is not ignore_index");
}

class LinearCrossEntropyGpu : public lamp::test::GpuTest {};

// lamp's kernel: 16-byte vectors where a row allows (1,024 and 40,000
// classes), one element at a time where not (1,001), in every dtype,
// several chunks.
TEST_F(LinearCrossEntropyGpu, KernelEqualsAtensComposition) {
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t classes : {1024, 1001, 40000}) {
      SCOPED_TRACE(
          std::string(c10::toString(dtype)) + " " + std::to_string(classes));
      const auto p = problem({3, 100, 64}, classes, torch::kCUDA, dtype);
      const double tol = dtype == torch::kFloat ? 1e-5 : 3e-2;
      expect_close(
          fused(p, LinearCrossEntropyOptions().chunk_size(128)), aten(p), tol);
    }
  }
}

TEST_F(LinearCrossEntropyGpu, UnderAutocastLikeGpt2sHead) {
  const auto p = problem({4, 256, 128}, 50304, torch::kCUDA);
  Result expected, got;
  {
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    expected = aten(p);
    got = fused(p, LinearCrossEntropyOptions().chunk_size(300));
  }
  expect_close(got, expected, 2e-2);
  EXPECT_LE(rel_error(got.loss, expected.loss), 1e-3);
}

TEST_F(LinearCrossEntropyGpu, OutOfRangeTargetGivesANanLoss) {
  auto p = problem({4, 16}, 32, torch::kCUDA);
  p.t[0] = 32;
  const auto loss = fused(p).loss;
  EXPECT_TRUE(std::isnan(loss.item<float>()));
}

// A NaN logit makes its row's loss NaN, as in Python, in 16-byte vectors
// (32 classes) and one element at a time (33).
TEST_F(LinearCrossEntropyGpu, NanLogitGivesANanLoss) {
  for (const int64_t classes : {32, 33}) {
    auto p = problem({4, 16}, classes, torch::kCUDA);
    p.x[0][0] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(fused(p).loss.item<float>())) << classes;
  }
}

// Logits of -inf (probability 0), among them the first that many threads
// read, in 16-byte vectors (1,024 classes) and one at a time (1,001): the
// kernel's loss and softmax - one_hot equal ATen's, finite.
TEST_F(LinearCrossEntropyGpu, MinusInfinityLogitsHaveProbabilityZero) {
#if LAMP_WITH_CUDA
  const torch::Device cuda(torch::kCUDA);
  for (const int64_t classes : {1024, 1001}) {
    SCOPED_TRACE(classes);
    torch::manual_seed(3);
    auto logits = torch::randn({6, classes}, cuda);
    logits.masked_fill_(
        torch::arange(classes, cuda).remainder(64) < 8,
        -std::numeric_limits<float>::infinity());
    // Targets among the finite logits.
    const auto target =
        (torch::randint(classes / 64, {6}, torch::kLong) * 64 + 9).to(cuda);
    const auto expected_loss = torch::nn::functional::cross_entropy(
        logits,
        target,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            torch::kNone));
    const auto expected_grad = torch::softmax(logits, 1) -
        torch::one_hot(target, classes).to(torch::kFloat);
    auto grad = logits.clone();
    auto loss = torch::empty({6}, logits.options());
    ASSERT_TRUE(
        lamp::nn::detail::cuda_softmax_xent_grad_(grad, target, -100, loss));
    EXPECT_LE(rel_error(loss, expected_loss), 1e-5);
    EXPECT_LE(rel_error(grad, expected_grad), 1e-5);
    EXPECT_TRUE(torch::isfinite(grad).all().item<bool>());
  }
#else
  GTEST_SKIP() << "lamp was built without CUDA: no cross-entropy kernel";
#endif
}

} // namespace

} // namespace linear_cross_entropy_test
