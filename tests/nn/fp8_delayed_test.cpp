// Delayed FP8 scaling (lamp::Fp8Scaling::kDelayed): lamp::nn::Linear's amax
// histories and scales step by step against a reference written from
// Transformer Engine's DelayedScaling (max and most-recent, a margin, a
// short history that rolls over, zero and non-finite amaxes); casts that
// saturate with the delayed scale; checkpoints that resume bit for bit;
// recomputes (lamp::checkpoint) that do not update the scales again;
// lamp::update_fp8_scales's updates ahead of the calls; bad recipes. (A small
// model trains with them as in bf16: fp8_test.cpp.)

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/checkpoint.h>
#include <lamp/cuda_graph.h>
#include <lamp/fp8.h>
#include <lamp/nn/linear.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nn/fp8_linear.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp8_delayed_test {

namespace {

constexpr float kE4m3Max = 448.f;
constexpr float kE5m2Max = 57344.f;

lamp::Fp8Recipe delayed(int64_t len) {
  return lamp::Fp8Recipe()
      .scaling(lamp::Fp8Scaling::kDelayed)
      .amax_history_len(len);
}

// Transformer Engine's DelayedScaling for one tensor, in plain floats:
// history[0] the newest amax.
struct Reference {
  std::deque<float> history;
  float scale = 1.f;
  float fp8_max;

  Reference(int64_t len, float max) : history(len, 0.f), fp8_max(max) {}

  // _compute_amax_and_update_history, then _default_sf_compute.
  void update(const lamp::Fp8Recipe& recipe) {
    float amax = history.front();
    if (recipe.amax_compute() == lamp::Fp8AmaxCompute::kMax) {
      for (const float a : history) {
        amax = std::isnan(a) || std::isnan(amax) ? NAN : std::max(amax, a);
      }
    }
    // torch.roll(history, -1): the newest goes to the end; then [0] = 0.
    history.push_back(history.front());
    history.pop_front();
    history.front() = 0.f;
    if (amax > 0.f && std::isfinite(amax)) {
      scale =
          fp8_max / amax / std::ldexp(1.f, static_cast<int>(recipe.margin()));
    }
  }
};

void expect_state(
    const lamp::nn::Linear& fc,
    const std::array<Reference, 3>& ref,
    int step) {
  const auto history = fc->fp8_amax_history.contiguous();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(fc->fp8_scale[r].item<float>(), ref[r].scale)
        << "step " << step << ", row " << r;
    for (size_t i = 0; i < ref[r].history.size(); ++i) {
      const float got = history[r][static_cast<int64_t>(i)].item<float>();
      const float want = ref[r].history[i];
      EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
          << "step " << step << ", row " << r << ", column " << i << ": " << got
          << " vs " << want;
    }
  }
}

// Seven steps of one layer, the input's and the gradient's magnitudes
// moving (a zero input, a jump, an inf), the weight stepped by SGD:
// history and scale equal the reference's after every step, bit for bit.
void follow_reference(const lamp::Fp8Recipe& recipe) {
  torch::manual_seed(0);
  lamp::nn::Linear fc(32, 16);
  torch::optim::SGD sgd(fc->parameters(), torch::optim::SGDOptions(0.01));
  std::array<Reference, 3> ref{
      Reference(recipe.amax_history_len(), kE4m3Max),
      Reference(recipe.amax_history_len(), kE4m3Max),
      Reference(recipe.amax_history_len(), kE5m2Max)};
  const std::vector<double> x_scale = {1, 3, 0, 200, 0.5, 1, 2};
  const std::vector<double> g_scale = {1, 1e3, 1, 0.01, 1, 5, 1};
  for (int step = 0; step < 7; ++step) {
    auto x = torch::randn({16, 32}) * x_scale[step];
    if (step == 4) {
      x[2][5] = std::numeric_limits<float>::infinity();
    }
    const auto g = torch::randn({16, 16}) * g_scale[step];
    for (auto& r : ref) {
      r.update(recipe);
    }
    ref[0].history.front() = x.abs().max().item<float>();
    ref[1].history.front() = fc->weight.detach().abs().max().item<float>();
    ref[2].history.front() = g.abs().max().item<float>();
    sgd.zero_grad();
    torch::Tensor y;
    {
      lamp::Fp8AutocastGuard fp8(recipe);
      y = fc(x);
    }
    y.backward(g);
    expect_state(fc, ref, step);
    if (step != 4) { // the inf step's gradients are NaN
      sgd.step();
    }
  }
}

