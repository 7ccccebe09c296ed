#pragma once

// A small CUDA training loop for the GraphedStep tests: fp16 autocast,
// GradScaler and a fused optimizer over a net's channels-last parameters,
// so that a test can run the same steps eagerly and captured and compare
// the states.

#include <lamp/autocast.h>
#include <lamp/grad_scaler.h>
#include <lamp/optim.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace lamp::test {

// The optimizer an AmpTrainer trains with (learning rate 1e-2).
enum class TrainWith { kAdam, kSgdMomentum };

template <typename Net>
struct AmpTrainer {
  // Net(args...) under seed 7, on CUDA, its 4-d parameters channels-last,
  // trained with FusedAdam.
  template <typename... Args>
  explicit AmpTrainer(Args&&... args)
      : AmpTrainer(TrainWith::kAdam, std::forward<Args>(args)...) {}

  // The same, trained with `with`.
  template <typename... Args>
  explicit AmpTrainer(TrainWith with, Args&&... args) {
    torch::manual_seed(7);
    net = std::make_shared<Net>(std::forward<Args>(args)...);
    net->to(torch::kCUDA);
    for (auto& p : net->parameters()) {
      if (p.dim() == 4) {
        p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
    if (with == TrainWith::kSgdMomentum) {
      optimizer = std::make_unique<lamp::optim::FusedSGD>(
          net->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
    } else {
      optimizer = std::make_unique<lamp::optim::FusedAdam>(
          net->parameters(), torch::optim::AdamOptions(1e-2));
    }
  }

  // One step on {inputs, labels}; returns the loss.
  torch::Tensor step(const std::vector<torch::Tensor>& in) {
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      loss = torch::cross_entropy_loss(net->forward(in[0]), in[1]);
    }
    scaler.scale(loss).backward();
    if (clip_in_step > 0) {
      norm = scaler.clip_grad_norm_and_step(*optimizer, clip_in_step);
      scaler.update();
      return loss;
    }
    if (after_unscale) {
      scaler.unscale_(*optimizer);
      after_unscale();
    }
    scaler.step(*optimizer);
    scaler.update();
    return loss;
  }

  // Copies of every parameter, then every buffer.
  std::vector<torch::Tensor> state() {
    std::vector<torch::Tensor> out;
    for (const auto& t : net->parameters()) {
      out.push_back(t.detach().clone());
    }
    for (const auto& t : net->buffers()) {
      out.push_back(t.detach().clone());
    }
    return out;
  }

  std::shared_ptr<Net> net;
  lamp::GradScaler scaler{
      lamp::GradScalerOptions().init_scale(1024).growth_interval(3)};
  std::unique_ptr<lamp::optim::FusedOptimizer> optimizer;
  // When set, step() unscales the gradients and calls it before the
  // optimizer's step (where a training loop clips).
  std::function<void()> after_unscale;
  // When positive, step() ends with
  // scaler.clip_grad_norm_and_step(*optimizer, clip_in_step) instead (the
  // norm in `norm`).
  double clip_in_step = 0;
  torch::Tensor norm;
};

} // namespace lamp::test
