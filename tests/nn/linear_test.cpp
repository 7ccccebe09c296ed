// lamp::nn::linear and lamp::nn::Linear: Python's F.linear op for op
// (bitwise on the CPU in fp32, bf16 and fp16, inputs of rank 2 to 4, with
// and without bias, under autocast), Python's parameter names, shapes and
// initialisation, and torch::nn::Linear's state dict.

#include <lamp/autocast.h>
#include <lamp/nn/linear.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace linear_test {

namespace {

using lamp::test::hex_bits;
torch::Dtype dtype_of(const std::string& name) {
  return name == "f32" ? torch::kFloat
      : name == "bf16" ? torch::kBFloat16
                       : torch::kHalf;
}

std::vector<int64_t> shape_of(int rank) {
  if (rank == 2) {
    return {3, 5};
  }
  return rank == 3 ? std::vector<int64_t>{2, 3, 5}
                   : std::vector<int64_t>{2, 2, 3, 5};
}

// linear_oracle.py's case, computed by lamp: {"y": bits, "gx": ...}.
std::map<std::string, std::string> lamp_case(const std::string& c) {
  std::vector<std::string> parts;
  std::stringstream in(c);
  for (std::string part; std::getline(in, part, ':');) {
    parts.push_back(part);
  }
  const auto dtype = dtype_of(parts[0]);
  const int rank = std::stoi(parts[1]);
  const bool bias = parts[2] == "1";
  const bool autocast = parts.size() > 3 && parts[3] == "autocast";
  torch::manual_seed(0);
  auto x = torch::randn(shape_of(rank));
  auto w = torch::randn({7, 5});
  auto b = torch::randn({7});
  auto out_shape = shape_of(rank);
  out_shape.back() = 7;
  auto g = torch::randn(out_shape);
  if (!autocast) {
    x = x.to(dtype);
    w = w.to(dtype);
    b = b.to(dtype);
    g = g.to(dtype);
  }
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  torch::Tensor y;
  {
    lamp::AutocastGuard guard(torch::kCPU, torch::kBFloat16, autocast);
    y = lamp::nn::linear(x, w, bias ? b : torch::Tensor());
  }
  y.backward(g.to(y.scalar_type()));
  std::map<std::string, std::string> out{
      {"y", hex_bits(y)},
      {"gx", hex_bits(x.grad())},
      {"gw", hex_bits(w.grad())}};
  if (bias) {
    out["gb"] = hex_bits(b.grad());
  }
  return out;
}

TEST(Linear, EqualsPythonsOpForOpInEveryDtypeAndRank) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  std::vector<std::string> cases;
  for (const std::string dtype : {"f32", "bf16", "f16"}) {
    for (const std::string rank : {"2", "3", "4"}) {
      for (const std::string bias : {"0", "1"}) {
        cases.push_back(dtype + ":" + rank + ":" + bias);
      }
    }
  }
  cases.push_back("f32:3:1:autocast");
  cases.push_back("f32:2:1:autocast");
  const auto expected = lamp::test::oracle_cases("nn/linear_oracle.py", cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (const auto& c : cases) {
    EXPECT_EQ(lamp_case(c), expected.at(c)) << c;
  }
}

TEST(Linear, ModuleHasLibTorchsNamesShapesAndInitialisation) {
  torch::manual_seed(1);
  torch::nn::Linear theirs(torch::nn::LinearOptions(6, 4));
  torch::manual_seed(1);
  lamp::nn::Linear ours(6, 4);
  const auto a = theirs->named_parameters();
  const auto b = ours->named_parameters();
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& key : a.keys()) {
    EXPECT_TRUE(torch::equal(a[key], b[key])) << key; // same draws
  }
  lamp::nn::Linear no_bias(torch::nn::LinearOptions(6, 4).bias(false));
  EXPECT_EQ(no_bias->parameters().size(), 1u);
  EXPECT_FALSE(no_bias->bias.defined());
  std::ostringstream printed;
  printed << *ours;
  EXPECT_EQ(
      printed.str(),
      "lamp::nn::Linear(in_features=6, out_features=4, bias=true)");
  // forward is linear(); a clone is a deep copy of the same kind.
  const auto x = torch::randn({2, 3, 6});
  EXPECT_TRUE(
      torch::equal(ours(x), lamp::nn::linear(x, ours->weight, ours->bias)));
  const auto copy =
      std::dynamic_pointer_cast<lamp::nn::LinearImpl>(ours->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(torch::equal(copy->weight, ours->weight));
  EXPECT_FALSE(copy->weight.is_same(ours->weight));
}

class LinearGpu : public lamp::test::GpuTest {};

struct Run {
  torch::Tensor y, dx, dw, db;
};

// f(x, w, b) with a gradient for every operand, on the GPU.
template <typename F>
Run run_gpu(
    const F& f,
    std::vector<int64_t> shape,
    int64_t out,
    torch::Dtype dtype,
    bool autocast) {
  torch::manual_seed(3);
  const auto cuda = torch::kCUDA;
  const auto param_dtype = autocast ? torch::kFloat : dtype;
  auto x = torch::randn(shape).to(cuda, param_dtype).requires_grad_();
  auto w = torch::randn({out, shape.back()}).to(cuda, param_dtype);
  auto b = torch::randn({out}).to(cuda, param_dtype);
  w.requires_grad_();
  b.requires_grad_();
  shape.back() = out;
  const auto g = torch::randn(shape).to(cuda);
  torch::Tensor y;
  {
    lamp::AutocastGuard guard(torch::kCUDA, dtype, autocast);
    y = f(x, w, b);
  }
  y.backward(g.to(y.scalar_type()));
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

// On CUDA the bias's gradient is lamp's column sum (linear_cuda.cpp):
// forward, input and weight gradients still ATen's bit for bit, the bias's
// the fp32 column sum rounded once (within one rounding of the type), the
// same every run.
TEST_F(LinearGpu, AtensOpsWithLampsBiasGradient) {
  auto lamp_op = [](const auto& x, const auto& w, const auto& b) {
    return lamp::nn::linear(x, w, b);
  };
  auto aten_op = [](const auto& x, const auto& w, const auto& b) {
    return at::linear(x, w, b);
  };
  struct Case {
    std::vector<int64_t> shape;
    int64_t out;
    torch::Dtype dtype;
    bool autocast;
  };
  const std::vector<Case> cases = {
      {{4, 64, 96}, 256, torch::kBFloat16, true}, // GPT-like
      {{4, 512, 64}, 2304, torch::kBFloat16, true}, // GPT-2's widths
      {{4, 512, 64}, 768, torch::kBFloat16, true},
      {{2, 300, 64}, 1600, torch::kHalf, true}, // gpt2-xl's
      // gpt2-xl's q/k/v and fc widths at thousands of rows: many blocks
      // of 75 and 25 column chunks, row counts off the 2-row unroll.
      {{2, 4096, 64}, 4800, torch::kBFloat16, true},
      {{3, 1001, 64}, 6400, torch::kHalf, true},
      {{4, 64, 96}, 256, torch::kHalf, true},
      {{300, 40}, 24, torch::kBFloat16, false}, // rank 2
      {{2, 3, 50, 40}, 24, torch::kHalf, false}, // rank 4
      {{4, 64, 96}, 20, torch::kBFloat16, true}, // columns % 8 != 0: ATen
      {{4, 64, 96}, 256, torch::kFloat, false}, // fp32: ATen
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(
        std::to_string(c.shape.size()) + "-D, out " + std::to_string(c.out) +
        ", " + c10::toString(c.dtype) + (c.autocast ? " autocast" : ""));
    const auto a = run_gpu(lamp_op, c.shape, c.out, c.dtype, c.autocast);
    const auto e = run_gpu(aten_op, c.shape, c.out, c.dtype, c.autocast);
    EXPECT_TRUE(torch::equal(a.y, e.y));
    EXPECT_TRUE(torch::equal(a.dx, e.dx));
    EXPECT_TRUE(torch::equal(a.dw, e.dw));
    EXPECT_EQ(a.db.scalar_type(), e.db.scalar_type());
    // Both are the exact sum rounded once, give or take fp32 rounding:
    // within 2 units in the last place of the gradient's type.
    const auto g_dtype = a.y.scalar_type();
    const double ulp = g_dtype == torch::kBFloat16 ? 1.0 / 128
        : g_dtype == torch::kHalf                  ? 1.0 / 1024
                                                   : 1e-6;
    const auto diff = (a.db.to(torch::kDouble) - e.db.to(torch::kDouble)).abs();
    EXPECT_TRUE(diff.le(e.db.to(torch::kDouble).abs().clamp_min(1) * 2 * ulp)
                    .all()
                    .item<bool>())
        << "largest difference " << diff.max().item<double>();
    const auto again = run_gpu(lamp_op, c.shape, c.out, c.dtype, c.autocast);
    EXPECT_TRUE(torch::equal(again.db, a.db));
  }
}

// What ATen's linear allows, lamp's does: an in-place op on the output,
// and a second derivative (a gradient penalty).
TEST_F(LinearGpu, InPlaceOutputAndDoubleBackward) {
  torch::manual_seed(4);
  auto x = torch::randn({8, 16}, torch::kCUDA).requires_grad_();
  auto w = torch::randn({32, 16}, torch::kCUDA).requires_grad_();
  auto b = torch::randn({32}, torch::kCUDA).requires_grad_();
  auto penalty = [&](bool ours) {
    auto y = ours ? lamp::nn::linear(x, w, b) : at::linear(x, w, b);
    y.relu_();
    const auto gx = torch::autograd::grad(
        {y.square().sum()},
        {x},
        {},
        /*retain_graph=*/true,
        /*create_graph=*/true)[0];
    const auto gw = torch::autograd::grad({gx.square().sum()}, {w, b});
    return std::make_pair(gw[0], gw[1]);
  };
  const auto [ours_w, ours_b] = penalty(true);
  const auto [theirs_w, theirs_b] = penalty(false);
  EXPECT_TRUE(torch::allclose(ours_w, theirs_w, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(ours_b, theirs_b, 1e-5, 1e-5));
}

} // namespace

} // namespace linear_test
