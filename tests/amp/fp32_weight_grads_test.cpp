// CastWeightsOptions::fp32_weight_grads: lamp's linear layers' weight
// gradients straight from the GEMM in fp32 -- the fp32 product of the same
// 16-bit operands, bit for bit; everything else (outputs, the input's and
// biases' gradients, other modules' weights) as without it, bit for bit; a
// weight also read elsewhere gets both gradients; in a checkpoint's
// recompute, a GraphedStep and a double backward; nothing on the CPU.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cast_weights.h>
#include <lamp/cuda_graph.h>
#include <lamp/nn/gelu_mlp.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp32_weight_grads_test {

namespace {

// A GPT block's layers in small: lamp::nn::Linear with a bias, one called
// without (forward_skip_bias), gelu_mlp's two, and a LibTorch Linear (which
// keeps the cast's gradient).
struct NetImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = attn(x).narrow(-1, 0, 16);
    h = proj->forward_skip_bias(h) + proj->bias + x;
    h = lamp::nn::gelu_mlp(h, fc, out) + h;
    return head(h);
  }
  lamp::nn::Linear attn{register_module("attn", lamp::nn::Linear(16, 48))};
  lamp::nn::Linear proj{register_module("proj", lamp::nn::Linear(16, 16))};
  lamp::nn::Linear fc{register_module("fc", lamp::nn::Linear(16, 64))};
  lamp::nn::Linear out{register_module("out", lamp::nn::Linear(64, 16))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(16, 16))};
};
TORCH_MODULE(Net);

Net seeded(torch::Device device) {
  torch::manual_seed(0);
  Net net;
  net->to(device);
  return net;
}

// The names of the weights whose gradients the option makes fp32 products.
bool lamp_weight(const std::string& name) {
  return name == "attn.weight" || name == "proj.weight" ||
      name == "fc.weight" || name == "out.weight";
}

struct Result {
  torch::Tensor y, dx;
  torch::OrderedDict<std::string, torch::Tensor> grads;
};

// One forward under autocast to `dtype` in a CastWeightsGuard (the option
// as given), optionally inside a lamp::checkpoint whose recompute makes its
// own guard (as examples/gpt_amp does), and a backward.
Result run(
    Net& net,
    const torch::Tensor& input,
    c10::ScalarType dtype,
    bool fp32,
    bool checkpointed = false) {
  net->zero_grad();
  const auto device = input.device().type();
  const auto options = lamp::CastWeightsOptions().fp32_weight_grads(fp32);
  const auto x = input.detach().requires_grad_();
  torch::Tensor y;
  {
    lamp::AutocastGuard autocast(device, dtype);
    lamp::CastWeightsGuard cast(*net, device, options);
    if (checkpointed) {
      y = lamp::checkpoint(
          [&](const torch::Tensor& in) {
            std::optional<lamp::CastWeightsGuard> again;
            if (lamp::is_recomputing()) {
              again.emplace(*net, device, options);
            }
            return net->forward(in);
          },
          x);
    } else {
      y = net->forward(x);
    }
  }
  torch::manual_seed(1);
  const auto g = torch::randn(y.sizes(), y.options().dtype(torch::kFloat));
  (y.to(torch::kFloat) * g).sum().backward();
  Result r{
      y.detach(),
      x.grad().clone(),
      torch::OrderedDict<std::string, torch::Tensor>()};
  for (const auto& p : net->named_parameters()) {
    r.grads.insert(p.key(), p.value().grad().clone());
  }
  return r;
}

void expect_equal(
    const torch::Tensor& a,
    const torch::Tensor& b,
    const std::string& what) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(a, b))
      << what << ": largest difference " << (a - b).abs().max().item<double>();
}

