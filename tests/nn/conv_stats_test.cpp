// lamp::nn::detail::conv2d_stats: a convolution (after an optional
// scale + bias + ReLU prologue) and the per-channel sums of its output. On
// the CPU against ATen's ops; on a GPU cuDNN's graph (the sums in the
// convolution's epilogue) against the composite path on ResNet-50's shapes,
// captured in a CUDA graph, and built once per shape.

#include "support.h"

#include <lamp/config.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "nn/conv_stats.h"

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace conv_stats_test {

namespace {

using lamp::nn::detail::conv2d_stats;
using lamp::nn::detail::ConvGeometry;
using lamp::nn::detail::ConvStats;

ConvGeometry geometry(int64_t stride, int64_t padding) {
  ConvGeometry g;
  g.stride = {stride, stride};
  g.padding = {padding, padding};
  return g;
}

// The sums of `y` over N, H, W in float64.
std::pair<torch::Tensor, torch::Tensor> sums_of(const torch::Tensor& y) {
  const auto wide = y.to(torch::kDouble);
  return {wide.sum({0, 2, 3}), wide.square().sum({0, 2, 3})};
}

TEST(ConvStats, OnTheCpuItIsTheConvolutionAndItsSums) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 8, 9, 9});
  const auto w = torch::randn({6, 8, 3, 3});
  std::string why_not;
  const ConvStats r = conv2d_stats(x, w, geometry(2, 1), {}, {}, &why_not);
  EXPECT_NE(why_not.find("not on a CUDA device"), std::string::npos) << why_not;
  const auto expected = torch::conv2d(x, w, {}, 2, 1);
  EXPECT_TRUE(torch::equal(r.output, expected));
  const auto [sum, sq] = sums_of(expected);
  EXPECT_EQ(r.sum.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(r.sum.to(torch::kDouble), sum, 1e-5, 1e-4));
  EXPECT_TRUE(
      torch::allclose(r.sum_of_squares.to(torch::kDouble), sq, 1e-5, 1e-4));
}

TEST(ConvStats, ThePrologueIsScaleBiasThenRelu) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 4, 6, 6});
  const auto w = torch::randn({5, 4, 1, 1});
  const auto scale = torch::rand({4}) + 0.5;
  const auto bias = torch::randn({4});
  const ConvStats r = conv2d_stats(x, w, geometry(1, 0), scale, bias);
  const auto prologue =
      torch::relu(x * scale.view({1, 4, 1, 1}) + bias.view({1, 4, 1, 1}));
  const auto expected = torch::conv2d(prologue, w);
  EXPECT_TRUE(torch::allclose(r.output, expected, 1e-5, 1e-5));
  const auto [sum, sq] = sums_of(expected);
  EXPECT_TRUE(torch::allclose(r.sum.to(torch::kDouble), sum, 1e-5, 1e-4));
  EXPECT_TRUE(
      torch::allclose(r.sum_of_squares.to(torch::kDouble), sq, 1e-5, 1e-4));
}

TEST(ConvStats, RefusesWhatItCannotCompute) {
  const auto x = torch::randn({1, 4, 5, 5});
  const auto w = torch::randn({3, 4, 3, 3});
  const auto c = torch::ones({4});
  EXPECT_THROW(
      conv2d_stats(x, torch::randn({3, 2, 3, 3}), {}), c10::ValueError);
  EXPECT_THROW(conv2d_stats(x.view({4, 5, 5}), w, {}), c10::ValueError);
  EXPECT_THROW(conv2d_stats(x, w, {}, c, {}), c10::ValueError);
  EXPECT_THROW(conv2d_stats(x, w, {}, torch::ones({3}), c), c10::ValueError);
  EXPECT_THROW(
      conv2d_stats(x, w, {}, c.to(torch::kDouble), c), c10::ValueError);
  EXPECT_THROW(conv2d_stats(x, w, geometry(0, 0)), c10::ValueError);
  EXPECT_THROW(
      conv2d_stats(x, w.to(torch::kDouble), geometry(1, 0)), c10::ValueError);
}

// --- GPU ----------------------------------------------------------------

