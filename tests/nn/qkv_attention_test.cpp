// lamp::nn::qkv_attention against the Python lines it stands for (split
// into q, k and v, their heads, ATen's scaled_dot_product_attention, the
// heads back side by side): values and qkv's gradient. On the CPU the same
// ops, and Python's own results bit for bit (qkv_attention_oracle.py); on
// a GPU lamp's cuDNN graphs against ATen's attention and both
// against float32 attention of the same inputs, under autocast, captured
// in a CUDA graph, and the cases that take ATen's path (and say why).

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/config.h>
#include <lamp/nn/diagnostics.h>
#include <lamp/nn/qkv_attention.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace qkv_attention_test {

namespace {

// The Python lines of lamp/nn/qkv_attention.h, with ATen's ops.
torch::Tensor python_lines(
    const torch::Tensor& qkv,
    int64_t heads,
    bool causal,
    std::optional<double> scale = std::nullopt) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  auto parts = qkv.split(c, 2);
  for (auto& part : parts) {
    part = part.view({b, t, heads, c / heads}).transpose(1, 2);
  }
  const auto y = at::scaled_dot_product_attention(
      parts[0], parts[1], parts[2], std::nullopt, 0.0, causal, scale);
  return y.transpose(1, 2).reshape({b, t, c});
}

struct Result {
  torch::Tensor y, dqkv;
};

// y = f(qkv) and the gradient of sum(y * gy) with respect to qkv.
template <typename F>
Result run(const F& f, const torch::Tensor& qkv, const torch::Tensor& gy) {
  const auto x = qkv.detach().clone().requires_grad_();
  const auto y = f(x);
  (y.to(torch::kFloat) * gy).sum().backward();
  return {y.detach(), x.grad()};
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble);
  const auto y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).norm() / y.norm().clamp_min(1e-30)).item<double>();
}

TEST(QkvAttention, IsThePythonLinesOnTheCpu) {
  torch::manual_seed(0);
  for (const bool causal : {true, false}) {
    for (const std::optional<double> scale :
         {std::optional<double>(), std::optional<double>(0.3)}) {
      const auto qkv = torch::randn({2, 7, 3 * 12});
      const auto gy = torch::randn({2, 7, 12});
      const auto got = run(
          [&](const torch::Tensor& x) {
            return lamp::nn::qkv_attention(x, 3, causal, 0.0, scale);
          },
          qkv,
          gy);
      const auto expected = run(
          [&](const torch::Tensor& x) {
            return python_lines(x, 3, causal, scale);
          },
          qkv,
          gy);
      EXPECT_TRUE(torch::equal(got.y, expected.y)) << causal;
      EXPECT_TRUE(torch::equal(got.dqkv, expected.dqkv)) << causal;
    }
  }
  EXPECT_NE(lamp::nn::detail::qkv_attention_fallback_reason(), "");
}

// qkv_attention_oracle.py's case, computed by lamp: {"y": bits, "g": ...}.
std::map<std::string, std::string> lamp_case(const std::string& c) {
  const bool bf16 = c.rfind("bf16", 0) == 0;
  const bool causal = c.find(":1") != std::string::npos;
  const bool autocast = c.find(":autocast") != std::string::npos;
  torch::manual_seed(0);
  auto qkv = torch::randn({2, 6, 3 * 8});
  auto g = torch::randn({2, 6, 8});
  if (!autocast && bf16) {
    qkv = qkv.to(torch::kBFloat16);
    g = g.to(torch::kBFloat16);
  }
  qkv.requires_grad_();
  torch::Tensor y;
  {
    lamp::AutocastGuard guard(torch::kCPU, torch::kBFloat16, autocast);
    y = lamp::nn::qkv_attention(qkv, 2, causal);
  }
  y.backward(g.to(y.scalar_type()));
  return {
      {"y", lamp::test::hex_bits(y)}, {"g", lamp::test::hex_bits(qkv.grad())}};
}

