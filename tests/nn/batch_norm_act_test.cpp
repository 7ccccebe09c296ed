#include <lamp/lamp.h>
#include <lamp/nn/diagnostics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "amp_trainer.h"
#include "support.h"

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace batch_norm_act_test {

namespace {

using lamp::nn::BatchNormAct2d;
using lamp::nn::BatchNormAct2dOptions;
using lamp::nn::BatchNormActPath;
using lamp::test::expect_error;

// One configuration of the module.
struct Config {
  bool relu = true;
  bool residual = true;
  bool train = true;
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track = true;

  std::string str() const {
    std::ostringstream s;
    s << "relu=" << relu << " residual=" << residual << " train=" << train
      << " momentum="
      << (momentum ? std::to_string(*momentum) : std::string("None"))
      << " affine=" << affine << " track_running_stats=" << track;
    return s.str();
  }
};

BatchNormAct2dOptions fused_options(const Config& c, int64_t channels) {
  return BatchNormAct2dOptions(channels)
      .momentum(c.momentum)
      .affine(c.affine)
      .track_running_stats(c.track)
      .relu(c.relu);
}

torch::nn::BatchNorm2dOptions plain_options(const Config& c, int64_t channels) {
  return torch::nn::BatchNorm2dOptions(channels)
      .momentum(c.momentum)
      .affine(c.affine)
      .track_running_stats(c.track);
}

// The unfused model: BatchNorm2d, `out += residual`, torch::relu (as
// torchvision's ResNet).
torch::Tensor unfused(
    torch::nn::BatchNorm2d& bn,
    const Config& c,
    const torch::Tensor& x,
    const torch::Tensor& z) {
  auto out = bn(x);
  if (c.residual) {
    out = out + z;
  }
  return c.relu ? torch::relu(out) : out;
}

// Gives both modules the same non-trivial parameters and statistics.
void same_state(
    BatchNormAct2d& fused,
    torch::nn::BatchNorm2d& plain,
    const torch::TensorOptions& options) {
  torch::NoGradGuard no_grad;
  const int64_t c = fused->options.num_features();
  if (fused->weight.defined()) {
    fused->weight.copy_(torch::rand({c}, options) + 0.5);
    fused->bias.copy_(torch::rand({c}, options) - 0.5);
    plain->weight.copy_(fused->weight);
    plain->bias.copy_(fused->bias);
  }
  if (fused->running_mean.defined()) {
    fused->running_mean.copy_(torch::randn({c}, options) * 0.1);
    fused->running_var.copy_(torch::rand({c}, options) + 0.5);
    plain->running_mean.copy_(fused->running_mean);
    plain->running_var.copy_(fused->running_var);
  }
}

void expect_same(
    const torch::Tensor& a,
    const torch::Tensor& b,
    const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) {
    return;
  }
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::allclose(a, b, 1e-12, 1e-12))
      << what << ": max difference " << (a - b).abs().max().item<double>();
}

// Three calls of the module and of the unfused model on the CPU (fp64):
// outputs, all gradients, running statistics and num_batches_tracked.
void expect_matches_unfused(const Config& c) {
  SCOPED_TRACE(c.str());
  const int64_t channels = 8;
  const auto options = torch::dtype(torch::kDouble);
  torch::manual_seed(3);
  BatchNormAct2d fused(fused_options(c, channels));
  torch::nn::BatchNorm2d plain(plain_options(c, channels));
  fused->to(torch::kDouble);
  plain->to(torch::kDouble);
  same_state(fused, plain, options);
  fused->train(c.train);
  plain->train(c.train);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, channels, 5, 3}, options) * 2 + 0.5;
    const auto z = torch::randn({4, channels, 5, 3}, options);
    const auto dy = torch::randn({4, channels, 5, 3}, options);
    auto x1 = x.clone().requires_grad_();
    auto z1 = z.clone().requires_grad_();
    auto x2 = x.clone().requires_grad_();
    auto z2 = z.clone().requires_grad_();
    auto y1 = fused(x1, c.residual ? z1 : torch::Tensor());
    EXPECT_EQ(
        lamp::nn::detail::batch_norm_act_last_path(),
        BatchNormActPath::kComposite);
    auto y2 = unfused(plain, c, x2, z2);
    expect_same(y1, y2, "output");
    y1.backward(dy);
    y2.backward(dy);
    expect_same(x1.grad(), x2.grad(), "input gradient");
    expect_same(z1.grad(), z2.grad(), "residual gradient");
    if (c.affine) {
      expect_same(
          fused->weight.grad(), plain->weight.grad(), "weight gradient");
      expect_same(fused->bias.grad(), plain->bias.grad(), "bias gradient");
    }
    expect_same(fused->running_mean, plain->running_mean, "running_mean");
    expect_same(fused->running_var, plain->running_var, "running_var");
    ASSERT_EQ(
        fused->num_batches_tracked.defined(),
        plain->num_batches_tracked.defined());
    if (fused->num_batches_tracked.defined()) {
      EXPECT_EQ(
          fused->num_batches_tracked.item<int64_t>(),
          plain->num_batches_tracked.item<int64_t>());
    }
  }
}