class ConvStatsGpu : public lamp::test::GpuTest {};

struct Shape {
  int64_t c, k, hw, kernel, stride, padding;
};

// ResNet-50's kinds of convolution, at batch 8: 1x1, 3x3, 3x3 with stride
// 2, the 1x1 stride-2 downsample, and a 1x1 that shrinks the channels.
const Shape kShapes[] = {
    {64, 64, 56, 1, 1, 0},
    {64, 64, 56, 3, 1, 1},
    {128, 128, 56, 3, 2, 1},
    {256, 512, 56, 1, 2, 0},
    {512, 128, 28, 1, 1, 0},
    {256, 1024, 14, 1, 1, 0},
};

struct Operands {
  torch::Tensor x, w, scale, bias;
};

Operands operands(const Shape& s, torch::ScalarType type, bool prologue) {
  const auto on = torch::TensorOptions().device(torch::kCUDA);
  Operands o;
  o.x = torch::randn({8, s.c, s.hw, s.hw}, on.dtype(type))
            .contiguous(torch::MemoryFormat::ChannelsLast);
  o.w = (torch::randn({s.k, s.c, s.kernel, s.kernel}, on) /
         std::sqrt(double(s.c * s.kernel * s.kernel)))
            .to(type)
            .contiguous(torch::MemoryFormat::ChannelsLast);
  if (prologue) {
    o.scale = (torch::rand({s.c}, on) + 0.5).to(type);
    o.bias = (torch::randn({s.c}, on) * 0.1).to(type);
  }
  return o;
}

// The composite path's result for the same operands (through CPU-side
// routing: the graph path is taken only for CUDA inputs, so the reference
// is the composite on the GPU, forced by an NCHW copy of the input).
ConvStats reference(const Shape& s, const Operands& o) {
  std::string why_not;
  const auto nchw = o.x.contiguous();
  ConvStats r = conv2d_stats(
      nchw, o.w, geometry(s.stride, s.padding), o.scale, o.bias, &why_not);
  EXPECT_NE(why_not.find("channels-last"), std::string::npos) << why_not;
  return r;
}

// Sums of the same values may differ by rounding (the graph sums before
// rounding to the output's dtype, in its own order): compare against the
// sum of magnitudes.
void expect_close_sums(
    const torch::Tensor& got,
    const torch::Tensor& expected,
    const torch::Tensor& magnitude,
    const std::string& what) {
  const auto error =
      (got.to(torch::kDouble) - expected.to(torch::kDouble)).abs();
  const auto bound = magnitude.to(torch::kDouble) * 1e-2 + 1e-3;
  EXPECT_TRUE((error <= bound).all().item<bool>())
      << what << ": largest error " << error.max().item<double>()
      << ", bound there " << bound[error.argmax()].item<double>();
}