// On and off: the same outputs and gradients but the lamp layers' weights'
// (fp32, within one rounding to `dtype` of the rounded ones).
void expect_only_weight_grads_differ(
    const Result& on,
    const Result& off,
    c10::ScalarType dtype) {
  expect_equal(on.y, off.y, "output");
  expect_equal(on.dx, off.dx, "input's gradient");
  const double ulp = dtype == torch::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  for (const auto& item : off.grads) {
    const auto& a = on.grads[item.key()];
    const auto& b = item.value();
    if (!lamp_weight(item.key())) {
      expect_equal(a, b, item.key());
      continue;
    }
    EXPECT_EQ(a.scalar_type(), torch::kFloat) << item.key();
    // Rounding to 16 bits moves a value by at most half a unit in its last
    // place (ulp relative to it); the two GEMMs may also add their 16 rows'
    // products in other orders (fp32: far below 1e-4 of the largest).
    const double atol = 1e-4 * b.abs().max().item<double>();
    EXPECT_TRUE(
        torch::le((a - b).abs(), a.abs() * ulp + atol).all().item<bool>())
        << item.key() << ": largest difference "
        << (a - b).abs().max().item<double>();
  }
}

} // namespace

// On the CPU lamp's layers are ATen's ops: the option changes nothing.
TEST(Fp32WeightGrads, ChangeNothingOnTheCpu) {
  auto net = seeded(torch::kCPU);
  const auto x = torch::randn({2, 8, 16});
  const auto on = run(net, x, torch::kBFloat16, true);
  const auto off = run(net, x, torch::kBFloat16, false);
  expect_equal(on.y, off.y, "output");
  expect_equal(on.dx, off.dx, "input's gradient");
  for (const auto& item : off.grads) {
    expect_equal(on.grads[item.key()], item.value(), item.key());
  }
}

class Fp32WeightGradsGpu : public lamp::test::GpuTest {};

// One layer, bf16 and fp16, with a bias and without: the weight's gradient
// is ATen's fp32-output GEMM of the 16-bit gradient and input, bit for bit;
// a weight the same forward also reads outside the layer gets that
// gradient's cast added; after the guard, the layer is as before.
TEST_F(Fp32WeightGradsGpu, AreTheFp32ProductOfTheOperands) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const bool bias : {true, false}) {
      for (const bool read_elsewhere : {false, true}) {
        torch::manual_seed(0);
        lamp::nn::Linear lin(torch::nn::LinearOptions(32, 24).bias(bias));
        lin->to(torch::kCUDA);
        const auto x = torch::randn({3, 8, 32}, torch::kCUDA);
        const auto g = torch::randn({3, 8, 24}, torch::kCUDA);
        const auto r = torch::randn({24, 32}, torch::kCUDA);
        {
          lamp::AutocastGuard autocast(torch::kCUDA, dtype);
          lamp::CastWeightsGuard cast(
              *lin,
              torch::kCUDA,
              lamp::CastWeightsOptions().fp32_weight_grads(true));
          auto loss = (lin(x).to(torch::kFloat) * g).sum();
          if (read_elsewhere) {
            loss = loss + (lin->weight.to(torch::kFloat) * r).sum();
          }
          loss.backward();
        }
        const auto g16 = g.to(dtype).view({-1, 24});
        auto expected =
            at::mm(g16.t(), x.to(dtype).view({-1, 32}), torch::kFloat);
        if (read_elsewhere) {
          expected = expected + r.to(dtype).to(torch::kFloat);
        }
        expect_equal(lin->weight.grad(), expected, "weight's gradient");
        if (bias) {
          EXPECT_EQ(lin->bias.grad().scalar_type(), torch::kFloat);
        }
        // The guard has ended: autocast's rounded gradient again, as a
        // layer's that never saw the option.
        torch::manual_seed(0);
        lamp::nn::Linear fresh(torch::nn::LinearOptions(32, 24).bias(bias));
        fresh->to(torch::kCUDA);
        for (auto* layer : {&lin, &fresh}) {
          (*layer)->zero_grad();
          lamp::AutocastGuard autocast(torch::kCUDA, dtype);
          ((*layer)(x).to(torch::kFloat) * g).sum().backward();
        }
        expect_equal(
            lin->weight.grad(), fresh->weight.grad(), "after the guard");
      }
    }
  }
}

// A block's layers (gelu_mlp, a layer without its bias, a LibTorch Linear):
// only lamp's layers' weight gradients change, each within a rounding.
TEST_F(Fp32WeightGradsGpu, ChangeOnlyLampLayersWeightGradients) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    auto net = seeded(torch::kCUDA);
    const auto x = torch::randn({2, 8, 16}, torch::kCUDA);
    expect_only_weight_grads_differ(
        run(net, x, dtype, true), run(net, x, dtype, false), dtype);
  }
}