TEST(BatchNormAct, CpuFallbackMatchesUnfusedInEveryConfiguration) {
  for (bool relu : {true, false}) {
    for (bool residual : {true, false}) {
      for (bool train : {true, false}) {
        for (std::optional<double> momentum :
             {std::optional<double>(0.1), std::optional<double>()}) {
          for (bool affine : {true, false}) {
            for (bool track : {true, false}) {
              expect_matches_unfused(
                  {relu, residual, train, momentum, affine, track});
            }
          }
        }
      }
    }
  }
}

TEST(BatchNormAct, SaysWhyItTookTheFallback) {
  BatchNormAct2d bn(8);
  bn(torch::randn({2, 8, 3, 3}));
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kComposite);
  EXPECT_NE(
      lamp::nn::detail::batch_norm_act_fallback_reason().find("not CUDA"),
      std::string::npos)
      << lamp::nn::detail::batch_norm_act_fallback_reason();
  bn->eval();
  bn(torch::randn({2, 8, 3, 3}));
  EXPECT_NE(
      lamp::nn::detail::batch_norm_act_fallback_reason().find("evaluation"),
      std::string::npos)
      << lamp::nn::detail::batch_norm_act_fallback_reason();
  const auto before =
      lamp::nn::detail::batch_norm_act_path_count(BatchNormActPath::kComposite);
  bn(torch::randn({2, 8, 3, 3}));
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_path_count(BatchNormActPath::kComposite),
      before + 1);
}

// Channels-last bf16 under CPU autocast (the dtype a convolution hands the
// norm there) takes the fallback and equals the unfused model.
TEST(BatchNormAct, MatchesUnfusedUnderCpuAutocast) {
  torch::manual_seed(5);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 16, 3).padding(1));
  BatchNormAct2d fused(16);
  torch::nn::BatchNorm2d plain(16);
  same_state(fused, plain, torch::dtype(torch::kFloat));
  const auto x =
      torch::randn({4, 3, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast);
  torch::Tensor y1;
  torch::Tensor y2;
  {
    lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    const auto h = conv(x);
    ASSERT_EQ(h.scalar_type(), torch::kBFloat16);
    y1 = fused(h, h);
    y2 = torch::relu(plain(h) + h);
  }
  EXPECT_EQ(y1.scalar_type(), torch::kBFloat16);
  expect_same(y1.to(torch::kDouble), y2.to(torch::kDouble), "output");
  expect_same(fused->running_mean, plain->running_mean, "running_mean");
}

TEST(BatchNormAct, OptionsDefaultToBatchNorm2dsAndChain) {
  const BatchNormAct2dOptions ours(64);
  const torch::nn::BatchNorm2dOptions theirs(64);
  EXPECT_EQ(ours.num_features(), 64);
  EXPECT_EQ(ours.eps(), theirs.eps());
  EXPECT_EQ(ours.momentum(), theirs.momentum());
  EXPECT_EQ(ours.affine(), theirs.affine());
  EXPECT_EQ(ours.track_running_stats(), theirs.track_running_stats());
  EXPECT_TRUE(ours.relu());
  const auto o = BatchNormAct2dOptions(8)
                     .eps(1e-3)
                     .momentum(std::nullopt)
                     .affine(false)
                     .track_running_stats(false)
                     .relu(false);
  EXPECT_EQ(o.eps(), 1e-3);
  EXPECT_FALSE(o.momentum().has_value());
  EXPECT_FALSE(o.affine());
  EXPECT_FALSE(o.track_running_stats());
  EXPECT_FALSE(o.relu());

  std::ostringstream s;
  s << *BatchNormAct2d(BatchNormAct2dOptions(64).momentum(std::nullopt));
  EXPECT_EQ(
      s.str(),
      "lamp::nn::BatchNormAct2d(64, eps=1e-05, momentum=None, affine=true, "
      "track_running_stats=true, relu=true)");
}

