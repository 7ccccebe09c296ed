// The code that README.md and docs/*.md show, compiled here so that the docs
// cannot drift from the API (tools/check_doc_snippets.py keeps each quoted
// block equal to its region below; CTest: docs.snippets). The snippets that
// can run on a CPU run as tests too.

#include <lamp/data.h>
#include <lamp/distributed.h>
#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <utility>
#include <vector>

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace doc_snippets_test {

namespace {

using Batches = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

torch::nn::Sequential small_model() {
  return torch::nn::Sequential(
      torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
}

Batches small_batches(int n) {
  Batches batches;
  for (int i = 0; i < n; ++i) {
    batches.emplace_back(torch::randn({4, 8}), torch::randint(4, {4}));
  }
  return batches;
}

torch::Tensor autocast_region(
    torch::nn::Sequential& model,
    const torch::Tensor& x,
    const torch::Tensor& y) {
  // [snippet autocast]
  torch::Tensor loss;
  {
    lamp::AutocastGuard autocast(torch::kCUDA); // with torch.autocast("cuda"):
    loss = torch::cross_entropy_loss(model->forward(x), y);
  }
  loss.backward(); // backward outside the region
  // [end snippet]
  return loss;
}

void grad_scaler_loop(torch::nn::Sequential& model, const Batches& batches) {
  // [snippet grad-scaler]
  lamp::GradScaler scaler; // torch.amp.GradScaler()
  lamp::optim::FusedAdam opt(model->parameters()); // Adam(..., fused=True)
  for (const auto& [x, y] : batches) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.unscale_(opt); // optional: to clip the true gradients
    lamp::clip_grad_norm_(model->parameters(), 1.0);
    scaler.step(opt); // skipped, on the device, if a gradient is inf/NaN
    scaler.update();
  }
  // [end snippet]
}

[[maybe_unused]] void training_loop(
    torch::nn::Sequential& model,
    const Batches& batches,
    int64_t total) {
  // [snippet training-loop]
  namespace lo = lamp::optim;
  lo::FusedAdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  lamp::GradScaler scaler;
  lo::SequentialLR schedule( // 500 steps of warm-up, then a cosine
      opt,
      {std::make_shared<lo::LinearLR>(opt, 0.01, 1.0, 500),
       std::make_shared<lo::CosineAnnealingLR>(opt, total - 500)},
      {500});
  int64_t step = 0;
  lamp::TrainingState state; // what a checkpoint holds
  state.add("model", *model)
      .add("optimizer", opt)
      .add("scaler", scaler)
      .add("scheduler", schedule)
      .add("step", step);
  lamp::CheckpointManager checkpoints("ckpt");
  checkpoints.load_latest(state); // resume, if there is a checkpoint
  while (step < total) {
    const auto& [x, y] = batches[step % batches.size()];
    opt.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.unscale_(opt);
    lamp::clip_grad_norm_(model->parameters(), 1.0);
    scaler.step(opt);
    scaler.update();
    schedule.step();
    if (++step % 1000 == 0) {
      checkpoints.save(state, step);
    }
  }
  // [end snippet]
}

[[maybe_unused]] void ddp_loop(const Batches& my_shard) {
  // [snippet ddp]
  auto pg = lamp::dist::init_process_group(); // a world of one without one
  auto model = small_model();
  model->to(pg->device());
  // Checks that the ranks agree, then broadcasts rank 0's weights.
  lamp::DistributedDataParallel ddp(model.ptr(), pg);
  lamp::optim::FusedAdam optimizer(model->parameters());
  lamp::GradScaler scaler;
  for (const auto& [x, y] : my_shard) { // each rank its own part of the data
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    scaler.scale(loss).backward(); // gradients averaged when it returns
    scaler.step(optimizer);
    scaler.update();
  }
  // [end snippet]
}

[[maybe_unused]] void graphed_step(
    torch::nn::Sequential& model,
    const Batches& batches) {
  lamp::optim::FusedAdam optimizer(model->parameters());
  lamp::GradScaler scaler;
  const auto& [x0, y0] = batches.front();
  // [snippet graphed-step]
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          lamp::AutocastGuard autocast(torch::kCUDA);
          loss = torch::cross_entropy_loss(model->forward(in[0]), in[1]);
        }
        scaler.scale(loss).backward();
        scaler.step(optimizer);
        scaler.update();
        return loss;
      },
      {x0, y0}, // a batch: shapes, dtypes, device
      {&optimizer}); // lamp::optim::Fused* optimizers
  for (const auto& [x, y] : batches) {
    auto loss = step({x, y}); // a device tensor; no host sync
  }
  // [end snippet]
}

