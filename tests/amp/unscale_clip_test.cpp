// GradScaler's unscale that keeps the sums of squares for the clip that
// follows (lamp::detail::unscale_keeping_sums, Note [Sums kept from the
// unscale]): the unscale equals ATen's _amp_foreach_non_finite_check_and_
// unscale_ bit for bit (values, infs and NaNs, inv_scale 1 or not); a clip of
// the same unchanged gradients is one kernel and equals the two-kernel clip
// after ATen's unscale bit for bit; a gradient changed, replaced or listed in
// another order in between makes the clip compute its own sums; through
// lamp::GradScaler the same holds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lamp/clip_grad.h>
#include <lamp/grad_scaler.h>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/fused_clip_grad.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace unscale_clip_test {

namespace {

class UnscaleClipGpu : public lamp::test::GpuTest {};

// The tensor's bytes as integers of its element size (NaN == NaN).
torch::Tensor bits(const torch::Tensor& t) {
  return t.contiguous().view(
      t.element_size() == 2 ? torch::kShort : torch::kInt);
}

// Parameters of odd sizes (5 elements to 20 M: more blocks than the clip's
// smallest chunks give) with gradients of `dtype`, times `scale`.
std::vector<torch::Tensor> params_of(torch::Dtype dtype, double scale) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  for (int64_t n : {5, 1, 4097, 300001, 20000003, 77, 65536}) {
    auto p = torch::zeros({n}, torch::dtype(dtype).device(torch::kCUDA))
                 .requires_grad_();
    p.mutable_grad() =
        (torch::randn({n}, torch::kCUDA) * (0.01 * scale)).to(dtype);
    out.push_back(p);
  }
  return out;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.grad());
  }
  return out;
}

std::vector<torch::Tensor> cloned(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    auto q = p.detach().clone().requires_grad_();
    q.mutable_grad() = p.grad().clone();
    out.push_back(q);
  }
  return out;
}

torch::Tensor scalar(float v) {
  return torch::full({}, v, torch::dtype(torch::kFloat).device(torch::kCUDA));
}

void expect_same_bits(
    const std::vector<torch::Tensor>& a,
    const std::vector<torch::Tensor>& b,
    const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(bits(a[k].grad()), bits(b[k].grad())))
        << what << ": gradient #" << k;
  }
}

TEST_F(UnscaleClipGpu, UnscaleEqualsAtensBitForBitWithInfsAndNans) {
  const float inf = std::numeric_limits<float>::infinity();
  for (auto dtype : {torch::kFloat, torch::kHalf}) {
    for (float inv : {1.f / 65536.f, 1.f, 3.f}) {
      for (bool poisoned : {false, true}) {
        auto ours = params_of(dtype, 1000.0);
        if (poisoned) {
          ours[3].grad()[17] = inf; // head, body and tail of a tensor
          ours[3].grad()[150000] = -inf;
          ours[0].grad()[4] = std::numeric_limits<float>::quiet_NaN();
        }
        auto aten = cloned(ours);
        auto found = scalar(0), aten_found = scalar(0);
        ASSERT_TRUE(lamp::detail::unscale_keeping_sums(
            grads_of(ours), found, scalar(inv)));
        torch::_amp_foreach_non_finite_check_and_unscale_(
            grads_of(aten), aten_found, scalar(inv));
        const std::string what = std::string(c10::toString(dtype)) + " inv " +
            std::to_string(inv) + (poisoned ? " poisoned" : "");
        expect_same_bits(ours, aten, what);
        EXPECT_EQ(found.item<float>(), aten_found.item<float>()) << what;
        EXPECT_EQ(found.item<float>(), poisoned ? 1.f : 0.f) << what;
      }
    }
  }
}

TEST_F(UnscaleClipGpu, TheClipAfterItIsOneKernelAndTheSameBits) {
  for (auto dtype : {torch::kFloat, torch::kHalf}) {
    for (double max_norm : {1e9, 0.5}) { // not clipped, clipped
      auto ours = params_of(dtype, 65536.0);
      auto aten = cloned(ours);
      auto found = scalar(0), aten_found = scalar(0);
      const auto inv = scalar(1.f / 65536.f);
      ASSERT_TRUE(
          lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv));
      const int64_t before = lamp::detail::clips_from_kept_sums();
      const auto norm = lamp::clip_grad_norm_(ours, max_norm);
      EXPECT_EQ(lamp::detail::clips_from_kept_sums(), before + 1);
      torch::_amp_foreach_non_finite_check_and_unscale_(
          grads_of(aten), aten_found, inv);
      const auto aten_norm = lamp::clip_grad_norm_(aten, max_norm);
      EXPECT_EQ(lamp::detail::clips_from_kept_sums(), before + 1);
      const std::string what = std::string(c10::toString(dtype)) +
          " max_norm " + std::to_string(max_norm);
      EXPECT_TRUE(torch::equal(norm, aten_norm)) << what;
      expect_same_bits(ours, aten, what);
      // Kept sums serve one clip: a second clip computes its own.
      lamp::clip_grad_norm_(ours, max_norm);
      EXPECT_EQ(lamp::detail::clips_from_kept_sums(), before + 1) << what;
    }
  }
}