// Same parameter and buffer names (so same state dicts) as BatchNorm2d.
TEST(BatchNormAct, HasBatchNorm2dsStateDictNames) {
  for (bool affine : {true, false}) {
    for (bool track : {true, false}) {
      SCOPED_TRACE(
          "affine=" + std::to_string(affine) +
          " track=" + std::to_string(track));
      const Config c{true, true, true, 0.1, affine, track};
      BatchNormAct2d fused(fused_options(c, 8));
      torch::nn::BatchNorm2d plain(plain_options(c, 8));
      EXPECT_EQ(
          fused->named_parameters().keys(), plain->named_parameters().keys());
      EXPECT_EQ(fused->named_buffers().keys(), plain->named_buffers().keys());
    }
  }
  // A BatchNorm2d's state loads by name and gives the same results.
  torch::manual_seed(2);
  torch::nn::BatchNorm2d plain(8);
  BatchNormAct2d scratch(8);
  same_state(scratch, plain, torch::dtype(torch::kFloat));
  BatchNormAct2d fused(8);
  {
    torch::NoGradGuard no_grad;
    const auto params = plain->named_parameters();
    const auto buffers = plain->named_buffers();
    for (auto& item : fused->named_parameters()) {
      item.value().copy_(params[item.key()]);
    }
    for (auto& item : fused->named_buffers()) {
      item.value().copy_(buffers[item.key()]);
    }
  }
  fused->eval();
  plain->eval();
  const auto x = torch::randn({2, 8, 4, 4});
  EXPECT_TRUE(torch::allclose(fused(x), torch::relu(plain(x))));
}

TEST(BatchNormAct, WorksInSequentialAndClones) {
  torch::nn::Sequential seq(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)), BatchNormAct2d(8));
  const auto y = seq->forward(torch::randn({2, 3, 6, 6}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 8, 4, 4}));
  EXPECT_GE(y.min().item<float>(), 0.f);

  BatchNormAct2d bn(BatchNormAct2dOptions(4).relu(false));
  {
    torch::NoGradGuard no_grad;
    bn->weight.fill_(2);
  }
  auto copy =
      std::dynamic_pointer_cast<lamp::nn::BatchNormAct2dImpl>(bn->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->options.relu());
  EXPECT_TRUE(torch::equal(copy->weight, bn->weight));
  EXPECT_NE(copy->weight.data_ptr(), bn->weight.data_ptr());
}

TEST(BatchNormAct, BadInputsAreClearErrors) {
  BatchNormAct2d bn(8);
  expect_error(
      [&] {
        bn(torch::randn({4, 8, 5}));
      },
      "expected a 4-D (N, C, H, W) input, got a 3-D input of sizes [4, 8, 5]");
  expect_error(
      [&] {
        bn(torch::randn({4, 6, 5, 5}));
      },
      "BatchNormAct2d(8): expected an input with 8 channels (dim 1), got one "
      "of sizes [4, 6, 5, 5]");
  expect_error(
      [&] {
        bn(torch::randn({4, 8, 5, 5}), torch::randn({4, 8, 5, 4}));
      },
      "the residual must have the input's sizes [4, 8, 5, 5], got [4, 8, 5, "
      "4]");
  expect_error(
      [&] {
        bn(torch::randn({1, 8, 1, 1}));
      },
      "Expected more than 1 value per channel when training");
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 0)
      << "a rejected input is not counted";
  expect_error(
      [&] { BatchNormAct2d(0); }, "num_features must be positive, got 0");

  const auto x = torch::randn({4, 8, 5, 5});
  const torch::Tensor none;
  expect_error(
      [&] {
        lamp::nn::batch_norm_act(
            x, none, torch::ones({4}), none, none, none, true, 0.1, 1e-5, true);
      },
      "weight has 4 elements but the input has 8 channels");
  expect_error(
      [&] {
        lamp::nn::batch_norm_act(
            x, none, none, none, none, none, false, 0.1, 1e-5, true);
      },
      "running_mean and running_var must be defined in evaluation mode");
  expect_error(
      [&] {
        lamp::nn::batch_norm_act(
            x,
            none,
            none,
            none,
            torch::zeros({8}),
            none,
            true,
            0.1,
            1e-5,
            true);
      },
      "give both running_mean and running_var, or neither");
}