// In a lamp::checkpoint whose recompute makes its own guard: the gradients
// of the same block without the checkpoint, bit for bit.
TEST_F(Fp32WeightGradsGpu, WorkInACheckpointsRecompute) {
  auto net = seeded(torch::kCUDA);
  const auto x = torch::randn({2, 8, 16}, torch::kCUDA);
  const auto plain = run(net, x, torch::kBFloat16, true);
  const auto checkpointed = run(net, x, torch::kBFloat16, true, true);
  expect_equal(checkpointed.dx, plain.dx, "input's gradient");
  for (const auto& item : plain.grads) {
    expect_equal(checkpointed.grads[item.key()], item.value(), item.key());
  }
}

// A gradient differentiated again (create_graph): the second derivatives
// reach the fp32 parameters, close to those without the option.
TEST_F(Fp32WeightGradsGpu, DoubleBackwardWorks) {
  std::vector<std::vector<torch::Tensor>> grads;
  for (const bool fp32 : {true, false}) {
    auto net = seeded(torch::kCUDA);
    const auto x = torch::randn({2, 8, 16}, torch::kCUDA);
    torch::Tensor penalty;
    {
      lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      lamp::CastWeightsGuard cast(
          *net,
          torch::kCUDA,
          lamp::CastWeightsOptions().fp32_weight_grads(fp32));
      const auto y = net->forward(x).to(torch::kFloat).pow(2).sum();
      const auto first = torch::autograd::grad(
          {y}, net->parameters(), {}, true, /*create_graph=*/true);
      penalty = torch::zeros({}, torch::kCUDA);
      for (const auto& f : first) {
        penalty = penalty + f.pow(2).sum();
      }
    }
    penalty.backward();
    grads.emplace_back();
    for (const auto& p : net->parameters()) {
      ASSERT_TRUE(p.grad().defined());
      grads.back().push_back(p.grad().clone());
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    // Second derivatives of a bf16 block whose first ones differ by a
    // rounding: close, not equal.
    const auto& a = grads[0][i];
    const auto& b = grads[1][i];
    EXPECT_LE(
        (a - b).abs().max().item<double>(),
        5e-2 * b.abs().max().item<double>() + 1e-6)
        << "parameter " << i;
  }
}

// Steps of FusedAdamW with kept weight casts inside a GraphedStep: the
// replays equal eager steps with the option.
TEST_F(Fp32WeightGradsGpu, ReplaysEqualEagerSteps) {
  struct Trainer {
    Trainer() {
      optimizer = std::make_unique<lamp::optim::FusedAdamW>(
          net->parameters(), torch::optim::AdamWOptions(1e-3));
      optimizer->keep_weight_casts(torch::kBFloat16);
    }
    torch::Tensor step(const torch::Tensor& x) {
      optimizer->zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        lamp::CastWeightsGuard cast(
            *net,
            torch::kCUDA,
            lamp::CastWeightsOptions().fp32_weight_grads(true));
        loss = net->forward(x).to(torch::kFloat).pow(2).mean();
      }
      loss.backward();
      optimizer->step();
      return loss.detach();
    }
    Net net = seeded(torch::kCUDA);
    std::unique_ptr<lamp::optim::FusedAdamW> optimizer;
  };
  torch::manual_seed(3);
  std::vector<torch::Tensor> data;
  for (int i = 0; i < 6; ++i) {
    data.push_back(torch::randn({2, 8, 16}, torch::kCUDA));
  }
  Trainer eager;
  Trainer graphed;
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return graphed.step(in[0]); },
      {data[0]},
      {graphed.optimizer.get()});
  for (const auto& x : data) {
    const auto a = eager.step(x);
    const auto b = step({x}).clone();
    // NOTE: the tolerance of the other GraphedStep tests (the warm-up runs
    // on a side stream, the replays in the graph's own memory).
    EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6));
  }
  EXPECT_TRUE(step.is_captured());
  const auto p = eager.net->parameters();
  const auto q = graphed.net->parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(torch::allclose(p[i], q[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

} // namespace fp32_weight_grads_test
