// lamp::CastWeightsGuard: the same forward and gradients as autocast's own
// casts, bit for bit (CPU bf16 here, CUDA fp16 and bf16 in *Gpu), and the
// modules' members always restored.
#include <lamp/autocast.h>
#include <lamp/cast_weights.h>
#include <lamp/cuda_graph.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <vector>

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace cast_weights_test {

namespace {

// Every module kind the guard casts, a bias-free convolution, a parameter
// the forward never uses and one that is frozen.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    frozen->weight.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(conv(x));
    h = torch::relu(conv_nobias(h));
    h = deconv(h).mean({-1});
    h = torch::relu(conv1d(h)).flatten(1);
    h = torch::relu(linear(h));
    return head(h) + frozen(h).sum(1, /*keepdim=*/true);
  }
  torch::nn::Conv2d conv{register_module("conv", torch::nn::Conv2d(3, 8, 3))};
  torch::nn::Conv2d conv_nobias{register_module(
      "conv_nobias",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).bias(false)))};
  torch::nn::ConvTranspose2d deconv{
      register_module("deconv", torch::nn::ConvTranspose2d(8, 4, 2))};
  torch::nn::Conv1d conv1d{
      register_module("conv1d", torch::nn::Conv1d(4, 4, 3))};
  torch::nn::Linear linear{
      register_module("linear", torch::nn::Linear(16, 16))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(16, 16))};
  torch::nn::Linear frozen{register_module("frozen", torch::nn::Linear(16, 2))};
  torch::nn::Linear unused{
      register_module("unused", torch::nn::Linear(16, 16))};
};
TORCH_MODULE(Net);

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};

// A forward under autocast (with or without the guard) and a backward.
Result run(
    Net& net,
    const torch::Tensor& x,
    c10::DeviceType device,
    c10::ScalarType dtype,
    bool guard) {
  net->zero_grad();
  torch::Tensor out;
  {
    lamp::AutocastGuard autocast(device, dtype);
    std::optional<lamp::CastWeightsGuard> cast;
    if (guard) {
      cast.emplace(*net, device);
      // Two a module but conv_nobias's one: 15, unused's included (cast,
      // then never read).
      EXPECT_EQ(cast->size(), 15u);
    }
    out = net->forward(x);
  }
  out.to(torch::kFloat).pow(2).sum().backward();
  Result r{out.detach(), {}};
  for (const auto& p : net->parameters()) {
    r.grads.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  }
  return r;
}

void expect_same(const Result& a, const Result& b) {
  EXPECT_EQ(a.out.scalar_type(), b.out.scalar_type());
  EXPECT_TRUE(torch::equal(a.out, b.out));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << "parameter " << i;
    if (a.grads[i].defined()) {
      EXPECT_EQ(a.grads[i].scalar_type(), torch::kFloat);
      EXPECT_EQ(a.grads[i].strides(), b.grads[i].strides())
          << "parameter " << i;
      EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]))
          << "parameter " << i << ": largest difference "
          << (a.grads[i] - b.grads[i]).abs().max().item<double>() << " of "
          << b.grads[i].abs().max().item<double>();
    }
  }
}

// The members forward reads are the registered parameters again.
void expect_members_restored(Net& net) {
  const auto params = net->named_parameters();
  EXPECT_TRUE(net->conv->weight.is_same(params["conv.weight"]));
  EXPECT_TRUE(net->conv->bias.is_same(params["conv.bias"]));
  EXPECT_TRUE(net->head->weight.is_same(params["head.weight"]));
  EXPECT_TRUE(net->head->bias.is_same(params["head.bias"]));
  EXPECT_TRUE(net->deconv->weight.is_same(params["deconv.weight"]));
  EXPECT_TRUE(net->frozen->weight.is_same(params["frozen.weight"]));
  EXPECT_FALSE(net->conv_nobias->bias.defined());
}

void check_equals_autocast(c10::DeviceType device, c10::ScalarType dtype) {
  torch::manual_seed(0);
  Net net;
  net->to(device);
  const auto x = torch::randn({2, 3, 9, 9}, torch::device(device));
  const auto plain = run(net, x, device, dtype, false);
  const auto cast = run(net, x, device, dtype, true);
  expect_same(cast, plain);
  expect_members_restored(net);
  // The unused Linear has no gradient, as without the guard; the frozen
  // weight none either.
  EXPECT_FALSE(net->unused->weight.grad().defined());
  EXPECT_FALSE(net->frozen->weight.grad().defined());
  EXPECT_TRUE(net->frozen->bias.grad().defined());
}

TEST(CastWeights, EqualsAutocastOnTheCpu) {
  check_equals_autocast(torch::kCPU, torch::kBFloat16);
}