#if LAMP_WITH_CUDA

// --- GPU: the fused cuDNN path against the unfused model in fp32 ---------

struct Shape {
  int64_t n, c, h, w;
};

// ResNet-50 layer shapes (stem, layer1-4 at 224x224) at batches 1 to 256;
// a subset that keeps the suite to seconds.
const Shape kResNetShapes[] = {
    {32, 64, 112, 112}, // stem bn1
    {256, 64, 56, 56}, // layer1 bn1/bn2 at batch 256
    {64, 256, 56, 56}, // layer1 bn3 (+ residual)
    {32, 128, 28, 28}, // layer2 bn2
    {32, 512, 28, 28}, // layer2 bn3
    {16, 1024, 14, 14}, // layer3 bn3
    {8, 2048, 7, 7}, // layer4 bn3
    {1, 64, 112, 112}, // batch 1
    {1, 2048, 7, 7}, // batch 1, 49 values a channel
};

// Elementwise |actual - expected| <= atol + rtol |expected|, with at most
// `outliers` elements outside (see the tolerances below).
testing::AssertionResult close(
    const torch::Tensor& actual,
    const torch::Tensor& expected,
    double atol,
    double rtol,
    int64_t outliers = 0) {
  if (actual.sizes() != expected.sizes()) {
    return testing::AssertionFailure()
        << "sizes " << actual.sizes() << " vs " << expected.sizes();
  }
  const auto a = actual.to(torch::kDouble);
  const auto e = expected.to(torch::kDouble);
  const auto diff = (a - e).abs();
  const auto bad = (diff > atol + rtol * e.abs()) | (a.isnan() != e.isnan());
  const int64_t n = bad.sum().item<int64_t>();
  if (n <= outliers) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure()
      << n << " of " << a.numel() << " elements differ by more than " << atol
      << " + " << rtol << " |expected| (" << outliers
      << " allowed); largest difference "
      << diff.nan_to_num(INFINITY).max().item<double>();
}

// Tolerances, from the dtype of the module's output (the fp32 reference is
// computed from the same rounded inputs) and the path it took.
// Fused cuDNN kernel:
// - output y: normalized, added and ReLU'd in fp32, rounded once: 4 units
//   in the last place of the dtype (fp16 2^-11, bf16 2^-8 relative), and
//   as much absolute near zero.
// - dx, dz: likewise one rounding of an fp32 result. A pre-activation
//   within fp32 rounding (~1e-7) of zero can fall on the other side of the
//   ReLU in the two computations and flip that element's gradient: about
//   one element in 10^7, so 1e-5 of the elements (at least 16) may miss.
// - dgamma, dbeta (fp32): sums over N*H*W products; a flipped element moves
//   a sum by about |dy|, the sums are ~sqrt(N*H*W): 5e-3 of the largest.
// Unfused ops in fp16/bf16 (evaluation; bf16 where cuDNN turns it down):
// the batch norm's output is rounded before the add, so pre-activations
// within that rounding (2^-11 or 2^-8 of |bn(x)|) of zero may flip: up to
// 1 % of dx and dz, 5e-2 of the largest dgamma / dbeta, 8 ulps elsewhere.
// Running statistics (fp32) either way: 1e-3 relative (cuDNN's persistent
// mode reduces in scaled integers), 1e-4 absolute.
struct Tolerance {
  double elementwise;
  double outlier_fraction;
  int64_t min_outliers;
  double sums;
};

