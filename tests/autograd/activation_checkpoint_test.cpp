// lamp::checkpoint against the same computation without it: a checkpointed
// block gives the plain block's loss and gradients bitwise, with dropout
// (its random numbers replayed), under autocast, with several and undefined
// inputs; its intermediate tensors are freed after the forward call; misuse
// is a clear error. On a GPU: eagerly, and inside GraphedStep with dropout,
// the steps of a model checkpointed in the graph against eager plain steps.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/cuda_graph.h>
#include <lamp/nn/qkv_attention.h>
#include <lamp/optim.h>

#include <c10/util/intrusive_ptr.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace activation_checkpoint_test {

namespace {

// A transformer's MLP with dropout and its residual.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc = register_module("fc", torch::nn::Linear(32, 64));
    proj = register_module("proj", torch::nn::Linear(64, 32));
    drop = register_module("drop", torch::nn::Dropout(0.4));
  }
  torch::Tensor forward(const torch::Tensor& h) {
    return h + drop(proj(torch::gelu(fc(h), "tanh")));
  }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

// Two blocks behind an input projection, so that the blocks' input requires
// grad as a hidden state does.
// NOTE: two blocks, not one block twice: autocast casts a weight used twice
// once, and the plain run then sums its two bf16 gradients before the cast
// back to fp32, the recomputes after it (a rounding apart, as in Python).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(16, 32));
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), Block()));
    }
  }
  torch::Tensor forward(
      const torch::Tensor& x,
      bool checkpointed,
      lamp::CheckpointOptions options = {}) {
    auto h = in(x);
    for (auto& b : blocks) {
      h = checkpointed
          ? lamp::checkpoint(
                [b](const torch::Tensor& y) mutable { return b->forward(y); },
                h,
                options)
          : b->forward(h);
    }
    return h;
  }
  torch::nn::Linear in{nullptr};
  std::vector<Block> blocks;
};
TORCH_MODULE(Net);

struct Result {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
  torch::Tensor next_random; // the CPU generator after the step
};

Result run(
    bool checkpointed,
    torch::Device device,
    bool autocast = false,
    uint64_t seed = 7) {
  torch::manual_seed(3);
  Net net;
  net->to(device);
  const auto x = torch::randn({5, 16}).to(device);
  torch::manual_seed(seed);
  torch::Tensor loss;
  {
    lamp::AutocastGuard guard(device.type(), torch::kBFloat16, autocast);
    loss = net->forward(x, checkpointed).to(torch::kFloat).pow(2).mean();
  }
  loss.backward();
  Result r{loss.detach(), {}, torch::rand({4})};
  for (const auto& p : net->parameters()) {
    r.grads.push_back(p.grad().clone());
  }
  return r;
}

void expect_bitwise_equal(const Result& a, const Result& b) {
  EXPECT_EQ(lamp::test::hex_bits(a.loss), lamp::test::hex_bits(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i])) << "gradient " << i;
  }
  EXPECT_TRUE(torch::equal(a.next_random, b.next_random));
}

TEST(ActivationCheckpoint, EqualsThePlainBlockWithDropout) {
  expect_bitwise_equal(run(true, torch::kCPU), run(false, torch::kCPU));
}

TEST(ActivationCheckpoint, EqualsThePlainBlockUnderAutocast) {
  expect_bitwise_equal(
      run(true, torch::kCPU, /*autocast=*/true),
      run(false, torch::kCPU, /*autocast=*/true));
}

// The test above is sensitive to the replay: without it the recompute's
// dropout masks are other masks.
TEST(ActivationCheckpoint, WithoutTheReplayDropoutDiffers) {
  auto grad_of = [](bool checkpointed, lamp::CheckpointOptions options) {
    torch::manual_seed(3);
    Net net;
    const auto x = torch::randn({5, 16});
    torch::manual_seed(7);
    net->forward(x, checkpointed, options).pow(2).mean().backward();
    return net->blocks[0]->fc->weight.grad().clone();
  };
  EXPECT_FALSE(torch::equal(
      grad_of(true, lamp::CheckpointOptions().preserve_rng_state(false)),
      grad_of(false, {})));
}