TEST_F(ConvStatsGpu, TheGraphEqualsTheCompositeOnResNet50Shapes) {
  if (!LAMP_WITH_CUDNN_FRONTEND) {
    GTEST_FAIL() << "lamp was built without its cuDNN graph code "
                    "(LAMP_WITH_CUDNN_FRONTEND=OFF): nothing to test here";
  }
  torch::manual_seed(2);
  for (const auto type : {torch::kHalf, torch::kBFloat16}) {
    for (const bool prologue : {false, true}) {
      for (const Shape& s : kShapes) {
        const std::string what = c10::str(
            type,
            prologue ? " with prologue " : " ",
            s.c,
            "->",
            s.k,
            " ",
            s.kernel,
            "x",
            s.kernel,
            " stride ",
            s.stride,
            " at ",
            s.hw);
        const Operands o = operands(s, type, prologue);
        std::string why_not = "not called";
        const ConvStats got = conv2d_stats(
            o.x, o.w, geometry(s.stride, s.padding), o.scale, o.bias, &why_not);
        if (type == torch::kHalf) {
          // cuDNN 9's precompiled fused engine takes every fp16 shape here.
          EXPECT_EQ(why_not, "") << what;
        } else {
          // bfloat16 has no precompiled engine (a deviceless check with
          // cuDNN 9.19 for sm_90 found none); a runtime-compiled one may
          // take it: either path, the same results.
          std::cout << what << ": "
                    << (why_not.empty() ? "cuDNN's graph" : why_not) << "\n";
        }
        const ConvStats expected = reference(s, o);
        EXPECT_TRUE(got.output.is_contiguous(torch::MemoryFormat::ChannelsLast))
            << what;
        EXPECT_TRUE(torch::allclose(
            got.output.to(torch::kFloat),
            expected.output.to(torch::kFloat),
            2e-2,
            2e-2))
            << what << ": largest difference "
            << (got.output.to(torch::kFloat) -
                expected.output.to(torch::kFloat))
                   .abs()
                   .max()
                   .item<float>();
        const auto magnitude =
            expected.output.to(torch::kDouble).abs().sum({0, 2, 3});
        const auto magnitude_sq =
            expected.output.to(torch::kDouble).square().sum({0, 2, 3});
        expect_close_sums(got.sum, expected.sum, magnitude, what + " sum");
        expect_close_sums(
            got.sum_of_squares,
            expected.sum_of_squares,
            magnitude_sq,
            what + " sum of squares");
        // And the sums are of the output it returned.
        const auto [own_sum, own_sq] = sums_of(got.output);
        expect_close_sums(got.sum, own_sum, magnitude, what + " own sum");
        expect_close_sums(
            got.sum_of_squares, own_sq, magnitude_sq, what + " own squares");
      }
    }
  }
}

TEST_F(ConvStatsGpu, Float32ScaleAndBiasGiveTheSameResults) {
  torch::manual_seed(3);
  const Shape s = kShapes[1];
  Operands o = operands(s, torch::kHalf, /*prologue=*/true);
  const ConvStats expected = reference(s, o);
  o.scale = o.scale.to(torch::kFloat);
  o.bias = o.bias.to(torch::kFloat);
  std::string why_not;
  const ConvStats got = conv2d_stats(
      o.x, o.w, geometry(s.stride, s.padding), o.scale, o.bias, &why_not);
  // Either path: cuDNN 9.19 had no engine for a float32 prologue on sm_90
  // (deviceless check); whichever runs, the results are the same.
  std::cout << "float32 scale and bias: "
            << (why_not.empty() ? "cuDNN's graph" : why_not) << "\n";
  EXPECT_TRUE(torch::allclose(
      got.output.to(torch::kFloat),
      expected.output.to(torch::kFloat),
      2e-2,
      2e-2));
  expect_close_sums(
      got.sum,
      expected.sum,
      expected.output.to(torch::kDouble).abs().sum({0, 2, 3}),
      "sum");
}

TEST_F(ConvStatsGpu, ACapturedCallReplaysOnNewInputs) {
#if LAMP_WITH_CUDA
  if (!LAMP_WITH_CUDNN_FRONTEND) {
    GTEST_FAIL() << "lamp was built without its cuDNN graph code";
  }
  torch::manual_seed(4);
  const Shape s = kShapes[1];
  const Operands o = operands(s, torch::kHalf, /*prologue=*/true);
  const ConvGeometry geo = geometry(s.stride, s.padding);
  auto stream = c10::cuda::getStreamFromPool();
  ConvStats captured;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    // The first call builds the plan; a capture only looks it up.
    std::string why_not;
    conv2d_stats(o.x, o.w, geo, o.scale, o.bias, &why_not);
    ASSERT_EQ(why_not, "");
    stream.synchronize();
    graph.capture_begin();
    captured = conv2d_stats(o.x, o.w, geo, o.scale, o.bias);
    graph.capture_end();
  }
  o.x.copy_(torch::randn_like(o.x));
  graph.replay();
  torch::cuda::synchronize();
  const ConvStats eager = conv2d_stats(o.x, o.w, geo, o.scale, o.bias);
  EXPECT_TRUE(torch::equal(captured.output, eager.output));
  // The sums may be reduced across thread blocks in any order (atomics):
  // equal up to float rounding.
  EXPECT_TRUE(torch::allclose(captured.sum, eager.sum, 1e-5, 1e-3));
  EXPECT_TRUE(torch::allclose(
      captured.sum_of_squares, eager.sum_of_squares, 1e-5, 1e-3));