TEST(Fp8Delayed, MaxOfAShortHistoryFollowsTransformerEngine) {
  follow_reference(delayed(3));
}

TEST(Fp8Delayed, MostRecentWithAMarginFollowsTransformerEngine) {
  follow_reference(
      delayed(5).amax_compute(lamp::Fp8AmaxCompute::kMostRecent).margin(2));
}

// A cast uses the scale of earlier steps: an input 100 times larger than
// before saturates at e4m3's maximum (finite), and the output is the GEMM
// of those saturated operands; an inf stays non-finite.
TEST(Fp8Delayed, CastsSaturateWithTheDelayedScale) {
  torch::manual_seed(1);
  lamp::nn::Linear fc(32, 16);
  const auto recipe = delayed(4);
  const auto small = torch::randn({16, 32});
  {
    lamp::Fp8AutocastGuard fp8(recipe);
    fc(small);
    fc(small); // the scales now follow `small`
  }
  const auto big = small * 100;
  const float sx = fc->fp8_scale[0].item<float>();
  torch::Tensor y;
  {
    lamp::Fp8AutocastGuard fp8(recipe);
    y = fc(big);
  }
  // The update at this call saw the same amaxes again: same scales.
  EXPECT_EQ(fc->fp8_scale[0].item<float>(), sx);
  const float sw = fc->fp8_scale[1].item<float>();
  auto dequantised = [](const torch::Tensor& t, float s) {
    return (t * s)
               .clamp(-kE4m3Max, kE4m3Max)
               .to(torch::kFloat8_e4m3fn)
               .to(torch::kFloat) /
        s;
  };
  const auto xq = dequantised(big, sx);
  EXPECT_EQ(xq.abs().max().item<float>(), kE4m3Max / sx); // saturated
  const auto want =
      xq.matmul(dequantised(fc->weight.detach(), sw).t()) + fc->bias.detach();
  EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-5));
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  auto x_inf = small.clone();
  x_inf[0][0] = std::numeric_limits<float>::infinity();
  lamp::Fp8AutocastGuard fp8(recipe);
  EXPECT_FALSE(torch::isfinite(fc(x_inf)).all().item<bool>());
}

// A cast folds its amax into the history's newest slot (the larger of the
// two, NaN winning), as Transformer Engine's casts do: the update zeroes
// that slot, so each cast after it records its own amax; a slot that
// already holds a larger amax keeps it.
TEST(Fp8Delayed, ACastFoldsItsAmaxIntoTheNewestSlot) {
  torch::manual_seed(3);
  const auto x = torch::randn({16, 32}) * 3;
  const auto scale = torch::full({}, 2.0f);
  const float amax = x.abs().max().item<float>();
  for (const float held : {0.0f, amax / 2, amax * 4}) {
    auto slot = torch::full({}, held);
    lamp::nn::detail::quantize_delayed(x, torch::kFloat8_e4m3fn, scale, slot);
    EXPECT_EQ(slot.item<float>(), std::max(held, amax)) << held;
  }
  auto slot = torch::full({}, 1e30f);
  auto x_nan = x.clone();
  x_nan[1][2] = std::numeric_limits<float>::quiet_NaN();
  lamp::nn::detail::quantize_delayed(x_nan, torch::kFloat8_e5m2, scale, slot);
  EXPECT_TRUE(std::isnan(slot.item<float>()));
}

