// lamp in 40 lines: an MLP trained with mixed precision (fp16 + loss
// scaling on a GPU, bf16 on the CPU) and the sync-free fused Adam.
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc > 1) { // it takes no flags; --help says what it does
    const bool help = std::string(argv[1]) == "--help";
    (help ? std::cout : std::cerr)
        << "Usage: quickstart (no flags): an MLP "
           "on random data, 100 mixed-precision steps, then its loss\n";
    return help ? 0 : 1;
  }
  const bool cuda = torch::cuda::is_available();
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;
  torch::nn::Sequential model(
      torch::nn::Linear(784, 512),
      torch::nn::ReLU(),
      torch::nn::Linear(512, 10));
  model->to(device);
  lamp::optim::FusedAdam optimizer(
      model->parameters(), torch::optim::AdamOptions(1e-3));
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(cuda));
  const auto x = torch::randn({64, 784}, device);
  const auto y = torch::randint(
      10, {64}, torch::TensorOptions(device).dtype(torch::kLong));
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss;
    { // fp16 on CUDA, bf16 on the CPU: the device's autocast dtype
      lamp::AutocastGuard autocast(device.type());
      loss = torch::cross_entropy_loss(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
  }
  std::cout << "quickstart: loss "
            << torch::cross_entropy_loss(model->forward(x), y).item<double>()
            << " on " << device << "\n";
}