Tolerance tolerance(torch::ScalarType dtype, BatchNormActPath path) {
  const double ulp =
      dtype == torch::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  if (path == BatchNormActPath::kCudnnFused) {
    return {4 * ulp, 1e-5, 16, 5e-3};
  }
  return {8 * ulp, 1e-2, 16, 5e-2};
}

struct GpuCase {
  Shape shape;
  torch::ScalarType dtype;
  Config config;
};

// Runs one training (or evaluation) step of the module on the GPU in
// `dtype`, channels-last, and of the unfused model in fp32 on the same
// (rounded) values; compares the output, all gradients and the running
// statistics. Returns the path the module took.
BatchNormActPath check_against_fp32(const GpuCase& k) {
  const auto& s = k.shape;
  const auto& c = k.config;
  SCOPED_TRACE(c10::str(
      "[", s.n, ", ", s.c, ", ", s.h, ", ", s.w, "] ", k.dtype, " ", c.str()));
  const auto cuda = torch::TensorOptions(torch::kCUDA);
  torch::manual_seed(s.n * 7919 + s.c);
  auto rounded = [&](const torch::Tensor& t) {
    return t.to(k.dtype).contiguous(torch::MemoryFormat::ChannelsLast);
  };
  const auto x = rounded(torch::randn({s.n, s.c, s.h, s.w}, cuda) * 2 + 0.5);
  const auto z = rounded(torch::randn({s.n, s.c, s.h, s.w}, cuda));
  const auto dy = rounded(torch::randn({s.n, s.c, s.h, s.w}, cuda));

  BatchNormAct2d fused(fused_options(c, s.c));
  torch::nn::BatchNorm2d plain(plain_options(c, s.c));
  fused->to(torch::kCUDA);
  plain->to(torch::kCUDA);
  same_state(fused, plain, cuda);
  fused->train(c.train);
  plain->train(c.train);

  auto x1 = x.detach().requires_grad_();
  auto z1 = z.detach().requires_grad_();
  auto y1 = fused(x1, c.residual ? z1 : torch::Tensor());
  const auto path = lamp::nn::detail::batch_norm_act_last_path();
  const auto why = lamp::nn::detail::batch_norm_act_fallback_reason();
  y1.backward(dy);

  auto x2 = x.to(torch::kFloat).requires_grad_();
  auto z2 = z.to(torch::kFloat).requires_grad_();
  auto y2 = unfused(plain, c, x2, z2);
  y2.backward(dy.to(torch::kFloat));

  const auto t = tolerance(k.dtype, path);
  const double tol = t.elementwise;
  const int64_t outliers = std::max<int64_t>(
      t.min_outliers, static_cast<int64_t>(t.outlier_fraction * x.numel()));
  EXPECT_EQ(y1.scalar_type(), k.dtype);
  EXPECT_TRUE(y1.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(close(y1, y2, tol, tol)) << "output; path " << int(path) << why;
  EXPECT_TRUE(close(x1.grad(), x2.grad(), tol, tol, outliers))
      << "input gradient";
  if (c.residual) {
    EXPECT_TRUE(close(z1.grad(), z2.grad(), tol, tol, outliers))
        << "residual gradient";
  }
  if (c.affine) {
    for (const auto& [a, b, name] :
         {std::tuple(fused->weight.grad(), plain->weight.grad(), "weight"),
          std::tuple(fused->bias.grad(), plain->bias.grad(), "bias")}) {
      EXPECT_EQ(a.scalar_type(), torch::kFloat);
      const double scale = b.abs().max().item<double>();
      EXPECT_TRUE(close(a, b, t.sums * scale, t.sums)) << name << " gradient";
    }
  }
  if (c.track) {
    EXPECT_TRUE(close(fused->running_mean, plain->running_mean, 1e-4, 1e-3))
        << "running_mean";
    EXPECT_TRUE(close(fused->running_var, plain->running_var, 1e-4, 1e-3))
        << "running_var";
    EXPECT_EQ(
        fused->num_batches_tracked.item<int64_t>(),
        plain->num_batches_tracked.item<int64_t>());
  }
  return path;
}

class BatchNormActGpu : public lamp::test::GpuTest {};

// Training on ResNet-50 shapes, fp16 and bf16, every op the kernel fuses
// (BN_ADD_ACTIVATION, BN_ACTIVATION, BN + add, BN), momentum None on some.
// fp16 must take the fused cuDNN kernel; bf16 is checked whichever path it
// takes (Bf16TakesTheFusedPath says which).
TEST_F(BatchNormActGpu, TrainingMatchesFp32UnfusedOnResNetShapes) {
  const Config ops[] = {
      {true, true}, {true, false}, {false, true}, {false, false}};
  int shape_index = 0;
  for (const auto& shape : kResNetShapes) {
    ++shape_index;
    for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
      for (Config config : ops) {
        config.momentum =
            shape_index % 3 == 0 ? std::nullopt : std::optional<double>(0.1);
        const auto path = check_against_fp32({shape, dtype, config});
        if (dtype == torch::kHalf) {
          EXPECT_EQ(path, BatchNormActPath::kCudnnFused)
              << lamp::nn::detail::batch_norm_act_fallback_reason();
        }
      }
    }
  }
}

