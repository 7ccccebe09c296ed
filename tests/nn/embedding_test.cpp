// lamp::nn::embedding against ATen's embedding (what Python's F.embedding
// runs): values and the weight's gradient, bit for bit, any index shape,
// int32 and int64, padding_idx; tied to lamp::nn::linear_cross_entropy's
// weight, the one gradient it leaves equals ATen's sum of the two, also
// where the head's backward does not come first, where a backward pass
// runs only one of them, twice with the graph retained, and where the
// weight changed in place between the two (not tied then); its errors. On
// a GPU lamp's kernel in fp32, bf16 and fp16 with long runs of one index,
// tied under autocast as GPT-2's head, and trained inside a CUDA graph.

#include <lamp/autocast.h>
#include <lamp/config.h>
#include <lamp/nn/embedding.h>
#include <lamp/nn/linear_cross_entropy.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nn/tied_grad.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace embedding_test {

namespace {

using lamp::nn::detail::tied_grad_adds;

// GPT-2's shape in small: V rows of C, a (B, T) batch of token ids whose
// targets are the next ids.
struct Tied {
  torch::Tensor w, idx, target, other;
};

Tied tied_problem(
    int64_t rows,
    int64_t dim,
    std::vector<int64_t> shape,
    torch::Device device = torch::kCPU) {
  torch::manual_seed(3);
  Tied p;
  p.w = (torch::randn({rows, dim}) * 0.2).to(device);
  // NOTE: a few ids far more often than the rest, as tokens in text.
  auto ids = torch::randint(rows, shape, torch::kLong);
  ids.masked_fill_(torch::rand(shape) < 0.3, 5);
  p.idx = ids.to(device);
  p.target = torch::randint(rows, shape, torch::kLong).to(device);
  p.other = torch::randn(shape).unsqueeze(-1).expand({-1, -1, dim}).to(device);
  return p;
}

// The loss of GPT-2's shape: the embedding, a nonlinearity, the tied head.
// `lamp_embedding` picks lamp's or ATen's embedding.
torch::Tensor tied_loss(
    const Tied& p,
    const torch::Tensor& w,
    bool lamp_embedding) {
  auto x = lamp_embedding ? lamp::nn::embedding(p.idx, w)
                          : torch::embedding(w, p.idx);
  auto h = torch::tanh(x * 1.5 + p.other);
  return lamp::nn::linear_cross_entropy(h, w, p.target);
}

torch::Tensor tied_grad(const Tied& p, bool lamp_embedding) {
  auto w = p.w.clone().requires_grad_();
  tied_loss(p, w, lamp_embedding).backward();
  return w.grad();
}

TEST(Embedding, EqualsAtensEmbeddingBitForBit) {
  torch::manual_seed(0);
  const auto w0 = torch::randn({40, 6});
  for (const auto& shape :
       std::vector<std::vector<int64_t>>{{7}, {3, 5}, {2, 3, 4}}) {
    for (const auto dtype : {torch::kLong, torch::kInt}) {
      for (const auto pad :
           std::vector<std::optional<int64_t>>{std::nullopt, 5, -35}) {
        SCOPED_TRACE(
            std::to_string(shape.size()) + "-D, " + c10::toString(dtype));
        auto idx = torch::randint(40, shape, torch::kLong);
        idx.view(-1)[0] = 5;
        idx = idx.to(dtype);
        auto a = w0.clone().requires_grad_();
        auto b = w0.clone().requires_grad_();
        const auto ya = lamp::nn::embedding(idx, a, pad);
        const auto yb = torch::embedding(b, idx, pad ? (*pad + 40) % 40 : -1);
        EXPECT_TRUE(torch::equal(ya, yb));
        (ya * 1.25).sum().backward();
        (yb * 1.25).sum().backward();
        EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
        if (pad) {
          EXPECT_EQ(a.grad()[5].abs().sum().item<float>(), 0.f);
        }
      }
    }
  }
}

TEST(Embedding, TiedHeadGetsOneGradientEqualToAtensSum) {
  const auto p = tied_problem(50, 16, {4, 12});
  const auto before = tied_grad_adds();
  const auto got = tied_grad(p, true);
  EXPECT_EQ(tied_grad_adds(), before + 1); // added into the head's
  EXPECT_TRUE(torch::equal(got, tied_grad(p, false)));
}

// The head's input does not depend on the embedding: the two backward
// functions run in either order, each separate backward pass runs one.
TEST(Embedding, UntiedOrderOrSeparatePassesStillSumBoth) {
  const auto p = tied_problem(50, 16, {4, 12});
  auto loss = [&](const torch::Tensor& w, bool lamp_embedding) {
    auto x = lamp_embedding ? lamp::nn::embedding(p.idx, w)
                            : torch::embedding(w, p.idx);
    auto head = lamp::nn::linear_cross_entropy(p.other, w, p.target);
    return std::make_pair(x, head);
  };
  auto expected = p.w.clone().requires_grad_();
  {
    auto [x, head] = loss(expected, false);
    ((x * 0.5).sum() + head).backward();
  }
  // One pass, both in it.
  auto one = p.w.clone().requires_grad_();
  {
    auto [x, head] = loss(one, true);
    ((x * 0.5).sum() + head).backward();
  }
  EXPECT_TRUE(torch::allclose(one.grad(), expected.grad(), 1e-6, 1e-7));
  // A gradient already there, then the head alone, then the embedding
  // alone: the head's gradient of the first pass (added into the weight's
  // and dropped) must not be what the second pass adds into.
  const auto before = tied_grad_adds();
  auto apart = p.w.clone().requires_grad_();
  (apart * 0).sum().backward();
  {
    auto [x, head] = loss(apart, true);
    head.backward();
    (x * 0.5).sum().backward();
  }
  EXPECT_EQ(tied_grad_adds(), before);
  EXPECT_TRUE(torch::allclose(apart.grad(), expected.grad(), 1e-6, 1e-7));
}

// W used a third time, its gradient arriving before the head's or after
// it: the engine sums them into another tensor, which the embedding must
// not miss.
TEST(Embedding, AThirdUseOfTheWeightStillSumsAll) {
  const auto p = tied_problem(50, 16, {4, 12});
  for (const bool penalty_first : {false, true}) {
    SCOPED_TRACE(penalty_first ? "penalty first" : "penalty last");
    auto run = [&](bool lamp_embedding) {
      auto w = p.w.clone().requires_grad_();
      torch::Tensor penalty;
      if (penalty_first) {
        penalty = (w * w).sum() * 0.01;
      }
      auto loss = tied_loss(p, w, lamp_embedding);
      if (!penalty_first) {
        penalty = (w * w).sum() * 0.01;
      }
      (loss + penalty).backward();
      return w.grad();
    };
    EXPECT_TRUE(torch::allclose(run(true), run(false), 1e-6, 1e-7));
  }
}

TEST(Embedding, TwoPassesWithTheGraphRetainedAccumulateTwice) {
  const auto p = tied_problem(50, 16, {4, 12});
  auto run = [&](bool lamp_embedding) {
    auto w = p.w.clone().requires_grad_();
    auto loss = tied_loss(p, w, lamp_embedding);
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    return w.grad();
  };
  const auto before = tied_grad_adds();
  const auto got = run(true);
  EXPECT_EQ(tied_grad_adds(), before + 2);
  EXPECT_TRUE(torch::equal(got, run(false)));
}

// A weight changed in place after the embedding gives the head's gradient
// another path back: not tied then, and still right.
TEST(Embedding, AWeightChangedInPlaceBetweenThemIsNotTied) {
  const auto p = tied_problem(50, 16, {4, 12});
  auto run = [&](bool lamp_embedding) {
    auto leaf = p.w.clone().requires_grad_();
    auto w = leaf * 1.0;
    auto x = lamp_embedding ? lamp::nn::embedding(p.idx, w)
                            : torch::embedding(w, p.idx);
    w.mul_(2.0);
    auto h = torch::tanh(x * 1.5 + p.other);
    lamp::nn::linear_cross_entropy(h, w, p.target).backward();
    return leaf.grad();
  };
  const auto before = tied_grad_adds();
  const auto got = run(true);
  EXPECT_EQ(tied_grad_adds(), before);
  EXPECT_TRUE(torch::equal(got, run(false)));
}

TEST(Embedding, BadInputIsAClearError) {
  const auto w = torch::randn({10, 4});
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { lamp::nn::embedding(torch::zeros({3}), w); },
      "expected int64 or int32 indices, got Float");
  lamp::test::expect_error_of<c10::ValueError>(
      [&] {
        lamp::nn::embedding(torch::zeros({3}, torch::kLong), torch::randn(4));
      },
      "expected indices and a 2-D weight (num_embeddings, dim), got [4]");
  lamp::test::expect_error_of<c10::ValueError>(
      [&] { lamp::nn::embedding(torch::zeros({3}, torch::kLong), w, 10); },
      "padding_idx must be within num_embeddings (10), got 10");
  // Out of range: ATen's own error.
  EXPECT_THROW(
      lamp::nn::embedding(torch::full({3}, 10, torch::kLong), w), c10::Error);
}