// A tensor two modules read is cast once: its two uses' gradients add up
// in the low precision, then go to fp32 (autocast's cache does the same
// where it hits; in this test LibTorch's CPU autocast cast each use apart,
// summing in fp32: hence a tolerance of the dtype's rounding).
TEST(CastWeights, SharedWeightIsCastOnce) {
  torch::manual_seed(4);
  torch::nn::Linear a(8, 8);
  torch::nn::Linear b(8, 8);
  b->weight = a->weight; // b's own registered weight is never read
  torch::nn::Sequential net(a, b);
  const auto x = torch::randn({4, 8});
  std::vector<torch::Tensor> grads;
  for (bool guard : {false, true}) {
    net->zero_grad();
    torch::Tensor y;
    {
      lamp::AutocastGuard autocast(torch::kCPU);
      std::optional<lamp::CastWeightsGuard> cast;
      if (guard) {
        cast.emplace(*net, torch::kCPU);
        EXPECT_EQ(cast->size(), 3u); // the shared weight and two biases
        EXPECT_TRUE(b->weight.is_same(a->weight));
      }
      y = net->forward(x);
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    grads.push_back(a->weight.grad().clone());
  }
  EXPECT_TRUE(torch::allclose(grads[1], grads[0], 1e-2, 1e-2));
  EXPECT_TRUE(b->weight.is_same(a->weight));
}

// lamp::nn::Linear's members are cast too: the same bits and gradients as
// autocast's own casts.
TEST(CastWeights, CastsLampLinearsToo) {
  torch::manual_seed(5);
  torch::nn::Sequential net(lamp::nn::Linear(8, 6), lamp::nn::Linear(6, 3));
  const auto x = torch::randn({2, 4, 8});
  std::vector<torch::Tensor> outs, grads;
  for (bool guard : {false, true}) {
    net->zero_grad();
    torch::Tensor y;
    {
      lamp::AutocastGuard autocast(torch::kCPU);
      std::optional<lamp::CastWeightsGuard> cast;
      if (guard) {
        cast.emplace(*net, torch::kCPU);
        EXPECT_EQ(cast->size(), 4u);
      }
      y = net->forward(x);
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    outs.push_back(y.detach());
    grads.push_back(net[0]->as<lamp::nn::Linear>()->weight.grad().clone());
  }
  EXPECT_TRUE(torch::equal(outs[0], outs[1]));
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
}

TEST(CastWeights, DoesNothingWithoutAutocast) {
  Net net;
  const auto before = net->conv->weight;
  lamp::CastWeightsGuard cast(*net, torch::kCPU);
  EXPECT_EQ(cast.size(), 0u);
  EXPECT_TRUE(net->conv->weight.is_same(before));
}

TEST(CastWeights, LeavesOtherDevicesAlone) {
  Net net; // on the CPU
  lamp::AutocastGuard autocast(torch::kCPU);
  lamp::CastWeightsGuard cast(*net, torch::kCUDA);
  EXPECT_EQ(cast.size(), 0u);
}

TEST(CastWeights, RestoresTheMembersWhenForwardThrows) {
  Net net;
  try {
    lamp::AutocastGuard autocast(torch::kCPU);
    lamp::CastWeightsGuard cast(*net, torch::kCPU);
    EXPECT_EQ(net->conv->weight.scalar_type(), torch::kBFloat16);
    net->forward(torch::randn({2, 5, 9, 9})); // 5 channels, not 3
    FAIL() << "forward accepted a wrong channel count";
  } catch (const c10::Error&) {
  }
  expect_members_restored(net);
  EXPECT_EQ(net->conv->weight.scalar_type(), torch::kFloat);
}

TEST(CastWeights, DoubleBackwardWorks) {
  torch::manual_seed(1);
  torch::nn::Linear plain(4, 3);
  torch::nn::Linear cast(4, 3);
  cast->weight.set_data(plain->weight.detach().clone());
  cast->bias.set_data(plain->bias.detach().clone());
  const auto x = torch::randn({5, 4});
  std::vector<torch::Tensor> second;
  for (bool guard : {false, true}) {
    torch::nn::Linear& m = guard ? cast : plain;
    torch::Tensor y;
    {
      lamp::AutocastGuard autocast(torch::kCPU);
      std::optional<lamp::CastWeightsGuard> g;
      if (guard) {
        g.emplace(*m, torch::kCPU);
      }
      y = m->forward(x).to(torch::kFloat).pow(2).sum();
    }
    const auto g1 = torch::autograd::grad(
        {y}, {m->weight}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    second.push_back(torch::autograd::grad({g1.sum()}, {m->weight})[0]);
  }
  EXPECT_TRUE(torch::equal(second[0], second[1]));
}

// NOTE: deterministic cuDNN algorithms, so that two runs of the same
// convolutions can be compared bit for bit.
class CastWeightsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "needs a CUDA device";
    }
    deterministic_ = at::globalContext().deterministicCuDNN();
    at::globalContext().setDeterministicCuDNN(true);
  }
  void TearDown() override {
    at::globalContext().setDeterministicCuDNN(deterministic_);
  }
  bool deterministic_ = false;
};

