#include <lamp/lamp.h>
#include <lamp/nn/diagnostics.h>

#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <unistd.h>

#include "resnet50_amp/resnet50.h"
#include "support.h"

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace resnet50_test {

namespace {

TEST(ResNet50, HasTorchvisionsParameterCount) {
  resnet::ResNet50 model;
  int64_t count = 0;
  for (const auto& p : model->parameters()) {
    count += p.numel();
  }
  EXPECT_EQ(count, 25557032);
}

TEST(ResNet50, FusedBatchNormKeepsNamesAndOrder) {
  resnet::ResNet50 plain;
  resnet::ResNet50 fused(1000, /*fused_bn=*/true);
  EXPECT_TRUE(fused->fused_bn());
  EXPECT_EQ(fused->named_parameters().keys(), plain->named_parameters().keys());
  EXPECT_EQ(fused->named_buffers().keys(), plain->named_buffers().keys());
  int64_t fused_modules = 0;
  for (const auto& m : fused->modules()) {
    fused_modules += m->as<lamp::nn::BatchNormAct2d>() != nullptr;
  }
  EXPECT_EQ(fused_modules, 1 + 16 * 3) << "the stem's and 3 per bottleneck";
  // The fused tails (lamp::nn::conv_bn_add_relu) use the same modules.
  resnet::ResNet50 tails(1000, /*fused_bn=*/true, /*fused_tail=*/true);
  EXPECT_EQ(tails->named_parameters().keys(), plain->named_parameters().keys());
  EXPECT_EQ(tails->named_buffers().keys(), plain->named_buffers().keys());
}

// The stem's convolution as lamp::nn::space_to_depth_conv2d: the same
// names, outputs and gradients (float64, so only the summation order
// differs).
TEST(ResNet50, SpaceToDepthStemGivesTheSameResults) {
  torch::manual_seed(0);
  resnet::ResNet50 plain(10);
  resnet::ResNet50 s2d(
      10,
      /*fused_bn=*/false,
      /*fused_tail=*/false,
      /*space_to_depth_stem=*/true);
  plain->to(torch::kDouble);
  s2d->to(torch::kDouble);
  ASSERT_EQ(s2d->named_parameters().keys(), plain->named_parameters().keys());
  {
    torch::NoGradGuard no_grad;
    auto to = s2d->named_parameters();
    for (const auto& p : plain->named_parameters()) {
      to[p.key()].copy_(p.value());
    }
  }
  const auto x = torch::randn({2, 3, 64, 64}, torch::kDouble);
  const auto a = plain->forward(x);
  const auto b = s2d->forward(x);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-9);
  a.square().sum().backward();
  b.square().sum().backward();
  const auto& ga = plain->conv1->weight.grad();
  const auto& gb = s2d->conv1->weight.grad();
  EXPECT_LT(
      (ga - gb).abs().max().item<double>(),
      1e-9 * (1 + ga.abs().max().item<double>()));
}

// Loads the weights torchvision produced into the C++ model and compares
// outputs in eval and train mode; `fused_bn`: with lamp::nn::BatchNormAct2d
// (its CPU fallback).
void expect_matches_torchvision(bool fused_bn) {
  // One file per process: ctest runs the two callers in parallel.
  const std::string path = testing::TempDir() + "resnet50_oracle_" +
      std::to_string(getpid()) + ".pt";
  if (!lamp::test::python_can_import("torchvision")) {
    GTEST_SKIP() << "the Python oracle has no torchvision (pip install "
                    "torchvision==0.26.0)";
  }
  lamp::test::run_python_oracle("nn/resnet50_oracle.py", "\"" + path + "\"");
  std::ifstream file(path, std::ios::binary);
  std::vector<char> bytes(
      (std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  const auto oracle = torch::pickle_load(bytes).toGenericDict();
  const auto state = oracle.at("state").toGenericDict();

  torch::manual_seed(1); // different from Python's: every value must load
  resnet::ResNet50 model(1000, fused_bn);
  EXPECT_EQ(oracle.at("parameters").toInt(), 25557032);
  size_t loaded = 0;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    ASSERT_TRUE(state.contains(item.key())) << item.key();
    item.value().copy_(state.at(item.key()).toTensor());
    ++loaded;
  }
  for (auto& item : model->named_buffers()) {
    ASSERT_TRUE(state.contains(item.key())) << item.key();
    item.value().copy_(state.at(item.key()).toTensor());
    ++loaded;
  }
  EXPECT_EQ(loaded, state.size()) << "torchvision has entries we lack";

  const auto x = oracle.at("input").toTensor();
  for (const char* mode : {"eval", "train"}) {
    model->train(std::string(mode) == "train");
    const auto expected = oracle.at(mode).toTensor();
    const auto out = model->forward(x);
    ASSERT_EQ(out.sizes(), expected.sizes());
    const double rel =
        ((out - expected).abs().max() / expected.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-5) << mode << " mode";
  }
}

TEST(ResNet50, MatchesTorchvision) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  expect_matches_torchvision(/*fused_bn=*/false);
}

TEST(ResNet50, MatchesTorchvisionWithFusedBatchNorm) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  expect_matches_torchvision(/*fused_bn=*/true);
  if (IsSkipped()) {
    return;
  }
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      lamp::nn::BatchNormActPath::kComposite)
      << "the CPU runs the fallback";
}