torch::Tensor batch_norm_act(
    const torch::Tensor& x,
    const torch::Tensor& identity) {
  torch::nn::Conv2d conv1(torch::nn::Conv2dOptions(4, 4, 1));
  torch::nn::Conv2d conv3(torch::nn::Conv2dOptions(4, 4, 1));
  lamp::nn::BatchNormAct2d bn1(4);
  // [snippet batch-norm-act]
  lamp::nn::BatchNormAct2d bn3(
      lamp::nn::BatchNormAct2dOptions(4).relu(true)); // BatchNorm2d's options
  auto h = bn1(conv1(x)); // relu(bn1(conv1(x)))
  auto out = bn3(conv3(h), identity); // relu(bn3(conv3(h)) + identity)
  // [end snippet]
  return out;
}

[[maybe_unused]] void image_loader(
    const std::shared_ptr<lamp::dist::ProcessGroup>& pg,
    const std::function<void(const lamp::data::ImageBatch&)>& step) {
  // [snippet image-loader]
  lamp::data::ImageFolder train("/data/imagenet/train"); // torchvision's rules
  lamp::data::ImageLoader loader(
      train,
      lamp::data::ImageLoaderOptions() // RandomResizedCrop(224) + flip
          .batch_size(256)
          .device(torch::kCUDA)
          .dtype(torch::kHalf)
          .channels_last(true)
          .num_threads(16)
          .rank(pg->rank()) // DistributedSampler's shard
          .world_size(pg->world_size()));
  for (int64_t epoch = 0; epoch < 90; ++epoch) {
    loader.set_epoch(epoch); // sampler.set_epoch(epoch)
    while (auto batch = loader.next()) {
      step(*batch); // batch->images, batch->targets
    }
  }
  // [end snippet]
}

TEST(DocSnippets, TheAutocastAndGradScalerSnippetsRunOnTheCpu) {
  torch::manual_seed(0);
  auto model = small_model();
  const auto batches = small_batches(3);
  // Without a GPU the CUDA guard disables itself (with a warning).
  const auto loss = autocast_region(model, batches[0].first, batches[0].second);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  const auto before = model->parameters()[0].clone();
  grad_scaler_loop(model, batches);
  EXPECT_FALSE(torch::equal(before, model->parameters()[0]));
}

TEST(DocSnippets, TheBatchNormActSnippetRunsOnTheCpu) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 4, 3, 3});
  const auto out = batch_norm_act(x, torch::randn({2, 4, 3, 3}));
  EXPECT_EQ(out.sizes(), x.sizes());
  EXPECT_GE(out.min().item<double>(), 0.0); // after the ReLU
}

// docs/amp.md's FP8 scope, on the CPU: lamp's Linear runs in FP8 there
// too (the CUDA autocast of the snippet does nothing on the CPU).
TEST(DocSnippets, TheFp8SnippetRunsOnTheCpu) {
  torch::manual_seed(0);
  lamp::nn::Linear model(32, 16);
  const auto x = torch::randn({4, 32});
  torch::Tensor y;
  {
    // [snippet fp8]
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    lamp::Fp8AutocastGuard fp8; // Fp8Recipe().scaling(Fp8Scaling::kCurrent)
    auto out = model->forward(x);
    // [end snippet]
    y = out;
  }
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_FALSE(torch::equal(y, at::linear(x, model->weight, model->bias)));
}

} // namespace

} // namespace doc_snippets_test
