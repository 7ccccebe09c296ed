// lamp::detail::check_non_finite, GradScaler's read-only inf check for fused
// optimizers: the same answer as ATen's unscale-by-1 for inf, -inf and NaN in
// every part of a tensor (the unaligned head, the 16-byte body, the tail),
// for fp32 and fp16, views at odd offsets, channels-last tensors and
// more tensors than one launch takes; gradients are never written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "amp/non_finite_check.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace non_finite_check_test {

namespace {

class NonFiniteCheckGpu : public lamp::test::GpuTest {};

// The tensor's bytes as integers of its element size.
torch::Tensor bits(const torch::Tensor& t) {
  return t.contiguous().view(
      t.element_size() == 2 ? torch::kShort : torch::kInt);
}

// found_inf by lamp's check and by ATen's _amp_foreach_..._unscale_ with 1.
std::pair<float, float> both(const std::vector<torch::Tensor>& tensors) {
  const auto options = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto lamp_inf = torch::zeros({}, options);
  auto copies = std::vector<torch::Tensor>();
  for (const auto& t : tensors) {
    copies.push_back(t.clone());
  }
  const auto rest = lamp::detail::check_non_finite(tensors, lamp_inf);
  EXPECT_TRUE(rest.empty());
  for (size_t i = 0; i < tensors.size(); ++i) {
    // Bits, not values (NaN != NaN): nothing may be written.
    EXPECT_TRUE(torch::equal(bits(tensors[i]), bits(copies[i])))
        << "written: #" << i;
  }
  auto aten_inf = torch::zeros({}, options);
  torch::_amp_foreach_non_finite_check_and_unscale_(
      copies, aten_inf, torch::ones({}, options));
  return {lamp_inf.item<float>(), aten_inf.item<float>()};
}

TEST_F(NonFiniteCheckGpu, FindsEveryNonFiniteValueWhereverItIs) {
  const float values[] = {
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN()};
  for (auto dtype : {torch::kFloat, torch::kHalf}) {
    for (int64_t offset : {0, 1, 3}) {
      for (int64_t n : {1, 5, 8, 9, 40, 1000, 8192, 16385, 70001}) {
        auto base = torch::randn(
            {n + offset}, torch::dtype(dtype).device(torch::kCUDA));
        auto view = base.narrow(0, offset, n); // misaligned when offset > 0
        SCOPED_TRACE(
            testing::Message() << dtype << " n=" << n << " offset=" << offset);
        auto [lamp_clean, aten_clean] = both({view});
        EXPECT_EQ(lamp_clean, 0.f);
        EXPECT_EQ(aten_clean, 0.f);
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          for (float v : values) {
            auto bad = view.clone();
            bad.index_put_({at}, v);
            auto shifted = base.clone();
            shifted.narrow(0, offset, n).copy_(bad);
            auto [lamp_inf, aten_inf] = both({shifted.narrow(0, offset, n)});
            EXPECT_EQ(lamp_inf, 1.f) << "at " << at << " value " << v;
            EXPECT_EQ(aten_inf, 1.f);
          }
        }
      }
    }
  }
}

TEST_F(NonFiniteCheckGpu, LargestFiniteValuesAreFinite) {
  for (auto dtype : {torch::kFloat, torch::kHalf}) {
    const auto options = torch::dtype(dtype).device(torch::kCUDA);
    const double max = dtype == torch::kHalf ? 65504.0 : 3.4028234663852886e38;
    auto t = torch::full({33}, max, options);
    t.index_put_({1}, -max);
    t.index_put_({2}, 0.0);
    t.index_put_({3}, -0.0);
    t.index_put_({4}, dtype == torch::kHalf ? 1e-7 : 1e-40); // subnormal
    auto [lamp_inf, aten_inf] = both({t});
    EXPECT_EQ(lamp_inf, 0.f) << dtype;
    EXPECT_EQ(aten_inf, 0.f) << dtype;
  }
}

TEST_F(NonFiniteCheckGpu, ManyTensorsAndLayouts) {
  const auto options = torch::dtype(torch::kFloat).device(torch::kCUDA);
  std::vector<torch::Tensor> tensors;
  for (int i = 0; i < 500; ++i) { // three launches of at most 224
    tensors.push_back(torch::randn({i % 7 + 1}, options));
  }
  tensors.push_back(torch::randn({4, 6, 5, 3}, options)
                        .contiguous(torch::MemoryFormat::ChannelsLast));
  tensors.push_back(
      torch::randn({3, 4}, options.dtype(torch::kHalf)).t()); // dense
  EXPECT_EQ(both(tensors).first, 0.f);
  for (size_t bad : {size_t{0}, size_t{300}, size_t{499}, size_t{500}}) {
    auto copy = tensors;
    copy[bad] = copy[bad].clone(at::MemoryFormat::Preserve);
    copy[bad]
        .as_strided({copy[bad].numel()}, {1})
        .index_put_({-1}, std::nanf(""));
    EXPECT_EQ(both(copy).first, 1.f) << "tensor #" << bad;
  }
}

TEST_F(NonFiniteCheckGpu, LeavesWhatItCannotReadToTheCaller) {
  const auto options = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto cuda = torch::randn({10}, options);
  const auto gaps = torch::randn({4, 6}, options).narrow(1, 0, 3);
  const auto cpu = torch::randn({10});
  const auto dbl = torch::randn({10}, options.dtype(torch::kDouble));
  const auto bf16 = torch::randn({10}, options.dtype(torch::kBFloat16));
  auto found_inf = torch::zeros({}, options);
  const auto rest =
      lamp::detail::check_non_finite({cuda, gaps, cpu, dbl, bf16}, found_inf);
  ASSERT_EQ(rest.size(), 4u);
  EXPECT_TRUE(rest[0].is_same(gaps));
  EXPECT_TRUE(rest[1].is_same(cpu));
  EXPECT_TRUE(rest[2].is_same(dbl));
  EXPECT_TRUE(rest[3].is_same(bf16)) << "ATen refuses bf16: Python's error";
  EXPECT_EQ(found_inf.item<float>(), 0.f);
}

} // namespace

} // namespace non_finite_check_test