TEST(QkvAttention, EqualsPythonsLinesBitForBitOnTheCpu) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const std::vector<std::string> cases = {
      "f32:1", "f32:0", "bf16:1", "bf16:0", "f32:1:autocast"};
  const auto expected =
      lamp::test::oracle_cases("nn/qkv_attention_oracle.py", cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (const auto& c : cases) {
    EXPECT_EQ(lamp_case(c), expected.at(c)) << c;
  }
}

TEST(QkvAttention, CausalMeansEarlierTokensOnly) {
  // The first token attends to itself only: its output is its value.
  torch::manual_seed(1);
  const auto qkv = torch::randn({1, 5, 3 * 8});
  const auto y = lamp::nn::qkv_attention(qkv, 2);
  EXPECT_TRUE(torch::allclose(y[0][0], qkv[0][0].narrow(0, 16, 8)));
}

TEST(QkvAttention, BadArgumentsAreAClearError) {
  lamp::test::expect_error_of<c10::ValueError>(
      [] {
        lamp::nn::qkv_attention(torch::randn({4, 24}), 2);
      },
      "expected qkv (B, T, 3C) with C a multiple of n_head (2); got [4, 24]");
  lamp::test::expect_error_of<c10::ValueError>(
      [] {
        lamp::nn::qkv_attention(torch::randn({1, 4, 30}), 4);
      },
      "expected qkv (B, T, 3C) with C a multiple of n_head (4); got [1, 4, "
      "30]");
  lamp::test::expect_error_of<c10::ValueError>(
      [] {
        lamp::nn::qkv_attention(torch::randn({1, 4, 24}), 2, true, 1.0);
      },
      "dropout_p must be in [0, 1); got 1");
}

class QkvAttentionGpu : public lamp::test::GpuTest {};

#if LAMP_WITH_CUDA

struct Shape {
  int64_t b, t, heads, head_dim;
};

// lamp's graphs and ATen's attention against float32 attention of the same
// (rounded) inputs: lamp at most a little farther from it than ATen.
void compare(const Shape& s, torch::Dtype dtype, bool causal) {
  torch::manual_seed(2);
  const int64_t c = s.heads * s.head_dim;
  const auto qkv = torch::randn({s.b, s.t, 3 * c}, torch::kCUDA).to(dtype);
  const auto gy = torch::randn({s.b, s.t, c}, torch::kCUDA);
  const int64_t before = lamp::nn::detail::qkv_attention_cudnn_count();
  const auto got = run(
      [&](const torch::Tensor& x) {
        return lamp::nn::qkv_attention(x, s.heads, causal);
      },
      qkv,
      gy);
  ASSERT_EQ(lamp::nn::detail::qkv_attention_fallback_reason(), "");
  EXPECT_EQ(lamp::nn::detail::qkv_attention_cudnn_count(), before + 1);
  const auto aten = run(
      [&](const torch::Tensor& x) { return python_lines(x, s.heads, causal); },
      qkv,
      gy);
  const auto exact = run(
      [&](const torch::Tensor& x) { return python_lines(x, s.heads, causal); },
      qkv.to(torch::kFloat),
      gy);
  EXPECT_EQ(got.y.scalar_type(), dtype);
  EXPECT_EQ(got.dqkv.scalar_type(), dtype);
  const double y_lamp = rel_error(got.y, exact.y);
  const double y_aten = rel_error(aten.y, exact.y);
  const double g_lamp = rel_error(got.dqkv, exact.dqkv);
  const double g_aten = rel_error(aten.dqkv, exact.dqkv);
  std::cout << "B" << s.b << " T" << s.t << " H" << s.heads << " D"
            << s.head_dim << " " << dtype << (causal ? " causal" : "")
            << ": y error lamp " << y_lamp << " ATen " << y_aten
            << "; dqkv lamp " << g_lamp << " ATen " << g_aten
            << "; y equal to ATen's: " << torch::equal(got.y, aten.y)
            << ", dqkv: " << torch::equal(got.dqkv, aten.dqkv) << "\n";
  // One rounding of the output's type, and no more than ATen's own error
  // (plus a rounding's worth: the kernels may differ in order).
  const double unit = dtype == torch::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  EXPECT_LT(y_lamp, std::max(1.25 * y_aten, unit));
  EXPECT_LT(g_lamp, std::max(1.25 * g_aten, 2 * unit));
}