// More gradients than one launch takes: the unscale still keeps the sums
// (one launch a list of 176) and the clip is still one kernel a list.
TEST_F(UnscaleClipGpu, AnyNumberOfGradientsKeepTheirSums) {
  for (const int64_t count : {177, 600}) {
    torch::manual_seed(5);
    std::vector<torch::Tensor> ours;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t n = k % 5 == 0 ? 30000 + k : 17 + k;
      auto p = torch::zeros({n}, torch::kCUDA).requires_grad_();
      p.mutable_grad() = torch::randn({n}, torch::kCUDA) * 300.0;
      ours.push_back(p);
    }
    auto aten = cloned(ours);
    auto found = scalar(0), aten_found = scalar(0);
    const auto inv = scalar(1.f / 1024.f);
    ASSERT_TRUE(lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv))
        << count;
    const int64_t before = lamp::detail::clips_from_kept_sums();
    const auto norm = lamp::clip_grad_norm_(ours, 0.5);
    EXPECT_EQ(lamp::detail::clips_from_kept_sums(), before + 1) << count;
    torch::_amp_foreach_non_finite_check_and_unscale_(
        grads_of(aten), aten_found, inv);
    EXPECT_TRUE(torch::equal(norm, lamp::clip_grad_norm_(aten, 0.5))) << count;
    expect_same_bits(ours, aten, std::to_string(count) + " gradients");
  }
}

TEST_F(UnscaleClipGpu, AGradientChangedReplacedOrReorderedIsSeen) {
  const auto inv = scalar(0.25f);
  // What the clip must give: its own sums over the gradients as they are.
  auto check = [&](std::vector<torch::Tensor>& ours,
                   std::vector<torch::Tensor>& reference,
                   const std::string& what) {
    const int64_t before = lamp::detail::clips_from_kept_sums();
    const auto norm = lamp::clip_grad_norm_(ours, 1.0);
    EXPECT_EQ(lamp::detail::clips_from_kept_sums(), before) << what;
    EXPECT_TRUE(torch::equal(norm, lamp::clip_grad_norm_(reference, 1.0)))
        << what;
    expect_same_bits(ours, reference, what);
  };
  {
    auto ours = params_of(torch::kFloat, 8.0);
    auto found = scalar(0);
    ASSERT_TRUE(lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv));
    ours[2].grad().mul_(2); // an in-place op: its version moves on
    auto reference = cloned(ours);
    check(ours, reference, "changed in place");
  }
  {
    auto ours = params_of(torch::kFloat, 8.0);
    auto found = scalar(0);
    ASSERT_TRUE(lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv));
    ours[4].mutable_grad() = ours[4].grad().clone(); // another tensor
    auto reference = cloned(ours);
    check(ours, reference, "replaced");
  }
  {
    auto ours = params_of(torch::kFloat, 8.0);
    auto found = scalar(0);
    ASSERT_TRUE(lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv));
    std::swap(ours[0], ours[1]);
    auto reference = cloned(ours);
    check(ours, reference, "reordered");
  }
  {
    auto ours = params_of(torch::kFloat, 8.0);
    auto found = scalar(0);
    ASSERT_TRUE(lamp::detail::unscale_keeping_sums(grads_of(ours), found, inv));
    ours.pop_back(); // a subset
    auto reference = cloned(ours);
    check(ours, reference, "a subset");
  }
}

TEST_F(UnscaleClipGpu, WhatItDoesNotTakeGoesToAten) {
  auto found = scalar(0);
  const auto inv = scalar(0.5f);
  auto bf16 = params_of(torch::kBFloat16, 1.0);
  EXPECT_FALSE(lamp::detail::unscale_keeping_sums(grads_of(bf16), found, inv));
  auto mixed = params_of(torch::kFloat, 1.0);
  mixed[1].mutable_grad() = mixed[1].grad().to(torch::kHalf);
  EXPECT_FALSE(lamp::detail::unscale_keeping_sums(grads_of(mixed), found, inv));
  auto strided = params_of(torch::kFloat, 1.0);
  strided[2].mutable_grad() =
      torch::randn({4097 * 2}, torch::kCUDA).slice(0, 0, 4097 * 2, 2);
  EXPECT_FALSE(
      lamp::detail::unscale_keeping_sums(grads_of(strided), found, inv));
  EXPECT_FALSE(lamp::detail::unscale_keeping_sums({}, found, inv));
}

// The recipe through lamp::GradScaler: scale, backward, unscale_, clip,
// step; the clip takes the kept sums, and the step equals one whose clip
// computed its own (the same gradients bit for bit).
TEST_F(UnscaleClipGpu, GradScalerUnscaleThenClipTakesTheKeptSums) {
  auto run = [](bool disturb) {
    torch::manual_seed(5);
    torch::nn::Linear net(64, 32);
    net->to(torch::kCUDA);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(4096));
    const auto x = torch::randn({16, 64}, torch::kCUDA);
    const auto loss = net->forward(x).pow(2).mean();
    scaler.scale(loss).backward();
    scaler.unscale_(sgd);
    if (disturb) {
      net->weight.grad().add_(0); // same values, a new version
    }
    const int64_t before = lamp::detail::clips_from_kept_sums();
    const auto norm = lamp::clip_grad_norm_(net->parameters(), 0.1);
    const bool kept = lamp::detail::clips_from_kept_sums() == before + 1;
    scaler.step(sgd);
    scaler.update();
    return std::make_tuple(norm, net->weight.detach().clone(), kept);
  };
  const auto [norm, weight, kept] = run(false);
  const auto [own_norm, own_weight, own_kept] = run(true);
  EXPECT_TRUE(kept);
  EXPECT_FALSE(own_kept);
  EXPECT_TRUE(torch::equal(norm, own_norm));
  EXPECT_TRUE(torch::equal(weight, own_weight));
}

} // namespace

} // namespace unscale_clip_test