#if LAMP_WITH_CUDA

class EmbeddingGpu : public lamp::test::GpuTest {};

// At least 3,072 lookups: ATen sorts them as lamp does; long runs of one
// id (a third of them id 5), the padding row, a row width that is not a
// multiple of the block.
TEST_F(EmbeddingGpu, KernelEqualsAtensBitForBit) {
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t dim : {768, 100}) {
      for (const int64_t pad : {-1, 7}) {
        SCOPED_TRACE(
            std::string(c10::toString(dtype)) + " " + std::to_string(dim) +
            " pad " + std::to_string(pad));
        const auto p = tied_problem(1000, dim, {16, 512}, torch::kCUDA);
        const auto w0 = p.w.to(dtype);
        const auto g = torch::randn({16, 512, dim}, w0.options());
        auto a = w0.clone().requires_grad_();
        auto b = w0.clone().requires_grad_();
        std::optional<int64_t> opt_pad;
        if (pad >= 0) {
          opt_pad = pad;
        }
        lamp::nn::embedding(p.idx, a, opt_pad).backward(g);
        torch::embedding(b, p.idx, pad).backward(g);
        EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
      }
    }
  }
}

// Fewer lookups: ATen sums in another order; equal within rounding.
TEST_F(EmbeddingGpu, FewLookupsEqualAtensWithinRounding) {
  const auto p = tied_problem(300, 64, {4, 100}, torch::kCUDA);
  const auto g = torch::randn({4, 100, 64}, p.w.options());
  auto a = p.w.clone().requires_grad_();
  auto b = p.w.clone().requires_grad_();
  lamp::nn::embedding(p.idx, a).backward(g);
  torch::embedding(b, p.idx).backward(g);
  EXPECT_TRUE(torch::allclose(a.grad(), b.grad(), 1e-5, 1e-6));
}