struct Net : torch::nn::Module {
  explicit Net(bool recompute = false) : recompute(recompute) {
    fc1 = register_module("fc1", lamp::nn::Linear(32, 64));
    fc2 = register_module("fc2", lamp::nn::Linear(64, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto block = [this](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{torch::relu(fc1(in[0]))};
    };
    const auto h = recompute ? lamp::checkpoint(block, {x})[0] : block({x})[0];
    return fc2(h);
  }
  bool recompute;
  lamp::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Steps [from, to) of a run: bf16 autocast, delayed FP8, Adam; each step
// first calls lamp::update_fp8_scales `updates_ahead` times.
std::vector<double> train(
    Net& net,
    torch::optim::Optimizer& opt,
    int from,
    int to,
    const lamp::Fp8Recipe& recipe,
    int updates_ahead = 0) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    torch::manual_seed(100 + step);
    const auto x = torch::randn({16, 32}).requires_grad_();
    const auto y = torch::randn({16, 16});
    opt.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      lamp::Fp8AutocastGuard fp8(recipe);
      for (int i = 0; i < updates_ahead; ++i) {
        lamp::update_fp8_scales(net);
      }
      loss = (net.forward(x).to(torch::kFloat) - y).pow(2).mean();
    }
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// The histories and scales are buffers: a checkpoint carries them, and a
// run resumed from it (after lamp::init_fp8_state) is the uninterrupted run.
TEST(Fp8Delayed, ACheckpointResumesBitForBit) {
  const auto recipe = delayed(8);
  const auto path = lamp::test::fresh_dir("fp8_delayed") + "/ckpt.pt";
  torch::manual_seed(2);
  auto whole = std::make_shared<Net>();
  torch::optim::Adam opt(whole->parameters(), torch::optim::AdamOptions(1e-3));
  auto losses = train(*whole, opt, 0, 3, recipe);
  {
    lamp::TrainingState state;
    state.add("model", *whole).add("optimizer", opt);
    lamp::save_checkpoint(state, path, 3);
  }
  const auto rest = train(*whole, opt, 3, 6, recipe);

  torch::manual_seed(3); // other initial weights: the checkpoint's count
  auto resumed = std::make_shared<Net>();
  torch::optim::Adam opt2(
      resumed->parameters(), torch::optim::AdamOptions(1e-3));
  {
    lamp::TrainingState state;
    state.add("model", *resumed).add("optimizer", opt2);
    // Without the buffers the load is refused, and says what to do.
    lamp::test::expect_error(
        [&] { lamp::load_checkpoint(state, path); },
        "call lamp::init_fp8_state(model, recipe) before loading");
  }
  lamp::init_fp8_state(*resumed, recipe);
  {
    lamp::TrainingState state;
    state.add("model", *resumed).add("optimizer", opt2);
    EXPECT_EQ(lamp::load_checkpoint(state, path), 3);
  }
  EXPECT_EQ(train(*resumed, opt2, 3, 6, recipe), rest);
  EXPECT_TRUE(torch::equal(
      resumed->fc1->fp8_amax_history, whole->fc1->fp8_amax_history));
  EXPECT_TRUE(torch::equal(resumed->fc2->fp8_scale, whole->fc2->fp8_scale));
}

// A checkpointed block's recompute runs in FP8 with the forward call's
// scales and does not update them again: the run equals the plain one.
TEST(Fp8Delayed, ARecomputeKeepsTheForwardCallsScales) {
  const auto recipe = delayed(4);
  auto run = [&](bool recompute) {
    torch::manual_seed(4);
    Net net(recompute);
    torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(1e-3));
    const auto losses = train(net, opt, 0, 4, recipe);
    return std::make_tuple(
        losses,
        net.fc1->fp8_amax_history.clone(),
        net.fc1->fp8_scale.clone(),
        net.fc1->weight.detach().clone());
  };
  const auto [plain_losses, plain_history, plain_scale, plain_w] = run(false);
  const auto [losses, history, scale, w] = run(true);
  EXPECT_EQ(losses, plain_losses);
  EXPECT_TRUE(torch::equal(history, plain_history));
  EXPECT_TRUE(torch::equal(scale, plain_scale));
  EXPECT_TRUE(torch::equal(w, plain_w));
}

// lamp::update_fp8_scales at the top of each step updates every layer as
// its forward call would have: the run is the same bit for bit, also when
// it is called twice (the second call skips the fresh states) and with a
// checkpointed block (whose recompute updates nothing).
TEST(Fp8Delayed, ScalesUpdatedAheadEqualEachCallsUpdate) {
  for (const bool recompute : {false, true}) {
    auto run = [&](int updates_ahead) {
      torch::manual_seed(6);
      Net net(recompute);
      torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(1e-3));
      const auto losses = train(net, opt, 0, 5, delayed(3), updates_ahead);
      return std::make_tuple(
          losses,
          torch::cat({net.fc1->fp8_amax_history, net.fc2->fp8_amax_history}),
          torch::cat({net.fc1->fp8_scale, net.fc2->fp8_scale}),
          net.fc2->weight.detach().clone());
    };
    const auto [plain_losses, plain_history, plain_scale, plain_w] = run(0);
    for (const int ahead : {1, 2}) {
      const auto [losses, history, scale, w] = run(ahead);
      EXPECT_EQ(losses, plain_losses) << ahead << " " << recompute;
      EXPECT_TRUE(torch::equal(history, plain_history)) << ahead;
      EXPECT_TRUE(torch::equal(scale, plain_scale)) << ahead;
      EXPECT_TRUE(torch::equal(w, plain_w)) << ahead;
    }
  }
}