// Two inputs, one of them undefined, and two outputs: the shape of a GPT
// block that hands its MLP output on unadded.
TEST(ActivationCheckpoint, SeveralAndUndefinedInputsAndOutputs) {
  auto run2 = [](bool checkpointed) {
    torch::manual_seed(5);
    auto w = torch::randn({8, 8}, torch::requires_grad());
    auto h = torch::randn({3, 8}, torch::requires_grad());
    auto block = [w](const std::vector<torch::Tensor>& in) {
      auto x = in[1].defined() ? in[0] + in[1] : in[0];
      auto y = torch::tanh(torch::matmul(x, w));
      return std::vector<torch::Tensor>{x, y};
    };
    std::vector<torch::Tensor> state{h, torch::Tensor()};
    for (int i = 0; i < 3; ++i) {
      state = checkpointed ? lamp::checkpoint(block, state) : block(state);
    }
    (state[0].sum() + state[1].pow(2).sum()).backward();
    return std::vector<torch::Tensor>{w.grad(), h.grad()};
  };
  const auto a = run2(true), b = run2(false);
  EXPECT_TRUE(torch::equal(a[0], b[0]));
  EXPECT_TRUE(torch::equal(a[1], b[1]));
}

// What checkpointing is for: the block's intermediate tensors are gone after
// the forward call (the plain block keeps them for its backward pass).
TEST(ActivationCheckpoint, FreesTheIntermediateTensors) {
  for (const bool checkpointed : {false, true}) {
    auto w = torch::randn({8, 8}, torch::requires_grad());
    auto x = torch::randn({4, 8}, torch::requires_grad());
    c10::weak_intrusive_ptr<c10::TensorImpl> hidden(
        c10::intrusive_ptr<c10::TensorImpl>{});
    auto block = [&](const torch::Tensor& in) {
      auto h = torch::matmul(in, w);
      hidden = c10::weak_intrusive_ptr<c10::TensorImpl>(h.getIntrusivePtr());
      return torch::sin(h); // sin's backward reads its input
    };
    auto y = checkpointed ? lamp::checkpoint(block, x) : block(x);
    EXPECT_EQ(hidden.expired(), checkpointed);
    y.sum().backward();
    EXPECT_TRUE(w.grad().defined());
  }
}

TEST(ActivationCheckpoint, WithoutGradModeJustRuns) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3});
  auto y = lamp::checkpoint([](const torch::Tensor& t) { return t * 2; }, x);
  EXPECT_TRUE(torch::equal(y, x * 2));
  EXPECT_FALSE(y.requires_grad());
}

// is_recomputing(): false in the forward call and outside, true in the
// recompute only, and false again after it, also when fn throws there.
TEST(ActivationCheckpoint, IsRecomputingOnlyInTheRecompute) {
  std::vector<bool> seen;
  bool throw_in_recompute = false;
  auto fn = [&](const torch::Tensor& t) {
    seen.push_back(lamp::is_recomputing());
    if (throw_in_recompute && lamp::is_recomputing()) {
      TORCH_CHECK(false, "recompute failed");
    }
    return t * t;
  };
  auto x = torch::randn({3}, torch::requires_grad());
  EXPECT_FALSE(lamp::is_recomputing());
  auto y = lamp::checkpoint(fn, x);
  EXPECT_FALSE(lamp::is_recomputing());
  y.sum().backward();
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  EXPECT_FALSE(lamp::is_recomputing());
  throw_in_recompute = true;
  y = lamp::checkpoint(fn, x);
  lamp::test::expect_error([&] { y.sum().backward(); }, "recompute failed");
  EXPECT_FALSE(lamp::is_recomputing());
}

