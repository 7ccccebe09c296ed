#pragma once

// A small CUDA training loop for the fused layers' GraphedStep tests: fp16
// autocast, GradScaler and FusedAdam over a net's channels-last parameters,
// so that a test can run the same steps eagerly and captured and compare
// the states.

#include <lamp/autocast.h>
#include <lamp/grad_scaler.h>
#include <lamp/optim.h>
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

namespace lamp::test {

template <typename Net>
struct AmpTrainer {
  // Net(args...) under seed 7, on CUDA, its 4-d parameters channels-last.
  template <typename... Args>
  explicit AmpTrainer(Args&&... args) {
    torch::manual_seed(7);
    net = std::make_shared<Net>(std::forward<Args>(args)...);
    net->to(torch::kCUDA);
    for (auto& p : net->parameters()) {
      if (p.dim() == 4) {
        p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
    optimizer = std::make_unique<lamp::optim::FusedAdam>(
        net->parameters(), torch::optim::AdamOptions(1e-2));
  }

  // One step on {images, labels}; returns the loss.
  torch::Tensor step(const std::vector<torch::Tensor>& in) {
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      loss = torch::cross_entropy_loss(net->forward(in[0]), in[1]);
    }
    scaler.scale(loss).backward();
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
  std::unique_ptr<lamp::optim::FusedAdam> optimizer;
};

} // namespace lamp::test
