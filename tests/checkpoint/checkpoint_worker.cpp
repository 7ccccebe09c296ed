// A separate process for tests/checkpoint_test.cpp: resuming must work in a
// new process, and a save is killed from outside.
//
//   checkpoint_worker train MODEL STEPS STOP DIR fresh|resume [cpu|cuda]
//     Trains MODEL (mlp: dropout MLP; conv: conv + BatchNorm net) for steps
//     [first, STOP) of a STEPS-step run: FusedAdam + GradScaler (an inf at
//     steps 5 and 6) + warm-up/cosine schedule + gradient clipping; on
//     CUDA under fp16 autocast with deterministic cuDNN. Batches draw from
//     the global CPU RNG, dropout from the device's. Starts from the newest
//     checkpoint in DIR with `resume`, saves one at STOP. Prints
//     "step I LOSS SCALE" per step (hex floats) and, at the end, one
//     "tensor NAME HASH" per parameter, buffer and optimizer state tensor.
//   checkpoint_worker save-loop DIR MIB [async]
//     Fills a MIB-MiB model with k and saves checkpoint k, for k = 1, 2, ...
//     forever, printing "saved k" once checkpoint k is written. With
//     `async` the saves are background saves (async_save): the model is
//     filled with k + 1 while checkpoint k is written, and "saved k" is
//     printed when save(k + 1), which waits for it, returns.

#include <lamp/lamp.h>

#include <torch/torch.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace {

// A hash of the tensor's bytes: equal hashes = bitwise equal (as far as
// the test cares).
uint64_t hash(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  uint64_t h = 1469598103934665603ULL; // FNV-1a
  for (int64_t i = 0; i < c.nbytes(); ++i) {
    h = (h ^ p[i]) * 1099511628211ULL;
  }
  return h;
}

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : conv(register_module(
            "conv",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(8))),
        fc(register_module("fc", torch::nn::Linear(8 * 8 * 8, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc(torch::relu(bn(conv(x))).flatten(1));
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvNet);

int train(
    const std::string& which,
    int64_t steps,
    int64_t stop,
    const std::string& dir,
    bool resume,
    const torch::Device& device) {
  torch::manual_seed(0);
  if (device.is_cuda()) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  torch::nn::Sequential mlp(
      torch::nn::Linear(32, 64),
      torch::nn::ReLU(),
      torch::nn::Dropout(0.2),
      torch::nn::Linear(64, 10));
  ConvNet conv;
  torch::nn::Module& model =
      which == "mlp" ? static_cast<torch::nn::Module&>(*mlp) : *conv;
  model.to(device);
  auto forward = [&](const torch::Tensor& x) {
    lamp::AutocastGuard autocast(
        device.type(), torch::kHalf, /*enabled=*/device.is_cuda());
    return which == "mlp" ? mlp->forward(x) : conv->forward(x);
  };
  lamp::optim::FusedAdam optimizer(
      model.parameters(), torch::optim::AdamOptions(1e-2));
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(256).growth_interval(4));

  // Warm-up + cosine, the common recipe.
  namespace lo = lamp::optim;
  lo::SequentialLR schedule(
      optimizer,
      {std::make_shared<lo::LinearLR>(optimizer, 0.1, 1.0, 5),
       std::make_shared<lo::CosineAnnealingLR>(optimizer, steps - 5)},
      {5});
  int64_t step = 0;
  lamp::TrainingState state;
  state.add("model", model)
      .add("optimizer", optimizer)
      .add("scaler", scaler)
      .add("schedule", schedule)
      .add("step", step);
  lamp::CheckpointManager checkpoints(dir);
  if (resume) {
    checkpoints.load_latest(state);
  }
  for (; step < stop; ++step) {
    const auto x =
        (which == "mlp" ? torch::randn({16, 32}) : torch::randn({16, 3, 8, 8}))
            .to(device);
    const auto y = torch::randint(10, {16}).to(device);
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(forward(x), y);
    scaler.scale(loss).backward();
    if (step == 5 || step == 6) {
      auto& g = model.parameters()[0].mutable_grad();
      g.view(-1)[0] = std::numeric_limits<float>::infinity();
    }
    scaler.unscale_(optimizer);
    lamp::clip_grad_norm_(model.parameters(), 0.5);
    scaler.step(optimizer);
    scaler.update();
    schedule.step();
    std::printf(
        "step %" PRId64 " %a %a\n",
        step,
        loss.item<double>(),
        scaler.get_scale());
  }
  if (stop < steps) {
    checkpoints.save(state, step);
    return 0;
  }
  for (const auto& p : model.named_parameters()) {
    std::printf("tensor %s %016" PRIx64 "\n", p.key().c_str(), hash(p.value()));
  }
  for (const auto& b : model.named_buffers()) {
    std::printf("tensor %s %016" PRIx64 "\n", b.key().c_str(), hash(b.value()));
  }
  for (const auto& p : model.parameters()) {
    const auto& s = static_cast<const lamp::optim::FusedAdamParamState&>(
        *optimizer.state().at(p.unsafeGetTensorImpl()));
    std::printf(
        "tensor adam %016" PRIx64 " %016" PRIx64 " %016" PRIx64 "\n",
        hash(s.step()),
        hash(s.exp_avg()),
        hash(s.exp_avg_sq()));
  }
  return 0;
}

int save_loop(const std::string& dir, int64_t mib, bool async) {
  torch::nn::Linear model(1024, mib * 256); // 4 KiB a row
  int64_t step = 0;
  lamp::TrainingState state;
  state.add("model", *model).add("step", step);
  lamp::CheckpointManager checkpoints(
      dir, lamp::CheckpointManagerOptions().keep_last(2).async_save(async));
  for (step = 1;; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) {
        p.fill_(static_cast<double>(step));
      }
    }
    checkpoints.save(state, step);
    if (async && step == 1) {
      continue;
    }
    std::printf("saved %" PRId64 "\n", async ? step - 1 : step);
    std::fflush(stdout);
  }
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train" && argc >= 7) {
    return train(
        argv[2],
        std::stoll(argv[3]),
        std::stoll(argv[4]),
        argv[5],
        std::string(argv[6]) == "resume",
        torch::Device(argc > 7 ? argv[7] : "cpu"));
  }
  if (mode == "save-loop" && (argc == 4 || argc == 5)) {
    return save_loop(
        argv[2],
        std::stoll(argv[3]),
        argc == 5 && std::string(argv[4]) == "async");
  }
  std::fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__);
  return 2;
}