TEST_F(BatchNormActGpu, Bf16TakesTheFusedPath) {
  check_against_fp32({{32, 256, 28, 28}, torch::kBFloat16, Config{}});
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kCudnnFused)
      << "cuDNN did not take bf16: "
      << lamp::nn::detail::batch_norm_act_fallback_reason();
}

// Without affine parameters cuDNN gets ones and zeros.
TEST_F(BatchNormActGpu, WithoutAffineParameters) {
  Config config;
  config.affine = false;
  EXPECT_EQ(
      check_against_fp32({{16, 256, 14, 14}, torch::kHalf, config}),
      BatchNormActPath::kCudnnFused);
}

// Evaluation uses the running statistics (unfused); without running
// statistics evaluation normalizes with the batch's (fused).
TEST_F(BatchNormActGpu, EvaluationModes) {
  Config eval;
  eval.train = false;
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    EXPECT_EQ(
        check_against_fp32({{32, 512, 28, 28}, dtype, eval}),
        BatchNormActPath::kComposite);
  }
  eval.track = false;
  EXPECT_EQ(
      check_against_fp32({{32, 512, 28, 28}, torch::kHalf, eval}),
      BatchNormActPath::kCudnnFused);
}

// PyTorch's running_var takes the unbiased batch variance; with
// momentum=None the first step stores it as it is (M = 32 values a
// channel: the biased one is 3 % smaller).
TEST_F(BatchNormActGpu, RunningVarianceIsUnbiased) {
  const auto x = torch::randn({2, 64, 4, 4}, torch::kCUDA)
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  BatchNormAct2d bn(BatchNormAct2dOptions(64).momentum(std::nullopt));
  bn->to(torch::kCUDA);
  bn(x);
  ASSERT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kCudnnFused)
      << lamp::nn::detail::batch_norm_act_fallback_reason();
  const auto x32 = x.to(torch::kFloat);
  EXPECT_TRUE(close(
      bn->running_var, x32.var({0, 2, 3}, /*unbiased=*/true), 1e-4, 1e-3));
  EXPECT_TRUE(close(bn->running_mean, x32.mean({0, 2, 3}), 1e-4, 1e-3));
}

// The gradient may arrive in any layout (here NCHW-contiguous).
TEST_F(BatchNormActGpu, TakesAnyGradientLayout) {
  const auto x = torch::randn({8, 64, 14, 14}, torch::kCUDA)
                     .to(torch::kHalf)
                     .contiguous(torch::MemoryFormat::ChannelsLast)
                     .requires_grad_();
  BatchNormAct2d bn(64);
  bn->to(torch::kCUDA);
  const auto y = bn(x);
  ASSERT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kCudnnFused);
  const auto dy = torch::randn_like(y).contiguous();
  y.backward(dy);
  const auto g1 = x.grad().clone();
  x.mutable_grad().reset();
  bn(x).backward(dy.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(close(g1, x.grad(), 1e-3, 1e-3));
}

