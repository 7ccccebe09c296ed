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

// Rows of GPT-2's widths (768, 1600), one odd and one small, and 1,000 and
// 1,200 (partial pack rounds in the two-warp kernels).
TEST_F(AddLayerNormGpu, KernelsEqualAtensOps) {
  compare_all(torch::kCUDA, {768, 1600, 100, 5, 1000, 1200});
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

// bias_add_layer_norm(x, r, rb, w, b) against ATen's x + (r + rb) in fp32
// and layer_norm: values, and the gradients of all five (rb's: the column
// sums of r's gradient, which lamp's kernel takes from r's gradient as
// stored, rounded to r's dtype).
void compare_biased(
    torch::Device device,
    int64_t columns,
    torch::Dtype rdtype,
    torch::Dtype rb_dtype,
    bool autocast,
    int64_t rows) {
  SCOPED_TRACE(
      "C " + std::to_string(columns) + " r " + c10::toString(rdtype) + " rb " +
      c10::toString(rb_dtype) + (autocast ? " autocast" : "") + " rows " +
      std::to_string(rows));
  struct Out {
    torch::Tensor sum, y, dx, dr, drb, dw, db;
  };
  auto once = [&](bool lamp_op) {
    torch::manual_seed(12);
    auto x = torch::randn({rows, columns}).to(device).requires_grad_();
    auto r = (torch::randn({rows, columns}) * 0.5)
                 .to(device, rdtype)
                 .requires_grad_();
    auto rb = torch::randn({columns}).to(device, rb_dtype).requires_grad_();
    auto w = (torch::rand({columns}) + 0.5).to(device).requires_grad_();
    auto b = torch::randn({columns}).to(device).requires_grad_();
    auto gy = torch::randn({rows, columns}).to(device);
    auto gs = torch::randn({rows, columns}).to(device);
    torch::Tensor sum, y;
    {
      lamp::AutocastGuard guard(device.type(), torch::kBFloat16, autocast);
      if (lamp_op) {
        std::tie(sum, y) = lamp::nn::bias_add_layer_norm(x, r, rb, w, b);
      } else {
        sum = x + (r.to(torch::kFloat) + rb.to(torch::kFloat));
        y = torch::layer_norm(sum, {columns}, w, b, 1e-5);
        if (autocast) {
          y = y.to(torch::kBFloat16);
        }
      }
    }
    ((y.to(torch::kFloat) * gy).sum() + (sum * gs).sum()).backward();
    return Out{
        sum.detach(),
        y.detach(),
        x.grad(),
        r.grad(),
        rb.grad(),
        w.grad(),
        b.grad()};
  };
  const auto a = once(true);
  const auto e = once(false);
  EXPECT_EQ(a.y.scalar_type(), e.y.scalar_type());
  EXPECT_EQ(a.drb.scalar_type(), rb_dtype);
  EXPECT_EQ(a.dr.scalar_type(), rdtype);
  EXPECT_LE(rel_error(a.sum, e.sum), 1e-6);
  EXPECT_LE(rel_error(a.y, e.y), autocast ? 1e-2 : 2e-5);
  EXPECT_LE(rel_error(a.dx, e.dx), 2e-5);
  EXPECT_LE(rel_error(a.dw, e.dw), 2e-5);
  EXPECT_LE(rel_error(a.db, e.db), 2e-5);
  const bool exact = rdtype == torch::kFloat && rb_dtype == torch::kFloat;
  EXPECT_LE(rel_error(a.dr, e.dr), exact ? 2e-5 : 1e-2);
  EXPECT_LE(rel_error(a.drb, e.drb), exact ? 2e-5 : 1e-2);
}

TEST(AddLayerNorm, ResidualBiasEqualsAtensOpsOnTheCpu) {
  for (const bool autocast : {false, true}) {
    compare_biased(torch::kCPU, 8, torch::kFloat, torch::kFloat, autocast, 6);
    compare_biased(
        torch::kCPU, 8, torch::kBFloat16, torch::kBFloat16, autocast, 6);
  }
}

TEST(AddLayerNorm, ResidualBiasWithoutAResidualIsAClearError) {
  const auto x = torch::randn({2, 8});
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::nn::bias_add_layer_norm(
            x, {}, torch::zeros({8}), torch::ones({8}), {});
      },
      "expected a residual like x (..., C) and its bias (C); got residual "
      "[], residual_bias [8]");
}

// GPT-2's widths in the register kernel (768, 1,024) and the wide one
// (1,600), an odd one (one-element loads); a bf16 residual with a bf16 or
// fp32 bias (the kernel's sums), an fp16 one under bf16 autocast (r's
// gradient cast after the kernel, rb's summed by ATen); rows for several
// blocks.
TEST_F(AddLayerNormGpu, ResidualBiasKernelsEqualAtensOps) {
  for (const int64_t columns : {768, 1024, 1600, 100, 1000, 1200}) {
    for (const bool autocast : {true, false}) {
      compare_biased(
          torch::kCUDA,
          columns,
          torch::kBFloat16,
          torch::kBFloat16,
          autocast,
          5000);
      compare_biased(
          torch::kCUDA, columns, torch::kBFloat16, torch::kFloat, autocast, 37);
      compare_biased(
          torch::kCUDA, columns, torch::kFloat, torch::kFloat, autocast, 111);
    }
  }
  compare_biased(torch::kCUDA, 768, torch::kHalf, torch::kBFloat16, true, 111);
}

TEST_F(AddLayerNormGpu, ResidualBiasGradientIsDeterministic) {
  auto once = [] {
    torch::manual_seed(3);
    const auto x = torch::randn({16384, 768}, torch::kCUDA).requires_grad_();
    const auto r = torch::randn({16384, 768}, torch::kCUDA)
                       .to(torch::kBFloat16)
                       .requires_grad_();
    const auto rb =
        torch::randn({768}, torch::kCUDA).to(torch::kBFloat16).requires_grad_();
    const auto w = torch::ones({768}, torch::kCUDA).requires_grad_();
    const auto b = torch::zeros({768}, torch::kCUDA).requires_grad_();
    lamp::AutocastGuard guard(torch::kCUDA, torch::kBFloat16);
    auto [sum, y] = lamp::nn::bias_add_layer_norm(x, r, rb, w, b);
    (y.to(torch::kFloat).square().sum() + sum.sum()).backward();
    return rb.grad();
  };
  EXPECT_TRUE(torch::equal(once(), once()));
}

} // namespace

} // namespace add_layer_norm_test