// A layer registered under two names and called twice a forward (a tied
// module) is one layer: updated once ahead, its first call takes that
// update and its second updates as without the call ahead.
TEST(Fp8Delayed, ATiedLayerCalledTwiceIsUpdatedOnceAhead) {
  struct Tied : torch::nn::Module {
    Tied() {
      fc = register_module("fc", lamp::nn::Linear(16, 16));
      register_module("again", fc);
    }
    lamp::nn::Linear fc{nullptr};
  };
  const auto recipe = delayed(4);
  auto run = [&](bool ahead) {
    torch::manual_seed(11);
    Tied net;
    lamp::init_fp8_state(net, recipe);
    for (int step = 0; step < 4; ++step) {
      const auto x = torch::randn({16, 16});
      lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      lamp::Fp8AutocastGuard fp8(recipe);
      if (ahead) {
        lamp::update_fp8_scales(net);
      }
      net.fc(net.fc(x)).to(torch::kFloat).square().sum().backward();
    }
    return std::make_pair(
        net.fc->fp8_amax_history.clone(), net.fc->fp8_scale.clone());
  };
  const auto [plain_history, plain_scale] = run(false);
  const auto [history, scale] = run(true);
  EXPECT_TRUE(torch::equal(history, plain_history));
  EXPECT_TRUE(torch::equal(scale, plain_scale));
}

// A state changed between lamp::update_fp8_scales and the forward (a
// checkpoint loaded into it) is updated at the layer's call, as without
// the call ahead; outside a delayed scope the call does nothing.
TEST(Fp8Delayed, AStateChangedAfterTheUpdateIsUpdatedAtItsCall) {
  const auto recipe = delayed(4);
  auto run = [&](bool ahead) {
    torch::manual_seed(7);
    Net net;
    torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(1e-3));
    train(net, opt, 0, 2, recipe);
    const auto saved = net.fc1->fp8_amax_history.clone();
    train(net, opt, 2, 3, recipe);
    {
      lamp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      lamp::Fp8AutocastGuard fp8(recipe);
      if (ahead) {
        lamp::update_fp8_scales(net);
      }
      torch::NoGradGuard no_grad;
      net.fc1->fp8_amax_history.copy_(saved); // as a load would
      net.forward(torch::randn({16, 32}));
    }
    return std::make_pair(
        net.fc1->fp8_amax_history.clone(), net.fc1->fp8_scale.clone());
  };
  const auto [plain_history, plain_scale] = run(false);
  const auto [history, scale] = run(true);
  EXPECT_TRUE(torch::equal(history, plain_history));
  EXPECT_TRUE(torch::equal(scale, plain_scale));

  Net net;
  lamp::init_fp8_state(net, recipe);
  net.fc1->fp8_amax_history.fill_(2.0f);
  lamp::update_fp8_scales(net); // no scope
  {
    lamp::Fp8AutocastGuard fp8; // current scaling
    lamp::update_fp8_scales(net);
  }
  EXPECT_TRUE(torch::all(net.fc1->fp8_amax_history == 2.0f).item<bool>());
  EXPECT_TRUE(torch::all(net.fc1->fp8_scale == 1.0f).item<bool>());
}