#if LAMP_WITH_CUDA

struct Curve {
  std::vector<double> loss; // per step
  int64_t peak_bytes = 0;
  int64_t fused_calls = 0;
};

// 200 seeded AMP steps (fp16, GradScaler, FusedAdam lr 1e-4, channels-last)
// of ResNet-50 at batch 32, 64x64, cycling over 4 fixed batches of random
// images and labels (so the loss falls as the net memorises them).
// `init_seed` seeds the weights; the data is the same in every run.
Curve train_resnet50(bool fused_bn, uint64_t init_seed) {
  const int64_t steps = 200;
  torch::manual_seed(1234);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 4; ++i) {
    data.emplace_back(
        torch::randn({32, 3, 64, 64}, torch::kCUDA)
            .contiguous(torch::MemoryFormat::ChannelsLast),
        torch::randint(
            1000, {32}, torch::dtype(torch::kLong).device(torch::kCUDA)));
  }
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  torch::manual_seed(init_seed);
  resnet::ResNet50 model(1000, fused_bn);
  model->to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (p.dim() == 4) {
        p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
  }
  lamp::optim::FusedAdam optimizer(
      model->parameters(), torch::optim::AdamOptions(1e-4));
  lamp::GradScaler scaler;
  Curve curve;
  const auto fused_before = lamp::nn::detail::batch_norm_act_path_count(
      lamp::nn::BatchNormActPath::kCudnnFused);
  for (int64_t step = 0; step < steps; ++step) {
    const auto& [images, labels] = data[step % data.size()];
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
      loss = torch::cross_entropy_loss(model->forward(images), labels);
    }
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
    curve.loss.push_back(loss.item<double>());
  }
  curve.fused_calls = lamp::nn::detail::batch_norm_act_path_count(
                          lamp::nn::BatchNormActPath::kCudnnFused) -
      fused_before;
  curve.peak_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0)
                         .allocated_bytes[0]
                         .peak;
  return curve;
}

// Means of consecutive windows of `width` steps.
std::vector<double> windows(const std::vector<double>& loss, size_t width) {
  std::vector<double> out;
  for (size_t i = 0; i + width <= loss.size(); i += width) {
    double sum = 0;
    for (size_t j = i; j < i + width; ++j) {
      sum += loss[j];
    }
    out.push_back(sum / width);
  }
  return out;
}

// Fused and unfused BatchNorm train ResNet-50 alike. The yardstick is the
// spread between two unfused runs that differ only in the weights' seed:
// same data, same steps, a different but equally good start. (Two unfused
// runs from the same seed differ only by cuDNN's nondeterministic
// reductions, which can be none at all, so they give no usable yardstick;
// the fused kernel's rounding -- fp32 all the way where the unfused ops
// round bn(x) to fp16 before the add -- is a perturbation of that same
// small kind.) The fused run starts from the first unfused run's seed;
// over 10 windows of 20 steps its mean distance from that run must not
// exceed the mean distance between the two unfused runs, and it must
// learn (the last window's loss under half the first's).
// Peak memory: the fused kernel keeps what the unfused ops keep (x for the
// batch norm, y for the ReLU, which is the next convolution's input anyway)
// plus cuDNN's 1-bit ReLU mask, 1/16 of an fp16 activation, and never
// materialises bn(x) and bn(x) + z; the step's peak may move by a few
// percent either way: at most 5 % up.
TEST(ResNet50Gpu, FusedBatchNormTrainsLikeUnfused) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto u1 = train_resnet50(/*fused_bn=*/false, 1);
  const auto u2 = train_resnet50(/*fused_bn=*/false, 2);
  const auto f1 = train_resnet50(/*fused_bn=*/true, 1);
  EXPECT_EQ(u1.fused_calls, 0);
  EXPECT_EQ(f1.fused_calls, 200 * (1 + 16 * 3))
      << "every BatchNorm + ReLU ran cuDNN's fused kernel: "
      << lamp::nn::detail::batch_norm_act_fallback_reason();
  const auto w_u1 = windows(u1.loss, 20);
  const auto w_u2 = windows(u2.loss, 20);
  const auto w_f1 = windows(f1.loss, 20);
  double spread = 0;
  double distance = 0;
  std::printf("window  unfused(seed 1)  unfused(seed 2)  fused(seed 1)\n");
  for (size_t w = 0; w < w_u1.size(); ++w) {
    std::printf("%6zu %16.4f %16.4f %14.4f\n", w, w_u1[w], w_u2[w], w_f1[w]);
    spread += std::abs(w_u1[w] - w_u2[w]);
    distance += std::abs(w_f1[w] - w_u1[w]);
  }
  spread /= w_u1.size();
  distance /= w_u1.size();
  std::printf(
      "mean |fused - unfused| %.4f, mean |unfused - unfused(other seed)| "
      "%.4f; peak memory fused %.2f GiB, unfused %.2f GiB\n",
      distance,
      spread,
      f1.peak_bytes / 1073741824.0,
      u1.peak_bytes / 1073741824.0);
  EXPECT_LE(distance, spread);
  EXPECT_LT(w_f1.back(), 0.5 * w_f1.front()) << "the fused run learns";
  EXPECT_LE(f1.peak_bytes, u1.peak_bytes * 1.05) << "peak memory";
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace resnet50_test
