// lamp::nn::BatchCountGuard: after the guard, every num_batches_tracked (and
// every other buffer) holds what it holds without the guard, whatever ran;
// inside a captured GraphedStep every replay counts (*Gpu).
#include <lamp/lamp.h>
#include <lamp/nn/diagnostics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include "amp_trainer.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace batch_count_test {

namespace {

using lamp::nn::BatchCountGuard;
using lamp::nn::BatchNormAct2d;
using lamp::nn::BatchNormAct2dImpl;
using lamp::nn::BatchNormAct2dOptions;

// One of each case: a module run twice, one with a residual, one never run,
// one in evaluation mode, one with momentum = None, one without running
// statistics, and a shared one registered under two names.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    frozen->eval();
    register_module("shared_again", shared);
  }
  torch::Tensor forward(const torch::Tensor& x, bool fail = false) {
    auto h = twice(twice(x));
    h = residual(h, x);
    h = frozen(h);
    h = cumulative(h);
    if (fail) {
      throw std::runtime_error("forward failed half way");
    }
    h = untracked(h);
    return shared(h);
  }
  BatchNormAct2d twice{register_module("twice", BatchNormAct2d(4))};
  BatchNormAct2d residual{register_module(
      "residual",
      BatchNormAct2d(BatchNormAct2dOptions(4).relu(false)))};
  BatchNormAct2d unused{register_module("unused", BatchNormAct2d(4))};
  BatchNormAct2d frozen{register_module("frozen", BatchNormAct2d(4))};
  BatchNormAct2d cumulative{register_module(
      "cumulative",
      BatchNormAct2d(BatchNormAct2dOptions(4).momentum(std::nullopt)))};
  BatchNormAct2d untracked{register_module(
      "untracked",
      BatchNormAct2d(BatchNormAct2dOptions(4).track_running_stats(false)))};
  BatchNormAct2d shared{register_module("shared", BatchNormAct2d(4))};
};
TORCH_MODULE(Net);

int64_t count(const BatchNormAct2d& bn) {
  return bn->num_batches_tracked.item<int64_t>();
}

void expect_same_buffers(Net& a, Net& b) {
  const auto x = a->named_buffers();
  const auto y = b->named_buffers();
  ASSERT_EQ(x.size(), y.size());
  for (const auto& item : x) {
    const auto& other = y[item.key()];
    ASSERT_EQ(item.value().defined(), other.defined()) << item.key();
    if (other.defined()) {
      EXPECT_TRUE(torch::equal(item.value(), other)) << item.key();
    }
  }
}

TEST(BatchCountGuard, CountsWhatRanAsWithoutTheGuard) {
  Net plain;
  Net guarded;
  EXPECT_EQ(BatchCountGuard(*guarded).size(), 5u)
      << "twice, residual, unused, frozen and shared (once): not cumulative "
         "or untracked, which count in their own forward or not at all";
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({2, 4, 3, 3});
    plain->forward(x);
    {
      BatchCountGuard guard(*guarded);
      guarded->forward(x);
      EXPECT_EQ(count(guarded->twice), 2 * step) << "not added yet";
      EXPECT_EQ(count(guarded->cumulative), step + 1)
          << "momentum = None counts in its forward";
    }
    expect_same_buffers(plain, guarded);
  }
  EXPECT_EQ(count(guarded->twice), 6);
  EXPECT_EQ(count(guarded->residual), 3);
  EXPECT_EQ(count(guarded->unused), 0);
  EXPECT_EQ(count(guarded->frozen), 0);
  EXPECT_EQ(count(guarded->shared), 3);
  EXPECT_FALSE(guarded->untracked->num_batches_tracked.defined());

  // The guard has let go: forwards count one by one again.
  guarded->forward(torch::randn({2, 4, 3, 3}));
  EXPECT_EQ(count(guarded->residual), 4);
}

TEST(BatchCountGuard, CountsTheForwardsThatRanWhenOneThrows) {
  Net net;
  EXPECT_THROW(
      {
        BatchCountGuard guard(*net);
        net->forward(torch::randn({2, 4, 3, 3}), /*fail=*/true);
      },
      std::runtime_error);
  EXPECT_EQ(count(net->twice), 2);
  EXPECT_EQ(count(net->residual), 1);
  EXPECT_EQ(count(net->cumulative), 1);
  EXPECT_EQ(count(net->shared), 0) << "its forward never ran";
}