TEST_F(QkvAttentionGpu, CudnnGraphsAreAsAccurateAsAtensAttention) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const bool causal : {true, false}) {
      compare({2, 128, 4, 64}, dtype, causal);
    }
  }
  // GPT-2's heads, and a head size of 128 with a sequence that is not a
  // multiple of the kernels' tiles.
  compare({2, 1024, 12, 64}, torch::kBFloat16, true);
  compare({3, 77, 2, 128}, torch::kBFloat16, true);
}

TEST_F(QkvAttentionGpu, UnderAutocastAnFp32InputRunsInBf16) {
  torch::manual_seed(3);
  const auto qkv = torch::randn({2, 64, 3 * 128}, torch::kCUDA);
  torch::Tensor y;
  {
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    y = lamp::nn::qkv_attention(qkv, 2);
  }
  EXPECT_EQ(lamp::nn::detail::qkv_attention_fallback_reason(), "");
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  const auto expected = python_lines(qkv.to(torch::kBFloat16), 2, true);
  EXPECT_LT(rel_error(y, expected), 1.0 / 256);
}

TEST_F(QkvAttentionGpu, OtherCasesRunAtensAttentionAndSayWhy) {
  torch::manual_seed(4);
  const auto qkv = torch::randn({2, 16, 3 * 64}, torch::kCUDA);
  const auto check = [](const torch::Tensor& y,
                        const torch::Tensor& expected,
                        const std::string& why) {
    EXPECT_NE(
        lamp::nn::detail::qkv_attention_fallback_reason().find(why),
        std::string::npos)
        << lamp::nn::detail::qkv_attention_fallback_reason();
    if (expected.defined()) {
      EXPECT_TRUE(torch::allclose(y, expected, 1e-4, 1e-5));
    }
  };
  check(
      lamp::nn::qkv_attention(qkv, 2),
      python_lines(qkv, 2, true),
      "neither float16 nor bfloat16");
  const auto half = qkv.to(torch::kHalf);
  // A head size of 4: not a multiple of 8.
  check(
      lamp::nn::qkv_attention(half, 16),
      python_lines(half, 16, true),
      "not a multiple of 8");
  check(
      lamp::nn::qkv_attention(
          half.transpose(0, 1).contiguous().transpose(0, 1), 2),
      python_lines(half, 2, true),
      "not contiguous");
  // Dropout: ATen's attention with its own random numbers.
  const auto y = lamp::nn::qkv_attention(half, 2, true, 0.5);
  check(y, {}, "dropout_p > 0");
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 16, 64}));
}