// keep_attention keeps only what qkv_attention's cuDNN path computes: on
// the CPU (ATen's attention) it changes nothing, nor does a second
// backward pass through the same graph.
TEST(ActivationCheckpoint, KeepAttentionOnTheCpuChangesNothing) {
  torch::manual_seed(5);
  const auto x0 = torch::randn({2, 8, 24});
  auto run = [&](bool keep) {
    torch::manual_seed(6);
    const auto w = torch::randn({8, 8}, torch::requires_grad());
    const auto x = x0.clone().requires_grad_();
    const auto y = lamp::checkpoint(
        [&](const torch::Tensor& in) {
          return lamp::nn::qkv_attention(in, 2).matmul(w);
        },
        x,
        lamp::CheckpointOptions().keep_attention(keep));
    y.sum().backward({}, /*retain_graph=*/true);
    y.sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const auto plain = run(false);
  const auto kept = run(true);
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_TRUE(torch::equal(kept[i], plain[i])) << i;
  }
}

TEST(ActivationCheckpoint, NoInputRequiringGradIsAValueError) {
  auto w = torch::randn({3}, torch::requires_grad());
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::checkpoint(
            [&](const torch::Tensor& t) { return t * w; }, torch::randn({3}));
      },
      "none of the 1 inputs requires grad");
}

TEST(ActivationCheckpoint, AutogradGradIsAClearError) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = lamp::checkpoint([](const torch::Tensor& t) { return t * t; }, x);
  lamp::test::expect_error(
      [&] { torch::autograd::grad({y.sum()}, {x}); },
      "call backward() without `inputs`");
}

TEST(ActivationCheckpoint, UndefinedOutputIsAValueError) {
  auto x = torch::randn({3}, torch::requires_grad());
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::checkpoint(
            [](const std::vector<torch::Tensor>&) {
              return std::vector<torch::Tensor>{torch::Tensor()};
            },
            {x});
      },
      "fn returned an undefined tensor");
}

TEST(ActivationCheckpointGpu, EqualsThePlainBlockEagerly) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  expect_bitwise_equal(run(true, cuda, true), run(false, cuda, true));
}

// A model checkpointed inside GraphedStep (bf16, dropout, FusedAdamW), its
// steps against the same model's eager steps without checkpointing, from the
// same seed: the replayed graph drops what the eager steps drop, so the
// weights stay together; and the check is sensitive (a graph that does not
// replay the forward call's numbers drifts away).
TEST(ActivationCheckpointGpu, ReplaysDropoutInsideGraphedStep) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(11);
  const auto x = torch::randn({64, 16}).to(cuda);
  auto train = [&](bool graphed, bool preserve) {
    torch::manual_seed(3);
    Net net;
    net->to(cuda);
    lamp::optim::FusedAdamW opt(
        net->parameters(), torch::optim::AdamWOptions(1e-2));
    auto step = [&](const std::vector<torch::Tensor>& batch) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard guard(torch::kCUDA, torch::kBFloat16);
        auto h = net->forward(
            batch[0],
            graphed,
            lamp::CheckpointOptions().preserve_rng_state(preserve));
        loss = h.to(torch::kFloat).pow(2).mean();
      }
      loss.backward();
      opt.step();
      return loss;
    };
    torch::cuda::manual_seed_all(19);
    if (graphed) {
      lamp::GraphedStep graph(step, {x}, {&opt});
      for (int i = 0; i < 8; ++i) {
        graph({x});
      }
      EXPECT_TRUE(graph.is_captured());
    } else {
      for (int i = 0; i < 8; ++i) {
        step({x});
      }
    }
    torch::cuda::synchronize();
    return net->blocks[0]->fc->weight.detach().clone();
  };
  const auto eager = train(false, true);
  const auto replayed = train(true, true);
  const auto not_replayed = train(true, false);
  const double scale = eager.abs().max().item<double>();
  EXPECT_LT((replayed - eager).abs().max().item<double>(), 1e-5 * scale);
  EXPECT_GT((not_replayed - eager).abs().max().item<double>(), 1e-3 * scale);
}

} // namespace

} // namespace activation_checkpoint_test
