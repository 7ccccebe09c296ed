#include <lamp/lamp.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  std::cout << lamp::build_info() << "\n";
  auto a = torch::randn({4, 4});
  lamp::AutocastGuard autocast(torch::kCPU);
  return torch::mm(a, a).scalar_type() == torch::kBFloat16 ? 0 : 1;
}
