// lamp::nn::add_layer_norm against ATen's `x + r` and `layer_norm` (the ops
// Python runs): values and the gradients of x, the residual, the weight and
// the bias, with and without a residual or a bias, the sum used further on
// or not, under autocast; on a GPU lamp's kernels for rows of several widths.

#include <lamp/autocast.h>
#include <lamp/nn/add_layer_norm.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace add_layer_norm_test {

namespace {

struct Grads {
  torch::Tensor sum, y, dx, dr, dw, db;
};

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble);
  const auto y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).norm() / y.norm().clamp_min(1e-30)).item<double>();
}

// f(x, r, w, b) -> {sum, y}; the loss uses y and, when `use_sum`, the sum.
template <typename F>
Grads run(
    const F& f,
    int64_t columns,
    torch::Device device,
    torch::Dtype residual_dtype,
    bool residual,
    bool bias,
    bool use_sum,
    bool autocast,
    int64_t rows = 3 * 37,
    bool misaligned = false) {
  torch::manual_seed(11);
  // NOTE: 111 rows as [3, 37, C] (a batch of sequences), others as [rows, C].
  const std::vector<int64_t> shape = rows == 3 * 37
      ? std::vector<int64_t>{3, 37, columns}
      : std::vector<int64_t>{rows, columns};
  auto x = torch::randn(shape).to(device).requires_grad_();
  if (misaligned) {
    // The same values one float into a buffer: not 16-byte aligned.
    auto buffer = torch::empty({x.numel() + 1}, x.options());
    x = buffer.narrow(0, 1, x.numel())
            .view(shape)
            .copy_(x.detach())
            .detach()
            .requires_grad_();
  }
  auto r =
      (torch::randn(shape) * 0.5).to(device, residual_dtype).requires_grad_();
  auto w = (torch::rand({columns}) + 0.5).to(device).requires_grad_();
  auto b = torch::randn({columns}).to(device).requires_grad_();
  auto gy = torch::randn(shape).to(device);
  auto gs = torch::randn(shape).to(device);
  torch::Tensor sum, y;
  {
    lamp::AutocastGuard guard(device.type(), torch::kBFloat16, autocast);
    std::tie(sum, y) =
        f(x, residual ? r : torch::Tensor(), w, bias ? b : torch::Tensor());
  }
  auto loss = (y.to(torch::kFloat) * gy).sum();
  if (use_sum) {
    loss = loss + (sum * gs).sum();
  }
  loss.backward();
  return {sum.detach(), y.detach(), x.grad(), r.grad(), w.grad(), b.grad()};
}

std::pair<torch::Tensor, torch::Tensor> aten(
    const torch::Tensor& x,
    const torch::Tensor& r,
    const torch::Tensor& w,
    const torch::Tensor& b) {
  const auto sum = r.defined() ? x + r : x;
  const auto device = x.device().type();
  auto y = torch::layer_norm(sum, {x.size(-1)}, w, b, 1e-5);
  if (at::autocast::is_autocast_enabled(device)) {
    y = y.to(at::autocast::get_autocast_dtype(device));
  }
  return {sum, y};
}

std::pair<torch::Tensor, torch::Tensor> lamp_op(
    const torch::Tensor& x,
    const torch::Tensor& r,
    const torch::Tensor& w,
    const torch::Tensor& b) {
  return lamp::nn::add_layer_norm(x, r, w, b);
}

void compare_all(
    torch::Device device,
    const std::vector<int64_t>& widths,
    const std::vector<torch::Dtype>& residual_dtypes =
        {torch::kFloat, torch::kBFloat16},
    int64_t rows = 3 * 37,
    bool misaligned = false) {
  for (const int64_t columns : widths) {
    for (const auto rdtype : residual_dtypes) {
      for (const bool residual : {true, false}) {
        for (const bool bias : {true, false}) {
          for (const bool use_sum : {true, false}) {
            for (const bool autocast : {true, false}) {
              const std::string what = "C " + std::to_string(columns) + " r " +
                  c10::toString(rdtype) + (residual ? "" : " none") +
                  (bias ? "" : " no-bias") + (use_sum ? " sum-used" : "") +
                  (autocast ? " autocast" : "");
              SCOPED_TRACE(what);
              const auto a =
                  run(lamp_op,
                      columns,
                      device,
                      rdtype,
                      residual,
                      bias,
                      use_sum,
                      autocast,
                      rows,
                      misaligned);
              const auto e =
                  run(aten,
                      columns,
                      device,
                      rdtype,
                      residual,
                      bias,
                      use_sum,
                      autocast,
                      rows,
                      misaligned);
              EXPECT_EQ(a.y.scalar_type(), e.y.scalar_type());
              EXPECT_EQ(a.sum.scalar_type(), torch::kFloat);
              const double tol = autocast ? 1e-2 : 2e-5;
              EXPECT_LE(rel_error(a.sum, e.sum), 1e-6);
              EXPECT_LE(rel_error(a.y, e.y), tol);
              EXPECT_LE(rel_error(a.dx, e.dx), 2e-5);
              EXPECT_LE(rel_error(a.dw, e.dw), 2e-5);
              if (residual) {
                EXPECT_EQ(a.dr.scalar_type(), rdtype);
                EXPECT_LE(
                    rel_error(a.dr, e.dr),
                    rdtype == torch::kFloat ? 2e-5 : 1e-2);
              }
              if (bias) {
                EXPECT_LE(rel_error(a.db, e.db), 2e-5);
              }
            }
          }
        }
      }
    }
  }
}

TEST(AddLayerNorm, EqualsAtensOpsOnTheCpu) {
  compare_all(torch::kCPU, {8});
}

TEST(AddLayerNorm, BadShapesAreAClearError) {
  const auto x = torch::randn({2, 8});
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::nn::add_layer_norm(x, torch::randn({2, 7}), torch::ones({8}), {});
      },
      "expected x (..., C), residual like x, and weight and bias (C); got x "
      "[2, 8], residual [2, 7], weight [8]");
}

class AddLayerNormGpu : public lamp::test::GpuTest {};

// Rows of GPT-2's widths (768, 1600), one odd and one small.
TEST_F(AddLayerNormGpu, KernelsEqualAtensOps) {
  compare_all(torch::kCUDA, {768, 1600, 100, 5});
}

// A residual in fp16 under bf16 autocast (and so neither fp32 nor y's
// type); enough rows for several chunks of the weight's gradient (256 rows
// each, up to 1,024 chunks; past that, longer chunks); an input that is
// not 16-byte aligned (the kernels' one-element loads, not their 16-byte
// ones).
TEST_F(AddLayerNormGpu, OtherResidualTypesManyRowsAndMisalignedInput) {
  compare_all(torch::kCUDA, {768}, {torch::kHalf});
  compare_all(torch::kCUDA, {768}, {torch::kBFloat16}, 5000);
  compare_all(torch::kCUDA, {8}, {torch::kFloat}, 270000);
  compare_all(torch::kCUDA, {768, 100}, {torch::kBFloat16}, 3 * 37, true);
}

TEST_F(AddLayerNormGpu, DeterministicWeightGradients) {
  auto once = [] {
    return run(
        lamp_op, 768, torch::kCUDA, torch::kBFloat16, true, true, true, true);
  };
  const auto a = once();
  const auto b = once();
  EXPECT_TRUE(torch::equal(a.dw, b.dw));
  EXPECT_TRUE(torch::equal(a.db, b.db));
  EXPECT_TRUE(torch::equal(a.dx, b.dx));
}

} // namespace

} // namespace add_layer_norm_test