// GPT-2's use: an fp32 weight, bf16 autocast, the head's gradient in fp32;
// the sum is ATen's bit for bit.
TEST_F(EmbeddingGpu, TiedUnderAutocastEqualsAtensSumBitForBit) {
  const auto p = tied_problem(1000, 64, {8, 512}, torch::kCUDA);
  auto run = [&](bool lamp_embedding) {
    lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
    return tied_grad(p, lamp_embedding);
  };
  const auto before = tied_grad_adds();
  const auto got = run(true);
  EXPECT_EQ(tied_grad_adds(), before + 1);
  EXPECT_TRUE(torch::equal(got, run(false)));
}

// Trained with FusedSGD inside lamp::GraphedStep: the replays' weights equal
// eager steps' bit for bit, and ATen's embedding's.
TEST_F(EmbeddingGpu, GraphedStepsEqualEagerSteps) {
  const auto p = tied_problem(1000, 64, {8, 512}, torch::kCUDA);
  auto train = [&](bool graphed, bool lamp_embedding) {
    auto w = p.w.clone().requires_grad_();
    lamp::optim::FusedSGD sgd(
        std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.5));
    auto step = [&](const std::vector<torch::Tensor>&) {
      sgd.zero_grad();
      auto loss = tied_loss(p, w, lamp_embedding);
      loss.backward();
      sgd.step();
      return loss.detach();
    };
    lamp::test::run_steps(graphed, step, {p.idx}, sgd);
    return w.detach();
  };
  const auto eager = train(false, false);
  EXPECT_TRUE(torch::equal(train(false, true), eager));
  const auto before = tied_grad_adds();
  EXPECT_TRUE(torch::equal(train(true, true), eager));
  EXPECT_GT(tied_grad_adds(), before); // tied in the captured step too
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace embedding_test
