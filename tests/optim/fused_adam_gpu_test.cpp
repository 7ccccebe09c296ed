// lamp's Adam kernel (src/optim/adam_kernel.cu), which FusedAdam and
// FusedAdamW take for fp32 CUDA parameters: the values of ATen's own fused
// kernels (_fused_adam_ / _fused_adamw_, which Python's fused=True runs),
// bit for bit, step after step: with and without weight decay, a learning
// rate on the host or the device, GradScaler's scale and found_inf (the
// step skipped), sizes not a multiple of 4, many tiles, a transposed
// parameter, one whose memory is not 16-byte aligned, and more tensors
// than one launch takes. AMSGrad stays ATen's.

#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>

#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fused_adam_gpu_test {

namespace {

struct Case {
  std::string name;
  bool decoupled;
  double weight_decay;
  bool device_lr;
  bool scaled; // GradScaler's grad_scale, and a found_inf at step 3
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

// Parameters of awkward shapes (see the file's comment); 80 in all, more
// than one launch's AdamList::kMax.
std::vector<torch::Tensor> make_params() {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  std::vector<torch::Tensor> p{
      torch::randn({7}, cuda),
      torch::randn({1000003}, cuda),
      torch::randn({300, 200}, cuda).t(), // dense, not contiguous
      torch::randn({4097}, cuda).narrow(0, 1, 4096), // 4-byte aligned
      torch::randn({64, 48}, cuda)};
  while (p.size() < 80) {
    p.push_back(torch::randn({static_cast<int64_t>(p.size()) * 13}, cuda));
  }
  return p;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) {
    // Keeps the layout (and the unaligned view's offset).
    auto c = torch::empty_strided(t.sizes(), t.strides(), t.options());
    if (t.storage_offset() != 0) {
      c = torch::empty({t.numel() + 1}, t.options()).narrow(0, 1, t.numel());
    }
    c.copy_(t);
    out.push_back(c);
  }
  return out;
}

class FusedAdamGpu : public lamp::test::GpuTest,
                     public testing::WithParamInterface<Case> {};

TEST_P(FusedAdamGpu, EqualsAtensFusedKernelBitForBit) {
  const auto& c = GetParam();
  torch::manual_seed(3);
  auto params = make_params();
  for (auto& p : params) {
    p.requires_grad_();
  }
  torch::NoGradGuard no_grad;
  // ATen's side: the same tensors cloned, states and steps of its own.
  auto ref = clones(params);
  std::vector<torch::Tensor> ref_m, ref_v, ref_steps, ref_grads;
  for (const auto& p : ref) {
    ref_m.push_back(torch::zeros_like(p));
    ref_v.push_back(torch::zeros_like(p));
    ref_steps.push_back(torch::zeros({}, p.options()));
  }
  const double lr = 1e-2, beta1 = 0.85, beta2 = 0.995, eps = 1e-7;
  std::unique_ptr<lamp::optim::FusedOptimizer> opt;
  if (c.decoupled) {
    opt = std::make_unique<lamp::optim::FusedAdamW>(
        params,
        torch::optim::AdamWOptions(lr)
            .betas({beta1, beta2})
            .eps(eps)
            .weight_decay(c.weight_decay));
  } else {
    opt = std::make_unique<lamp::optim::FusedAdam>(
        params,
        torch::optim::AdamOptions(lr)
            .betas({beta1, beta2})
            .eps(eps)
            .weight_decay(c.weight_decay));
  }
  opt->use_device_lr(c.device_lr);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto lr_tensor = torch::full({}, lr, cuda);
  for (int step = 1; step <= 5; ++step) {
    std::vector<torch::Tensor> ref_g;
    for (size_t i = 0; i < params.size(); ++i) {
      // Laid out as the parameter (else ATen would not take it either).
      const auto g = torch::randn(params[i].sizes(), cuda) * 100;
      auto like = [&] {
        return torch::empty_strided(
                   params[i].sizes(), params[i].strides(), cuda)
            .copy_(g);
      };
      params[i].mutable_grad() = like();
      ref_g.push_back(like());
    }
    std::optional<torch::Tensor> scale, inf;
    if (c.scaled) {
      scale = torch::full({}, 65536.0, cuda);
      inf = torch::full({}, step == 3 ? 1.0 : 0.0, cuda);
    }
    opt->step_scaled(scale, inf);
    at::_foreach_add_(ref_steps, 1);
    auto run = [&](const auto& lr_arg) {
      if (c.decoupled) {
        at::_fused_adamw_(
            ref,
            ref_g,
            ref_m,
            ref_v,
            {},
            ref_steps,
            lr_arg,
            beta1,
            beta2,
            c.weight_decay,
            eps,
            false,
            false,
            scale,
            inf);
      } else {
        at::_fused_adam_(
            ref,
            ref_g,
            ref_m,
            ref_v,
            {},
            ref_steps,
            lr_arg,
            beta1,
            beta2,
            c.weight_decay,
            eps,
            false,
            false,
            scale,
            inf);
      }
    };
    if (c.device_lr) {
      run(lr_tensor);
    } else {
      run(lr);
    }
    if (inf) {
      at::_foreach_add_(ref_steps, *inf, -1);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(torch::equal(params[i], ref[i]))
          << "step " << step << ", parameter " << i << ": max difference "
          << (params[i] - ref[i]).abs().max().item<double>();
      // GradScaler's case: the gradient written back unscaled, as ATen's.
      ASSERT_TRUE(torch::equal(params[i].grad(), ref_g[i])) << i;
    }
  }
  // The moments too (the state the next step reads).
  for (size_t i = 0; i < params.size(); ++i) {
    auto& state = static_cast<lamp::optim::FusedAdamParamState&>(
        *opt->state().at(params[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(torch::equal(state.exp_avg(), ref_m[i])) << i;
    EXPECT_TRUE(torch::equal(state.exp_avg_sq(), ref_v[i])) << i;
    EXPECT_TRUE(torch::equal(state.step(), ref_steps[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases,
    FusedAdamGpu,
    testing::Values(
        Case{"adamw", true, 0.1, false, false},
        Case{"adamw_no_decay", true, 0.0, false, false},
        Case{"adamw_device_lr_scaled", true, 0.1, true, true},
        Case{"adam", false, 0.0, false, false},
        Case{"adam_decay_scaled", false, 0.05, false, true},
        Case{"adam_device_lr", false, 0.05, true, false}),
    case_name);

} // namespace

} // namespace fused_adam_gpu_test