TEST_F(CastWeightsGpu, EqualsAutocastBitForBit) {
  check_equals_autocast(torch::kCUDA, torch::kHalf);
  check_equals_autocast(torch::kCUDA, torch::kBFloat16);
}

// Inside a GraphedStep: the replays equal eager steps with the guard (and
// without it: the same bits).
// A gradient with gaps (a weight padded with a zero input channel, as a
// stem convolution's for cuDNN's 4-channel kernels, gets the first channels
// of the padded weight's gradient: a view) is cast like the others, to the
// same values.
TEST_F(CastWeightsGpu, AGradientWithGapsIsCastToo) {
  torch::manual_seed(0);
  auto stem = torch::nn::Conv2d(
      torch::nn::Conv2dOptions(3, 8, 7).stride(2).padding(3).bias(false));
  auto head = torch::nn::Conv2d(8, 4, 3);
  torch::nn::Sequential net(stem, head);
  net->to(torch::kCUDA);
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) {
      p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
  }
  const auto x = torch::randn({2, 4, 32, 32}, torch::kCUDA)
                     .contiguous(torch::MemoryFormat::ChannelsLast);
  auto run = [&](bool guard) {
    net->zero_grad();
    torch::Tensor out;
    {
      lamp::AutocastGuard autocast(torch::kCUDA);
      std::optional<lamp::CastWeightsGuard> cast;
      if (guard) {
        cast.emplace(*net);
      }
      const auto& w = stem->weight;
      const auto padded =
          torch::cat({w, torch::zeros({8, 1, 7, 7}, w.options())}, 1);
      out = head(torch::relu(torch::conv2d(x, padded, {}, 2, 3)));
    }
    out.to(torch::kFloat).pow(2).sum().backward();
    return std::vector<torch::Tensor>{
        out.detach(),
        stem->weight.grad().clone(),
        head->weight.grad().clone(),
        head->bias.grad().clone()};
  };
  const auto plain = run(false);
  const auto cast = run(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(cast[i], plain[i])) << "tensor #" << i;
  }
}

TEST_F(CastWeightsGpu, ReplaysEqualEagerSteps) {
  struct Trainer {
    // NOTE: the same initial weights in each trainer (members are built
    // before the constructor's body runs).
    static Net seeded() {
      torch::manual_seed(2);
      return Net();
    }
    Trainer() {
      net->to(torch::kCUDA);
      optimizer = std::make_unique<lamp::optim::FusedSGD>(
          net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    }
    torch::Tensor step(const torch::Tensor& x, bool guard) {
      optimizer->zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA);
        std::optional<lamp::CastWeightsGuard> cast;
        if (guard) {
          cast.emplace(*net);
        }
        loss = net->forward(x).to(torch::kFloat).pow(2).mean();
      }
      loss.backward();
      optimizer->step();
      return loss.detach();
    }
    Net net = seeded();
    std::unique_ptr<lamp::optim::FusedSGD> optimizer;
  };
  torch::manual_seed(3);
  std::vector<torch::Tensor> data;
  for (int i = 0; i < 8; ++i) {
    data.push_back(torch::randn({4, 3, 9, 9}, torch::kCUDA));
  }
  Trainer eager;
  Trainer eager_cast;
  Trainer graphed;
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        return graphed.step(in[0], true);
      },
      {data[0]},
      {graphed.optimizer.get()});
  for (const auto& x : data) {
    const auto a = eager.step(x, false);
    const auto b = eager_cast.step(x, true);
    const auto c = step({x}).clone();
    EXPECT_TRUE(torch::equal(a, b));
    // NOTE: the tolerance of the other GraphedStep tests (the warm-up runs
    // on a side stream, the replays in the graph's own memory).
    EXPECT_TRUE(torch::allclose(a, c, 1e-5, 1e-6));
  }
  EXPECT_TRUE(step.is_captured());
  const auto p = eager.net->parameters();
  const auto q = graphed.net->parameters();
  const auto r = eager_cast.net->parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(torch::equal(p[i], r[i])) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(p[i], q[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

} // namespace

} // namespace cast_weights_test