TEST(BatchCountGuard, ASecondGuardLeavesTheModulesToTheFirst) {
  Net net;
  {
    BatchCountGuard outer(*net);
    {
      BatchCountGuard inner(*net->residual);
      EXPECT_EQ(inner.size(), 0u);
      net->forward(torch::randn({2, 4, 3, 3}));
    }
    EXPECT_EQ(count(net->residual), 0) << "the outer guard adds it";
  }
  EXPECT_EQ(count(net->residual), 1);
  EXPECT_EQ(count(net->twice), 2);
}

TEST(BatchCountGuard, AModuleOnItsOwnAndACloneCountForThemselves) {
  BatchNormAct2d bn(4);
  std::shared_ptr<BatchNormAct2dImpl> copy;
  {
    BatchCountGuard guard(*bn);
    EXPECT_EQ(guard.size(), 1u);
    copy = std::dynamic_pointer_cast<BatchNormAct2dImpl>(bn->clone());
    copy->forward(torch::randn({2, 4, 3, 3}));
    EXPECT_EQ(copy->num_batches_tracked.item<int64_t>(), 1)
        << "a clone is not in the guard's list";
    bn->forward(torch::randn({2, 4, 3, 3}));
  }
  EXPECT_EQ(count(bn), 1);
  EXPECT_EQ(copy->num_batches_tracked.item<int64_t>(), 1);
}

#if LAMP_WITH_CUDA

class BatchCountGuardGpu : public lamp::test::GpuTest {};

// A small channels-last network on the fused kernels.
struct ConvNetImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = bn1(conv1(x));
    h = bn2(conv2(h), h);
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d conv1{register_module(
      "conv1",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))};
  BatchNormAct2d bn1{register_module("bn1", BatchNormAct2d(8))};
  torch::nn::Conv2d conv2{register_module(
      "conv2",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)))};
  BatchNormAct2d bn2{register_module("bn2", BatchNormAct2d(8))};
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(8, 10))};
};
TORCH_MODULE(ConvNet);

// SGD with momentum: a step's rounding stays a rounding in the weights
// (see conv_bn_add_relu_test.cpp), so the two runs' statistics agree.
using Trainer = lamp::test::AmpTrainer<ConvNetImpl>;

TEST_F(BatchCountGuardGpu, EveryReplayOfACapturedStepCounts) {
  torch::manual_seed(5);
  std::vector<std::vector<torch::Tensor>> data;
  for (int i = 0; i < 8; ++i) {
    data.push_back(
        {torch::randn({8, 3, 10, 10}, torch::kCUDA)
             .contiguous(torch::MemoryFormat::ChannelsLast),
         torch::randint(
             0, 10, {8}, torch::dtype(torch::kLong).device(torch::kCUDA))});
  }
  Trainer eager(lamp::test::TrainWith::kSgdMomentum);
  Trainer graphed(lamp::test::TrainWith::kSgdMomentum);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        BatchCountGuard count(*graphed.net);
        return graphed.step(in);
      },
      data[0],
      {graphed.optimizer.get()});
  for (const auto& batch : data) {
    eager.step(batch);
    step(batch);
  }
  ASSERT_TRUE(step.is_captured());
  EXPECT_EQ(
      lamp::nn::detail::batch_norm_act_last_path(),
      lamp::nn::BatchNormActPath::kCudnnFused)
      << lamp::nn::detail::batch_norm_act_fallback_reason();
  EXPECT_EQ(graphed.net->bn1->num_batches_tracked.item<int64_t>(), 8);
  EXPECT_EQ(graphed.net->bn2->num_batches_tracked.item<int64_t>(), 8);
  const auto a = eager.net->named_buffers();
  const auto b = graphed.net->named_buffers();
  for (const auto& item : a) {
    EXPECT_TRUE(torch::allclose(item.value(), b[item.key()], 1e-5, 1e-6))
        << item.key();
  }
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace batch_count_test