// On a GPU lamp::update_fp8_scales updates the layers in launches of up to
// 128 (kFp8UpdatesPerLaunch): 130 layers, six steps, eager and graphed,
// give every history and scale of the per-call updates bit for bit.
TEST(Fp8DelayedGpu, ScalesUpdatedAheadInOneLaunchEqualEachCallsUpdate) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto recipe = delayed(5).margin(1);
  torch::manual_seed(8);
  const auto x = torch::randn({32, 16}, cuda);
  auto run = [&](bool ahead, bool graphed) {
    torch::manual_seed(9);
    torch::nn::Sequential net;
    for (int i = 0; i < 130; ++i) {
      net->push_back(lamp::nn::Linear(16, 16));
    }
    net->to(cuda);
    lamp::init_fp8_state(*net, recipe);
    lamp::optim::FusedAdamW opt(
        net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto step = [&](const std::vector<torch::Tensor>& in) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
        lamp::Fp8AutocastGuard fp8(recipe);
        if (ahead) {
          lamp::update_fp8_scales(*net);
        }
        loss = net->forward(in[0]).to(torch::kFloat).pow(2).mean();
      }
      loss.backward();
      opt.step();
      return loss.detach();
    };
    lamp::test::run_steps(graphed, step, {x}, opt);
    std::vector<torch::Tensor> state;
    for (const auto& b : net->buffers()) {
      state.push_back(b.flatten());
    }
    return torch::cat(state);
  };
  const auto plain = run(false, false);
  EXPECT_TRUE(torch::equal(run(true, false), plain));
  EXPECT_TRUE(torch::equal(run(true, true), run(false, true)));
}

TEST(Fp8Delayed, BadRecipesAndLengthsAreClearErrors) {
  lamp::test::expect_error_of<c10::ValueError>(
      [] { lamp::Fp8AutocastGuard g(delayed(0)); },
      "amax_history_len must be at least 1, got 0");
  lamp::test::expect_error_of<c10::ValueError>(
      [] { lamp::Fp8AutocastGuard g(delayed(4).margin(-1)); },
      "margin must be at least 0, got -1");
  lamp::nn::Linear fc(32, 16);
  fc->init_fp8_state(delayed(4));
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { fc->init_fp8_state(delayed(8)); },
      "its FP8 amax history holds 4 steps but the recipe's amax_history_len "
      "is 8");
  // clone() keeps the state.
  fc->fp8_scale.fill_(3);
  const auto copy =
      std::dynamic_pointer_cast<lamp::nn::LinearImpl>(fc->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(torch::equal(copy->fp8_scale, fc->fp8_scale));
  EXPECT_FALSE(copy->fp8_scale.is_same(fc->fp8_scale));
  // Current scaling keeps no state.
  lamp::nn::Linear plain(32, 16);
  {
    lamp::Fp8AutocastGuard fp8;
    plain(torch::randn({16, 32}));
  }
  EXPECT_FALSE(plain->fp8_amax_history.defined());
  EXPECT_EQ(plain->buffers().size(), 0u);
}

} // namespace

} // namespace fp8_delayed_test
