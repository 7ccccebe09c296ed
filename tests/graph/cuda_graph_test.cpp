#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "amp_trainer.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace cuda_graph_test {

namespace {

using lamp::test::expect_error;

TEST(GraphedStep, RejectsTorchOptimOptimizers) {
  torch::nn::Linear model(4, 2);
  torch::optim::Adam adam(model->parameters());
  expect_error(
      [&] {
        lamp::GraphedStep(
            [](const std::vector<torch::Tensor>&) { return torch::Tensor(); },
            {},
            {&adam});
      },
      "optimizer #0 is not a lamp::optim::FusedOptimizer");
  expect_error(
      [&] {
        lamp::GraphedStep(
            [](const std::vector<torch::Tensor>&) { return torch::Tensor(); },
            {},
            {});
      },
      "pass the optimizer(s) the step uses");
}

TEST(GraphedStep, RejectsBadOptionsAndCpuInputs) {
  torch::nn::Linear model(4, 2);
  lamp::optim::FusedSGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto step = [](const std::vector<torch::Tensor>&) { return torch::Tensor(); };
  expect_error(
      [&] {
        lamp::GraphedStep(
            step, {}, {&sgd}, lamp::GraphedStepOptions().warmup_steps(0));
      },
      "warmup_steps must be >= 1");
  expect_error(
      [&] { lamp::GraphedStep(step, {torch::ones({2})}, {&sgd}); },
      lamp::build_info().find("CUDA") != std::string::npos
          ? "must be a CUDA tensor"
          : "built without CUDA");
}

#if LAMP_WITH_CUDA

// A small net; `conv` makes it convolutional, with BatchNorm (channels-last
// in an AmpTrainer). In capture, the fused optimizers get its large tensors
// in slices, over 2-3 graph branches.
struct SmallNetImpl : torch::nn::SequentialImpl {
  explicit SmallNetImpl(bool conv) {
    if (conv) {
      push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3)));
      push_back(torch::nn::BatchNorm2d(32));
      push_back(torch::nn::ReLU());
      push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
      push_back(torch::nn::ReLU());
      push_back(torch::nn::AdaptiveAvgPool2d(1));
      push_back(torch::nn::Flatten());
      push_back(torch::nn::Linear(64, 10));
    } else {
      push_back(torch::nn::Linear(32, 8192));
      push_back(torch::nn::ReLU());
      push_back(torch::nn::Linear(8192, 10));
    }
  }
};

using Trainer = lamp::test::AmpTrainer<SmallNetImpl>;
using lamp::test::TrainWith;

std::vector<std::vector<torch::Tensor>> batches(bool conv, int64_t n) {
  torch::manual_seed(11);
  std::vector<std::vector<torch::Tensor>> out;
  for (int64_t i = 0; i < n; ++i) {
    auto x = conv ? torch::randn({16, 3, 12, 12}, torch::kCUDA)
                        .contiguous(torch::MemoryFormat::ChannelsLast)
                  : torch::randn({16, 32}, torch::kCUDA);
    if (i == 5 || i == 6) {
      x.fill_(INFINITY); // two overflowing steps: skipped, scale backs off
    }
    out.push_back(
        {x,
         torch::randint(
             0, 10, {16}, torch::dtype(torch::kLong).device(torch::kCUDA))});
  }
  return out;
}

class GraphedStepGpu : public lamp::test::GpuTest {
 protected:
  // N graphed steps against N eager ones from the same start.
  void expect_same_training(bool conv, bool sgd = false) {
    const auto data = batches(conv, 12);
    const auto with = sgd ? TrainWith::kSgdMomentum : TrainWith::kAdam;
    Trainer eager(with, conv);
    std::vector<double> eager_scales;
    for (const auto& batch : data) {
      eager.step(batch);
      eager_scales.push_back(eager.scaler.get_scale());
    }

    Trainer graphed(with, conv);
    lamp::GraphedStep step(
        [&](const std::vector<torch::Tensor>& in) { return graphed.step(in); },
        data[0],
        {graphed.optimizer.get()});
    std::vector<double> graphed_scales;
    for (const auto& batch : data) {
      step(batch);
      graphed_scales.push_back(graphed.scaler.get_scale());
    }
    EXPECT_TRUE(step.is_captured());
    EXPECT_EQ(graphed_scales, eager_scales);
    EXPECT_LT(eager_scales[6], eager_scales[4]) << "the inf steps backed off";
    const auto a = eager.state();
    const auto b = graphed.state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      // NOTE: equal_nan: the inf batches make BatchNorm's running statistics
      // NaN in both runs (skipping a step protects parameters, not buffers).
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6, /*equal_nan=*/true))
          << "tensor #" << i;
    }
  }
};

