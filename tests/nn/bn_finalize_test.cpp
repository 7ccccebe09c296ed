// lamp::nn::detail::batch_norm_finalize: BatchNorm's training statistics
// and folded scale and shift from a convolution's per-channel sums. On the
// CPU against torch's own native_batch_norm; on a GPU the kernel against
// the CPU's arithmetic.

#include "support.h"

#include <torch/torch.h>

#include <cstdint>

#include "nn/bn_finalize.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace bn_finalize_test {

namespace {

using lamp::nn::detail::batch_norm_finalize;
using lamp::nn::detail::BatchNormFold;

struct Batch {
  torch::Tensor x, sum, sum_of_squares, weight, bias, running_mean, running_var;
  int64_t count = 0;
};

Batch batch(const torch::Device& device) {
  torch::manual_seed(5);
  Batch b;
  b.x = torch::randn({8, 16, 5, 5}) * 2 + 0.5;
  b.sum = b.x.sum({0, 2, 3});
  b.sum_of_squares = b.x.square().sum({0, 2, 3});
  b.weight = torch::rand({16}) + 0.5;
  b.bias = torch::randn({16});
  b.running_mean = torch::randn({16});
  b.running_var = torch::rand({16}) + 0.5;
  b.count = 8 * 5 * 5;
  for (auto* t :
       {&b.x,
        &b.sum,
        &b.sum_of_squares,
        &b.weight,
        &b.bias,
        &b.running_mean,
        &b.running_var}) {
    *t = t->to(device);
  }
  return b;
}

TEST(BatchNormFinalize, MatchesTorchsBatchNormInTraining) {
  Batch b = batch(torch::kCPU);
  auto running_mean = b.running_mean.clone();
  auto running_var = b.running_var.clone();
  const BatchNormFold fold = batch_norm_finalize(
      b.sum,
      b.sum_of_squares,
      b.count,
      b.weight,
      b.bias,
      b.running_mean,
      b.running_var,
      0.1,
      1e-5,
      torch::kFloat);
  const auto [out, save_mean, save_invstd] = at::native_batch_norm(
      b.x, b.weight, b.bias, running_mean, running_var, true, 0.1, 1e-5);
  EXPECT_TRUE(torch::allclose(fold.mean, save_mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fold.invstd, save_invstd, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(b.running_mean, running_mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(b.running_var, running_var, 1e-5, 1e-6));
  const auto folded =
      b.x * fold.scale.view({1, -1, 1, 1}) + fold.shift.view({1, -1, 1, 1});
  EXPECT_TRUE(torch::allclose(folded, out, 1e-5, 1e-5))
      << (folded - out).abs().max().item<float>();
}

TEST(BatchNormFinalize, WithoutAffineOrRunningStatistics) {
  const Batch b = batch(torch::kCPU);
  const BatchNormFold fold = batch_norm_finalize(
      b.sum,
      b.sum_of_squares,
      b.count,
      {},
      {},
      {},
      {},
      0.1,
      1e-5,
      torch::kFloat);
  EXPECT_TRUE(torch::allclose(fold.scale, fold.invstd));
  EXPECT_TRUE(torch::allclose(fold.shift, -fold.mean * fold.invstd));
}

TEST(BatchNormFinalize, RefusesWhatItCannotCompute) {
  const Batch b = batch(torch::kCPU);
  const auto call = [&](const torch::Tensor& sum,
                        int64_t count,
                        const torch::Tensor& running_var,
                        torch::ScalarType fold) {
    batch_norm_finalize(
        sum,
        b.sum_of_squares,
        count,
        b.weight,
        b.bias,
        b.running_mean.clone(),
        running_var,
        0.1,
        1e-5,
        fold);
  };
  const auto rv = b.running_var.clone();
  EXPECT_NO_THROW(call(b.sum, b.count, rv, torch::kHalf));
  EXPECT_THROW(call(b.sum, 1, rv, torch::kFloat), c10::ValueError);
  EXPECT_THROW(call(b.sum, b.count, {}, torch::kFloat), c10::ValueError);
  EXPECT_THROW(
      call(b.sum.to(torch::kDouble), b.count, rv, torch::kFloat),
      c10::ValueError);
  EXPECT_THROW(
      call(b.sum.narrow(0, 0, 8), b.count, rv, torch::kFloat), c10::ValueError);
  EXPECT_THROW(call(b.sum, b.count, rv, torch::kInt), c10::ValueError);
}

class BatchNormFinalizeGpu : public lamp::test::GpuTest {};

TEST_F(BatchNormFinalizeGpu, TheKernelEqualsTheCpusArithmetic) {
  for (const auto fold_type : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    Batch cpu = batch(torch::kCPU);
    Batch gpu = batch(torch::kCUDA);
    const auto run = [fold_type](Batch& b) {
      return batch_norm_finalize(
          b.sum,
          b.sum_of_squares,
          b.count,
          b.weight,
          b.bias,
          b.running_mean,
          b.running_var,
          0.1,
          1e-5,
          fold_type);
    };
    const BatchNormFold expected = run(cpu);
    const BatchNormFold got = run(gpu);
    // Both in double, rounded once: equal but for the last bit of a float.
    const auto close = [](const torch::Tensor& a, const torch::Tensor& e) {
      return torch::allclose(
          a.cpu().to(torch::kFloat), e.to(torch::kFloat), 1e-6, 1e-7);
    };
    EXPECT_TRUE(close(got.mean, expected.mean)) << fold_type;
    EXPECT_TRUE(close(got.invstd, expected.invstd)) << fold_type;
    EXPECT_TRUE(close(gpu.running_mean, cpu.running_mean)) << fold_type;
    EXPECT_TRUE(close(gpu.running_var, cpu.running_var)) << fold_type;
    EXPECT_EQ(got.scale.scalar_type(), fold_type);
    // The fold rounded to its dtype from the same float: one step apart at
    // most.
    const double rtol = fold_type == torch::kFloat ? 1e-6
        : fold_type == torch::kHalf                ? 1e-3
                                                   : 8e-3;
    EXPECT_TRUE(torch::allclose(
        got.scale.cpu().to(torch::kFloat),
        expected.scale.to(torch::kFloat),
        rtol,
        1e-6))
        << fold_type;
    EXPECT_TRUE(torch::allclose(
        got.shift.cpu().to(torch::kFloat),
        expected.shift.to(torch::kFloat),
        rtol,
        1e-3))
        << fold_type;
  }
}

} // namespace
} // namespace bn_finalize_test