// CheckpointOptions::keep_attention: the recompute takes each attention
// call's output and statistics from the forward call, in order, instead of
// running the forward graph again; outputs and gradients are those of a
// checkpoint that recomputes everything, bit for bit. A kept output changed
// in place since is computed afresh; a second backward pass through a kept
// graph reads them again; once the backward pass is done they are freed.
TEST_F(QkvAttentionGpu, ACheckpointKeepsItsOutputForTheRecompute) {
  torch::manual_seed(11);
  const auto x0 =
      torch::randn({2, 128, 256}, torch::kCUDA).to(torch::kBFloat16);
  const auto gy =
      torch::randn({2, 128, 256}, torch::kCUDA).to(torch::kBFloat16);
  const auto allocated = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
        .allocated_bytes[0]
        .current;
  };
  struct Run {
    std::vector<torch::Tensor> values; // y, x.grad, w.grad
    int64_t kept = -1; // attention calls that read the forward call's
    int64_t left = -1; // bytes still allocated after the backward pass
  };
  // touch: the forward call changes its first attention output in place
  // (by a no-op, so both calls still compute the same values).
  auto run = [&](bool keep, bool touch, int passes) {
    torch::manual_seed(12);
    const auto w = (torch::randn({768, 256}, torch::kCUDA) * 0.05)
                       .to(torch::kBFloat16)
                       .requires_grad_();
    const auto x = x0.clone().requires_grad_();
    const auto start = allocated();
    const auto y = lamp::checkpoint(
        [&](const torch::Tensor& in) {
          // Two calls: the recompute reads them back in order.
          auto a = lamp::nn::qkv_attention(torch::matmul(in, w.t()), 4);
          if (touch && !lamp::is_recomputing()) {
            a.mul_(1);
          }
          return lamp::nn::qkv_attention(torch::matmul(a, w.t()), 4);
        },
        x,
        lamp::CheckpointOptions().keep_attention(keep));
    EXPECT_EQ(lamp::nn::detail::qkv_attention_fallback_reason(), "");
    Run r;
    const int64_t before = lamp::nn::detail::qkv_attention_kept_count();
    for (int i = 0; i < passes; ++i) {
      y.backward(gy, /*retain_graph=*/i + 1 < passes);
    }
    r.kept = lamp::nn::detail::qkv_attention_kept_count() - before;
    r.values = {y.detach(), x.grad(), w.grad()};
    r.left = allocated() - start;
    return r;
  };
  run(false, false, 1); // cuBLAS's and cuDNN's workspaces, once a process
  const auto recomputed = run(false, false, 1);
  EXPECT_EQ(recomputed.kept, 0);
  for (const bool touch : {false, true}) {
    SCOPED_TRACE(touch ? "changed in place" : "kept");
    const auto kept = run(true, touch, 1);
    EXPECT_EQ(kept.kept, touch ? 1 : 2);
    EXPECT_EQ(kept.left, recomputed.left);
    for (size_t i = 0; i < kept.values.size(); ++i) {
      EXPECT_TRUE(torch::equal(kept.values[i], recomputed.values[i])) << i;
    }
  }
  // Two backward passes: each reads the kept tensors; gradients accumulate.
  const auto twice = run(true, false, 2);
  const auto twice_recomputed = run(false, false, 2);
  EXPECT_EQ(twice.kept, 4);
  for (size_t i = 0; i < twice.values.size(); ++i) {
    EXPECT_TRUE(torch::equal(twice.values[i], twice_recomputed.values[i])) << i;
  }
}

TEST_F(QkvAttentionGpu, NoDoubleBackwardOnTheCudnnPath) {
  const auto qkv =
      torch::randn({1, 32, 3 * 64}, torch::kCUDA).to(torch::kBFloat16);
  const auto x = qkv.requires_grad_();
  const auto y = lamp::nn::qkv_attention(x, 1);
  ASSERT_EQ(lamp::nn::detail::qkv_attention_fallback_reason(), "");
  try {
    torch::autograd::grad(
        {y.to(torch::kFloat).sum()}, {x}, {}, true, /*create_graph=*/true);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find("no double backward"),
        std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST_F(QkvAttentionGpu, ACapturedForwardAndBackwardReplayOnNewInputs) {
  torch::manual_seed(5);
  const auto qkv =
      torch::randn({2, 256, 3 * 256}, torch::kCUDA).to(torch::kBFloat16);
  const auto gy = torch::randn({2, 256, 256}, torch::kCUDA);
  const auto f = [&gy](const torch::Tensor& x) {
    const auto y = lamp::nn::qkv_attention(x, 4);
    const auto g =
        torch::autograd::grad({(y.to(torch::kFloat) * gy).sum()}, {x})[0];
    return std::make_pair(y, g);
  };
  const auto x = qkv.clone().requires_grad_();
  auto stream = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  torch::Tensor y, g;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    f(x); // plans the graphs: a capture only looks them up
    stream.synchronize();
    graph.capture_begin();
    std::tie(y, g) = f(x);
    graph.capture_end();
  }
  {
    torch::NoGradGuard no_grad;
    x.copy_(torch::randn_like(x));
  }
  graph.replay();
  torch::cuda::synchronize();
  const auto [y_eager, g_eager] = f(x);
  EXPECT_TRUE(torch::equal(y, y_eager));
  EXPECT_TRUE(torch::equal(g, g_eager));
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace qkv_attention_test