TEST_F(GraphedStepGpu, MatchesEagerStepsIncludingSkippedOnes) {
  expect_same_training(/*conv=*/false);
}

TEST_F(GraphedStepGpu, MatchesEagerWithBatchNormAndChannelsLast) {
  expect_same_training(/*conv=*/true);
}

TEST_F(GraphedStepGpu, MatchesEagerWithFusedSgdMomentum) {
  expect_same_training(/*conv=*/false, /*sgd=*/true);
}

TEST_F(GraphedStepGpu, ReplaysWithoutTouchingTheHost) {
  Trainer t(false);
  const auto data = batches(false, 5);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return t.step(in); },
      data[0],
      {t.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(1));
  step(data[0]);
  step(data[1]); // captured and replayed
  c10::cuda::warning_state().set_sync_debug_mode(
      c10::cuda::SyncDebugMode::L_ERROR);
  EXPECT_NO_THROW(step(data[2]));
  EXPECT_NO_THROW(step(data[3]));
  c10::cuda::warning_state().set_sync_debug_mode(
      c10::cuda::SyncDebugMode::L_DISABLED);
}

// The warm-up steps' freed activations do not stay cached beside the
// graph's pool: a step with a 512 MiB temporary reserves it once, not twice.
TEST_F(GraphedStepGpu, CaptureGivesTheWarmUpStepsCachedMemoryBack) {
  Trainer t(false);
  const auto data = batches(false, 3);
  constexpr int64_t kBig = int64_t{512} << 20;
  auto reserved = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(
               c10::cuda::current_device())
        .reserved_bytes[0]
        .current;
  };
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        const auto big = torch::ones({kBig / 4}, in[0].options());
        return t.step(in) + big[0] * 0;
      },
      data[0],
      {t.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(1));
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t before = reserved();
  step(data[0]); // warm-up: the temporary is freed, its block cached
  torch::cuda::synchronize();
  EXPECT_GE(reserved() - before, kBig);
  step(data[1]); // capture: the graph's pool holds the temporary
  torch::cuda::synchronize();
  EXPECT_LT(reserved() - before, kBig + kBig / 2);
}

TEST_F(GraphedStepGpu, HostSyncInTheStepIsAClearError) {
  Trainer t(false);
  const auto data = batches(false, 3);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        auto loss = t.step(in);
        (void)loss.item<float>(); // not capturable
        return loss;
      },
      data[0],
      {t.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(1));
  step(data[0]);
  expect_error([&] { step(data[1]); }, "could not be captured");
  EXPECT_FALSE(step.is_captured());
  // The device, the allocator and the random generator are usable after.
  EXPECT_EQ(torch::ones({4}, torch::kCUDA).sum().item<float>(), 4.0f);
  EXPECT_EQ(torch::randn({4}, torch::kCUDA).numel(), 4);
}

// A parameter whose first gradient comes inside the capture would have its
// Adam moments created, and so reset, by every replay: refused.
TEST_F(GraphedStepGpu, OptimizerStateMadeDuringTheCaptureIsRefused) {
  auto used = torch::randn({4, 4}, torch::kCUDA).requires_grad_();
  auto late = torch::randn({4}, torch::kCUDA).requires_grad_();
  lamp::optim::FusedAdam optimizer({used, late});
  int64_t calls = 0;
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        optimizer.zero_grad();
        auto loss = in[0].matmul(used).sum();
        if (++calls > 1) { // from the capture on
          loss = loss + late.sum();
        }
        loss.backward();
        optimizer.step();
        return loss;
      },
      {torch::randn({2, 4}, torch::kCUDA)},
      {&optimizer},
      lamp::GraphedStepOptions().warmup_steps(1));
  const auto x = torch::randn({2, 4}, torch::kCUDA);
  step({x});
  expect_error(
      [&] { step({x}); }, "got its first gradient inside a CUDA graph capture");
  EXPECT_FALSE(step.is_captured());
}