// Peak memory of forward + backward is not above the unfused model's.
TEST_F(BatchNormActGpu, PeakMemoryIsNotAboveUnfused) {
  auto peak = [](const std::function<void()>& f) {
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0)
                            .allocated_bytes[0]
                            .current;
    f();
    torch::cuda::synchronize();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
               .allocated_bytes[0]
               .peak -
        before;
  };
  const auto make = [] {
    return torch::randn({64, 256, 56, 56}, torch::kCUDA)
        .to(torch::kHalf)
        .contiguous(torch::MemoryFormat::ChannelsLast)
        .requires_grad_();
  };
  auto x = make();
  auto z = make();
  const auto dy = torch::randn_like(x).detach();
  BatchNormAct2d fused(256);
  torch::nn::BatchNorm2d plain(256);
  fused->to(torch::kCUDA);
  plain->to(torch::kCUDA);
  const auto fused_peak = peak([&] { fused(x, z).backward(dy); });
  ASSERT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kCudnnFused);
  x.mutable_grad().reset();
  z.mutable_grad().reset();
  const auto plain_peak = peak([&] {
    auto out = plain(x);
    out += z;
    torch::relu(out).backward(dy);
  });
  std::printf(
      "peak memory of forward + backward: fused %.1f MiB, unfused %.1f MiB\n",
      fused_peak / 1048576.0,
      plain_peak / 1048576.0);
  EXPECT_LE(fused_peak, plain_peak);
}

// A training step with fused norms (fp16 autocast, GradScaler, FusedAdam)
// captured by GraphedStep: replays equal eager steps.
struct FusedNet : torch::nn::Module {
  explicit FusedNet(std::optional<double> momentum = 0.1)
      : conv1(register_module(
            "conv1",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)))),
        bn1(register_module(
            "bn1",
            BatchNormAct2d(BatchNormAct2dOptions(32).momentum(momentum)))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1)))),
        bn2(register_module(
            "bn2",
            BatchNormAct2d(BatchNormAct2dOptions(32).momentum(momentum)))),
        fc(register_module("fc", torch::nn::Linear(32, 10))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = bn1(conv1(x));
    h = bn2(conv2(h), h);
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }

  torch::nn::Conv2d conv1;
  BatchNormAct2d bn1;
  torch::nn::Conv2d conv2;
  BatchNormAct2d bn2;
  torch::nn::Linear fc;
};

using FusedTrainer = lamp::test::AmpTrainer<FusedNet>;

std::vector<std::vector<torch::Tensor>> image_batches(int64_t n) {
  torch::manual_seed(11);
  std::vector<std::vector<torch::Tensor>> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(
        {torch::randn({16, 3, 12, 12}, torch::kCUDA)
             .contiguous(torch::MemoryFormat::ChannelsLast),
         torch::randint(
             0, 10, {16}, torch::dtype(torch::kLong).device(torch::kCUDA))});
  }
  return out;
}

TEST_F(BatchNormActGpu, GraphedStepReplaysEqualEagerSteps) {
  const auto data = image_batches(10);
  FusedTrainer eager;
  const auto fused_before = lamp::nn::detail::batch_norm_act_path_count(
      BatchNormActPath::kCudnnFused);
  for (const auto& batch : data) {
    eager.step(batch);
  }
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_path_count(
          BatchNormActPath::kCudnnFused),
      fused_before + 2 * 10)
      << lamp::nn::detail::batch_norm_act_fallback_reason();

  FusedTrainer graphed;
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return graphed.step(in); },
      data[0],
      {graphed.optimizer.get()});
  for (const auto& batch : data) {
    step(batch);
  }
  ASSERT_TRUE(step.is_captured());
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      BatchNormActPath::kCudnnFused)
      << "the captured step ran the fused kernels";
  EXPECT_EQ(graphed.scaler.get_scale(), eager.scaler.get_scale());
  const auto a = eager.state();
  const auto b = graphed.state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "tensor #" << i;
  }
}

TEST_F(BatchNormActGpu, MomentumNoneInACapturedStepIsAClearError) {
  const auto data = image_batches(1);
  FusedTrainer trainer(std::nullopt);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return trainer.step(in); },
      data[0],
      {trainer.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(1));
  step(data[0]); // eager warm-up: fine
  expect_error([&] { step(data[0]); }, "momentum = None");
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace batch_norm_act_test