#else
  GTEST_FAIL() << "lamp was built without CUDA";
#endif
}

TEST_F(ConvStatsGpu, APlanIsBuiltOncePerShape) {
  if (!LAMP_WITH_CUDNN_FRONTEND) {
    GTEST_FAIL() << "lamp was built without its cuDNN graph code";
  }
  // A shape no other test uses.
  const Shape s{32, 48, 20, 3, 1, 1};
  const Operands o = operands(s, torch::kHalf, /*prologue=*/false);
  const int64_t before = lamp::nn::detail::conv_stats_graphs_built();
  for (int i = 0; i < 3; ++i) {
    conv2d_stats(o.x, o.w, geometry(s.stride, s.padding));
  }
  EXPECT_EQ(lamp::nn::detail::conv_stats_graphs_built(), before + 1);
  conv2d_stats(o.x, o.w, geometry(2, 1));
  EXPECT_EQ(lamp::nn::detail::conv_stats_graphs_built(), before + 2);
}

// The composite path's sums on CUDA (lamp's kernel) against float64 sums of
// the same values, twice bit for bit, and the tensors it does not take.
TEST_F(ConvStatsGpu, ChannelSumsEqualFloat64SumsAndRepeat) {
  using lamp::nn::detail::channel_sums;
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {
      {8, 64, 28, 28},
      {4, 2048, 7, 7},
      {3, 24, 5, 5},
      {64, 256, 14, 14},
      // Row widths whose vectors are no power of two (reduce_layout's
      // lanes): GPT-2's 768 and 2304, gpt2-xl's 1600 (8 lanes) and 4800,
      // and 2056 (257 vectors, odd: lanes a block wide and a chunk of 1).
      {2048, 768, 1, 1},
      {1000, 2304, 1, 1},
      {512, 1600, 1, 1},
      {300, 4800, 1, 1},
      {700, 2056, 1, 1}};
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const auto& shape : shapes) {
      const auto x = (torch::randn(shape, torch::kCUDA) * 2 + 0.5)
                         .to(dtype)
                         .contiguous(torch::MemoryFormat::ChannelsLast);
      const auto sums = channel_sums(x);
      ASSERT_TRUE(sums.has_value()) << c10::IntArrayRef(shape);
      const auto wide = x.to(torch::kDouble);
      // float32 sums of up to ~800k values: relative 1e-5 of the sum of
      // magnitudes is ~100 roundings' worth.
      expect_close_sums(
          sums->first,
          wide.sum({0, 2, 3}),
          wide.abs().sum({0, 2, 3}) * 1e-3,
          "sum");
      expect_close_sums(
          sums->second,
          wide.square().sum({0, 2, 3}),
          wide.square().sum({0, 2, 3}) * 1e-3,
          "sum of squares");
      const auto again = channel_sums(x);
      EXPECT_TRUE(torch::equal(again->first, sums->first))
          << c10::IntArrayRef(shape);
      EXPECT_TRUE(torch::equal(again->second, sums->second))
          << c10::IntArrayRef(shape);
    }
  }
  const auto x = torch::randn({2, 16, 4, 4}, torch::kCUDA);
  EXPECT_FALSE(channel_sums(x.to(torch::kHalf)).has_value()) << "NCHW";
  EXPECT_FALSE(
      channel_sums(x.contiguous(torch::MemoryFormat::ChannelsLast)).has_value())
      << "float32";
  EXPECT_FALSE(channel_sums(torch::randn({2, 12, 4, 4}, torch::kCUDA)
                                .to(torch::kHalf)
                                .contiguous(torch::MemoryFormat::ChannelsLast))
                   .has_value())
      << "12 channels";
  EXPECT_FALSE(channel_sums(x.cpu()
                                .to(torch::kHalf)
                                .contiguous(torch::MemoryFormat::ChannelsLast))
                   .has_value())
      << "CPU";
}

} // namespace
} // namespace conv_stats_test