TEST_F(GraphedStepGpu, ShapeChangesAreAClearError) {
  Trainer t(false);
  const auto data = batches(false, 4);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return t.step(in); },
      data[0],
      {t.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(1));
  step(data[0]);
  step(data[1]);
  expect_error(
      [&] {
        step({data[2][0].narrow(0, 0, 8), data[2][1].narrow(0, 0, 8)});
      },
      "pad or drop a last partial batch");
  step.reset();
  EXPECT_NO_THROW(step(data[2]));
  EXPECT_TRUE(step.is_captured());
}

TEST_F(GraphedStepGpu, LearningRateScheduleReachesTheGraph) {
  const auto data = batches(false, 12);
  auto set_lr = [](Trainer& t, int64_t i) {
    static_cast<torch::optim::AdamOptions&>(
        t.optimizer->param_groups()[0].options())
        .lr(1e-2 * (1.0 - i / 12.0));
  };
  Trainer eager(false);
  for (int64_t i = 0; i < 12; ++i) {
    set_lr(eager, i);
    eager.step(data[i]);
  }
  Trainer graphed(false);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return graphed.step(in); },
      data[0],
      {graphed.optimizer.get()});
  for (int64_t i = 0; i < 12; ++i) {
    set_lr(graphed, i);
    step(data[i]);
  }
  const auto a = eager.state();
  const auto b = graphed.state();
  for (size_t i = 0; i < a.size(); ++i) {
    // NOTE: equal_nan: the inf batches make BatchNorm's running statistics
    // NaN in both runs (skipping a step protects parameters, not buffers).
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6, /*equal_nan=*/true))
        << "tensor #" << i;
  }
}

// beta1 is a kernel argument inside the graph: changing it after the capture
// (as OneCycleLR's momentum cycling would) must not be silently ignored.
TEST_F(GraphedStepGpu, HyperparameterChangeAfterCaptureIsAClearError) {
  const auto data = batches(false, 6);
  Trainer graphed(false);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return graphed.step(in); },
      data[0],
      {graphed.optimizer.get()});
  for (int64_t i = 0; i < 5; ++i) {
    step(data[i]); // 3 warm-up steps, the capture, a replay
  }
  ASSERT_TRUE(step.is_captured());
  auto& options = static_cast<torch::optim::AdamOptions&>(
      graphed.optimizer->param_groups()[0].options());
  options.betas(std::make_tuple(0.85, 0.999));
  expect_error(
      [&] { step(data[5]); },
      "param group 0: betas[0] changed from 0.9 to 0.85 after the step was "
      "captured");
  step.reset(); // captures again with the new beta1
  step(data[5]);
  EXPECT_TRUE(step.is_captured());
}

TEST_F(GraphedStepGpu, TorchOptimUnderTheScalerCannotBeCaptured) {
  // Bypass GraphedStep's own check: GradScaler itself must refuse.
  torch::nn::Linear model(8, 2);
  model->to(torch::kCUDA);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  lamp::GradScaler scaler;
  auto x = torch::randn({4, 8}, torch::kCUDA);
  auto run = [&] {
    sgd.zero_grad();
    scaler.scale(model->forward(x).sum()).backward();
    scaler.step(sgd);
    scaler.update();
  };
  auto side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    run();
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStreamGuard guard(side);
  const auto pool = at::cuda::graph_pool_handle();
  graph.capture_begin(pool);
  expect_error(run, "a torch::optim optimizer inside CUDA graph capture");
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(side, &partial);
  if (partial) {
    cudaGraphDestroy(partial);
  }
  c10::cuda::CUDACachingAllocator::endAllocateToPool(side.device_index(), pool);
  c10::cuda::CUDACachingAllocator::releasePool(side.device_index(), pool);
  at::cuda::CUDAGraph repair; // runs the generator's capture epilogue
  repair.capture_begin();
  repair.capture_end();
  EXPECT_EQ(torch::randn({2}, torch::kCUDA).numel(), 2);
}

// Two param groups, a then b, under plain SGD (no optimizer state, which
// would be created in the capture too); b is used only when asked. Every
// TwoGroups starts from the same weights.
struct TwoGroups {
  TwoGroups() {
    // NOTE: seeded before the layers are made (as members initialised in
    // the declaration they would take their weights from the generator's
    // state before the seed, different for each TwoGroups).
    torch::manual_seed(3);
    a = torch::nn::Linear(8, 8);
    b = torch::nn::Linear(8, 4);
    a->to(torch::kCUDA);
    b->to(torch::kCUDA);
    optimizer = std::make_unique<lamp::optim::FusedSGD>(
        std::vector<torch::optim::OptimizerParamGroup>{
            torch::optim::OptimizerParamGroup(a->parameters()),
            torch::optim::OptimizerParamGroup(b->parameters())},
        torch::optim::SGDOptions(0.1));
  }
  torch::Tensor step(const std::vector<torch::Tensor>& in, bool use_b) {
    optimizer->zero_grad();
    auto h = torch::relu(a->forward(in[0]));
    auto loss = (use_b ? b->forward(h) : h).pow(2).mean();
    loss.backward();
    optimizer->step();
    return loss.detach();
  }
  // b's learning rate before step i: a schedule the graph must follow.
  void set_lr_b(int64_t i) {
    optimizer->param_groups()[1].options().set_lr(0.1 * (1.0 - i / 10.0));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  std::unique_ptr<lamp::optim::FusedSGD> optimizer;
};

// A param group that gets its first gradients in the captured step: its
// state would be made by the graph, so the capture is refused.
TEST_F(GraphedStepGpu, GroupWithoutGradientsInTheWarmUpIsRefusedAtCapture) {
  torch::manual_seed(5);
  std::vector<std::vector<torch::Tensor>> data;
  for (int i = 0; i < 10; ++i) {
    data.push_back({torch::randn({16, 8}, torch::kCUDA)});
  }
  // The graphed run: b's first gradient comes in the captured step, which
  // is refused (its state would be made by the graph); a warm-up long
  // enough for b makes the same run capturable, and its lr schedule
  // reaches the graph.
  {
    TwoGroups graphed;
    bool use_b = false;
    lamp::GraphedStep step(
        [&](const std::vector<torch::Tensor>& in) {
          return graphed.step(in, use_b);
        },
        data[0],
        {graphed.optimizer.get()});
    for (int64_t i = 0; i < 3; ++i) {
      step(data[i]);
    }
    use_b = true;
    expect_error(
        [&] { step(data[3]); },
        "got its first gradient inside a CUDA graph capture");
  }
}

// A param group whose parameters get gradients only from a later warm-up
// step on (its state exists before the capture): the graph captured after
// that trains as the same steps run eagerly, the group's learning-rate
// schedule included.
TEST_F(GraphedStepGpu, LearningRateOfALateGroupReachesTheGraph) {
  torch::manual_seed(5);
  std::vector<std::vector<torch::Tensor>> data;
  for (int i = 0; i < 10; ++i) {
    data.push_back({torch::randn({16, 8}, torch::kCUDA)});
  }
  TwoGroups eager;
  for (int64_t i = 0; i < 10; ++i) {
    eager.set_lr_b(i);
    eager.step(data[i], i >= 3);
  }
  TwoGroups graphed;
  bool use_b = false;
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        return graphed.step(in, use_b);
      },
      data[0],
      {graphed.optimizer.get()},
      lamp::GraphedStepOptions().warmup_steps(4));
  for (int64_t i = 0; i < 10; ++i) {
    graphed.set_lr_b(i);
    use_b = i >= 3; // b gets gradients from the last warm-up step on
    step(data[i]);
    if (i == 3) {
      // The warm-up steps run eagerly.
      EXPECT_FALSE(step.is_captured());
    }
  }
  EXPECT_TRUE(step.is_captured());
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::allclose(graphed.a->weight, eager.a->weight, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(graphed.b->weight, eager.b->weight, 1e-5, 1e-6))
      << "b's learning rate did not reach the graph";
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace cuda_graph_test
