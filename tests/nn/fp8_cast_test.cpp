// lamp::nn::linear's FP8 casts on CUDA (src/nn/fp8_cast_cuda.h): one
// kernel writes what the reference ops (quantize_delayed,
// quantize_tensorwise) write, byte for byte, and the transposed copy the
// backward's GEMMs take, for fp32, fp16 and bf16 operands, both formats,
// shapes that are not multiples of the kernel's tile, strided and
// misaligned views, and the values that matter: saturation, inf, NaN, -0
// and numbers that round to FP8's subnormals. And delayed scaling's update
// in one kernel against the reference ops.

#include <lamp/config.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nn/fp8_linear.h"
#include "support.h"

#if LAMP_WITH_CUDA
#include "nn/fp8_cast_cuda.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace fp8_cast_test {

namespace {

#if LAMP_WITH_CUDA

using lamp::nn::detail::Fp8Cast;

// An operand with every kind of value the casts treat apart.
torch::Tensor operand(
    int64_t rows,
    int64_t cols,
    torch::ScalarType dtype,
    bool specials) {
  torch::manual_seed(rows * 7 + cols);
  auto x = torch::randn({rows, cols}) * 3;
  // Some tiny ones (FP8 subnormals or zero after scaling) and some large.
  x.index_put_({torch::indexing::Slice(0, 1)}, x[0] * 1e-6);
  x.index_put_({torch::indexing::Slice(1, 2)}, x[1] * 1e3);
  if (specials) {
    const float inf = std::numeric_limits<float>::infinity();
    x[2][0] = inf;
    x[2][1] = -inf;
    x[3][2] = std::numeric_limits<float>::quiet_NaN();
    x[3][3] = -0.0f;
  }
  return x.to(torch::Device(torch::kCUDA), dtype);
}

// The bytes of an FP8 tensor, each NaN made 0x7F (e4m3: 0x7F and 0xFF;
// e5m2: an all-ones exponent with a mantissa, either sign).
torch::Tensor bytes(const torch::Tensor& t) {
  const auto b = t.contiguous().view(torch::kUInt8).to(torch::kInt32).cpu();
  const auto low = b.bitwise_and(0x7F);
  const auto nan =
      t.scalar_type() == torch::kFloat8_e5m2 ? low > 0x7C : low == 0x7F;
  return torch::where(nan, torch::full_like(b, 0x7F), b);
}

void expect_same_cast(
    const Fp8Cast& fused,
    const torch::Tensor& data,
    const torch::Tensor& inverse,
    const std::string& what) {
  ASSERT_TRUE(fused.data.defined()) << what;
  ASSERT_TRUE(fused.data_t.defined()) << what;
  EXPECT_EQ(fused.data.scalar_type(), data.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(bytes(fused.data), bytes(data))) << what;
  EXPECT_TRUE(torch::equal(bytes(fused.data_t), bytes(data.t()))) << what;
  EXPECT_TRUE(fused.data_t.is_contiguous()) << what;
  // NOTE: NaN where the amax is (an operand with a NaN): equal as NaNs.
  EXPECT_TRUE(torch::allclose(
      fused.inverse_scale.cpu(), inverse.cpu(), 0, 0, /*equal_nan=*/true))
      << what;
}

// Every operand dtype x format x shape, with and without non-finite values.
template <typename Check>
void for_each_case(Check check) {
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const auto fp8 : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
      for (const auto& [rows, cols] :
           {std::tuple<int64_t, int64_t>{64, 64},
            {130, 258},
            {16, 1000},
            {200, 136},
            {1024, 768}}) {
        for (const bool specials : {false, true}) {
          const auto x = operand(rows, cols, dtype, specials);
          std::ostringstream what;
          what << dtype << " -> " << fp8 << " " << rows << "x" << cols
               << (specials ? " with inf/NaN" : "");
          check(x, fp8, what.str());
        }
      }
    }
  }
}

TEST(Fp8CastGpu, TensorwiseIsTheReferenceByteForByte) {
  LAMP_SKIP_WITHOUT_CUDA();
  for_each_case([](const torch::Tensor& x,
                   torch::ScalarType fp8,
                   const std::string& what) {
    const auto [data, inverse] = lamp::nn::detail::quantize_tensorwise(x, fp8);
    const auto fused = lamp::nn::detail::fp8_cast_tensorwise_cuda(
        x, fp8, /*data=*/true, /*transposed=*/true);
    expect_same_cast(fused, data, inverse, what);
  });
}

TEST(Fp8CastGpu, DelayedIsTheReferenceByteForByteAndRecordsTheAmax) {
  LAMP_SKIP_WITHOUT_CUDA();
  for_each_case([](const torch::Tensor& x,
                   torch::ScalarType fp8,
                   const std::string& what) {
    // A scale that makes the largest values overflow the format (they
    // saturate), as a delayed scale does when amax grows.
    const auto finite = torch::nan_to_num(x.to(torch::kFloat), 0, 0, 0);
    const auto scale = (4 * lamp::nn::detail::fp8_max_of(fp8) /
                        finite.abs().max().clamp_min(1e-12))
                           .to(torch::kFloat);
    // Each amax a slot of a history, as lamp::nn::Linear's.
    auto history = torch::full({3, 4}, 7.0f, x.options().dtype(torch::kFloat));
    auto reference_history = history.clone();
    const auto [data, inverse] = lamp::nn::detail::quantize_delayed(
        x, fp8, scale, reference_history.select(0, 1).select(0, 0));
    const auto fused = lamp::nn::detail::fp8_cast_delayed_cuda(
        x,
        fp8,
        scale,
        history.select(0, 1).select(0, 0),
        /*data=*/true,
        /*transposed=*/true);
    expect_same_cast(fused, data, inverse, what);
    EXPECT_TRUE(torch::equal(
        history.nan_to_num(-1).cpu(), reference_history.nan_to_num(-1).cpu()))
        << what << "\nfused:\n"
        << history << "\nreference:\n"
        << reference_history;
  });
}

// The kernel folds its amax into the slot as quantize_delayed does: the
// larger of the two (no fill first; the scale update zeroes the slot).
TEST(Fp8CastGpu, DelayedFoldsTheAmaxIntoTheSlotAsTheReference) {
  LAMP_SKIP_WITHOUT_CUDA();
  for (const bool specials : {false, true}) {
    const auto x = operand(200, 136, torch::kBFloat16, specials);
    const auto scale = torch::full({}, 0.5f, x.options().dtype(torch::kFloat));
    const float amax =
        x.to(torch::kFloat).abs().nan_to_num(0, 0, 0).max().item<float>();
    for (const float held : {0.0f, amax / 2, amax * 4}) {
      auto slot = torch::full({}, held, scale.options());
      auto reference = slot.clone();
      lamp::nn::detail::quantize_delayed(
          x, torch::kFloat8_e5m2, scale, reference);
      lamp::nn::detail::fp8_cast_delayed_cuda(
          x, torch::kFloat8_e5m2, scale, slot, true, true);
      EXPECT_TRUE(torch::equal(slot.nan_to_num(-1), reference.nan_to_num(-1)))
          << held << " " << specials << ": " << slot.item<float>() << " vs "
          << reference.item<float>();
      if (!specials) {
        EXPECT_EQ(slot.item<float>(), std::max(held, amax)) << held;
      }
    }
  }
}

TEST(Fp8CastGpu, StridedAndMisalignedOperandsAreCastAsTheirValues) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto base = operand(96, 130, torch::kBFloat16, true);
  // A transposed view, and a contiguous view that starts at an odd element.
  const auto strided = base.t();
  const auto misaligned = base.flatten().narrow(0, 1, 94 * 130).view({94, 130});
  // Rows and columns multiples of 8 (the kernel's 8-wide path) in views
  // that start 4 bytes (too little for its 16-byte loads) and 16 bytes in.
  const auto wide = operand(64, 136, torch::kBFloat16, true).flatten();
  const auto four_in = wide.narrow(0, 2, 56 * 136).view({56, 136});
  const auto sixteen_in = wide.narrow(0, 8, 56 * 136).view({56, 136});
  for (const auto& x : {strided, misaligned, four_in, sixteen_in}) {
    for (const auto fp8 : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
      const auto [data, inverse] =
          lamp::nn::detail::quantize_tensorwise(x, fp8);
      const auto fused = lamp::nn::detail::fp8_cast_tensorwise_cuda(
          x, fp8, /*data=*/true, /*transposed=*/true);
      expect_same_cast(fused, data, inverse, "a view");
    }
  }
}

TEST(Fp8CastGpu, OnlyTheCopiesAskedForAreWritten) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto x = operand(64, 32, torch::kBFloat16, false);
  const auto t_only = lamp::nn::detail::fp8_cast_tensorwise_cuda(
      x, torch::kFloat8_e4m3fn, /*data=*/false, /*transposed=*/true);
  EXPECT_FALSE(t_only.data.defined());
  ASSERT_TRUE(t_only.data_t.defined());
  EXPECT_EQ(t_only.data_t.sizes(), torch::IntArrayRef({32, 64}));
  const auto data_only = lamp::nn::detail::fp8_cast_tensorwise_cuda(
      x, torch::kFloat8_e4m3fn, /*data=*/true, /*transposed=*/false);
  EXPECT_FALSE(data_only.data_t.defined());
  EXPECT_TRUE(torch::equal(bytes(data_only.data), bytes(t_only.data_t.t())));
  // An odd dimension is not the kernels' case.
  EXPECT_FALSE(lamp::nn::detail::fp8_cast_cuda_applies(
      torch::zeros({3, 4}, x.options())));
  EXPECT_FALSE(lamp::nn::detail::fp8_cast_cuda_applies(
      torch::zeros({4, 4}, torch::kBFloat16)));
}

// A weight's cast casts its layer's bias along for the GEMM's epilogue
// (Fp8CastSpec::ride): ATen's fp32 -> bf16 / fp16 bits, in both kernels
// (8-wide and 2-wide shapes), both recipes, any length.
TEST(Fp8CastGpu, ABiasCastAlongIsATensCast) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto scale = torch::full({}, 4.0f, torch::Device(torch::kCUDA));
  for (const auto& [rows, cols] : {std::pair{64, 32}, std::pair{30, 34}}) {
    const auto x = operand(rows, cols, torch::kFloat, false);
    for (const int64_t n : {1, 37, 5000}) {
      const auto bias = torch::randn({n}, x.options()) * 100;
      for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
        const auto current = lamp::nn::detail::fp8_cast_tensorwise_cuda(
            x,
            torch::kFloat8_e4m3fn,
            true,
            true,
            false,
            lamp::nn::detail::Fp8CastOp::kNone,
            {},
            bias,
            dtype);
        auto amax = torch::zeros({}, x.options());
        const auto delayed = lamp::nn::detail::fp8_cast_delayed_cuda(
            x,
            torch::kFloat8_e4m3fn,
            scale,
            amax,
            true,
            true,
            false,
            lamp::nn::detail::Fp8CastOp::kNone,
            {},
            bias,
            dtype);
        for (const auto* out : {&current, &delayed}) {
          ASSERT_TRUE(out->bias16.defined());
          EXPECT_TRUE(torch::equal(out->bias16, bias.to(dtype)))
              << rows << "x" << cols << ", " << n << ", " << dtype;
        }
      }
    }
  }
}

// The output gradient's cast also sums its columns (the bias gradient) in
// the read it makes: fp32 sums as ATen's, in a fixed order (the same bits
// every run), the FP8 bytes unchanged; shapes its 8-wide path does not take
// leave them to the caller.
TEST(Fp8CastGpu, ColumnSumsAreTheBiasGradient) {
  LAMP_SKIP_WITHOUT_CUDA();
  for (const auto& [rows, cols] :
       {std::tuple<int64_t, int64_t>{64, 64},
        {200, 136},
        {16, 1000},
        {8192, 768}}) {
    for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
      const auto x = operand(rows, cols, dtype, false);
      const auto what = std::to_string(rows) + "x" + std::to_string(cols);
      const auto plain = lamp::nn::detail::fp8_cast_tensorwise_cuda(
          x, torch::kFloat8_e5m2, true, true);
      const auto summed = lamp::nn::detail::fp8_cast_tensorwise_cuda(
          x, torch::kFloat8_e5m2, true, true, /*column_sums=*/true);
      const auto again = lamp::nn::detail::fp8_cast_tensorwise_cuda(
          x, torch::kFloat8_e5m2, true, true, /*column_sums=*/true);
      ASSERT_TRUE(summed.column_sums.defined()) << what;
      EXPECT_FALSE(plain.column_sums.defined()) << what;
      EXPECT_EQ(summed.column_sums.scalar_type(), torch::kFloat) << what;
      EXPECT_TRUE(torch::equal(summed.column_sums, again.column_sums)) << what;
      EXPECT_TRUE(torch::equal(bytes(summed.data), bytes(plain.data))) << what;
      EXPECT_TRUE(torch::equal(bytes(summed.data_t), bytes(plain.data_t)))
          << what;
      const auto exact = x.to(torch::kDouble).sum(0);
      const auto aten = x.sum(0, false, torch::kFloat);
      // NOTE: both fp32 sums of up to 8,192 terms, in other orders: each
      // within a few fp32 roundings of the exact sum, scaled by the terms'
      // size (sums of signed terms can cancel).
      const auto size = x.to(torch::kDouble).abs().sum(0);
      const double ours =
          ((summed.column_sums.to(torch::kDouble) - exact).abs() / size)
              .max()
              .item<double>();
      const double atens =
          ((aten.to(torch::kDouble) - exact).abs() / size).max().item<double>();
      EXPECT_LT(ours, 1e-5) << what << " (ATen's: " << atens << ")";
    }
  }
  // A view its 8-wide path does not take: no sums, the caller sums.
  const auto odd = operand(130, 258, torch::kBFloat16, false);
  EXPECT_FALSE(lamp::nn::detail::fp8_cast_tensorwise_cuda(
                   odd, torch::kFloat8_e5m2, true, true, true)
                   .column_sums.defined());
}

// Delayed scaling's update in one kernel: the reference ops' histories and
// scales bit for bit, for both amax rules, margins, history lengths up to
// the kernel's largest, and amaxes that are zero, inf or NaN.
TEST(Fp8CastGpu, DelayedUpdateIsTheReferenceBitForBit) {
  LAMP_SKIP_WITHOUT_CUDA();
  using lamp::nn::detail::Fp8DelayedState;
  const torch::Device cuda(torch::kCUDA);
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t len : {1, 4, 33, 1024}) {
    for (const auto rule :
         {lamp::Fp8AmaxCompute::kMax, lamp::Fp8AmaxCompute::kMostRecent}) {
      for (const int64_t margin : {0, 3, 200}) {
        torch::manual_seed(len + margin);
        auto history = torch::rand({3, len}) * 10;
        history[0][0] = 0.0f; // input: nothing recorded (scale kept)
        history[1][len - 1] = inf; // weight: an inf in the history
        if (len > 2) {
          history[2][1] = std::numeric_limits<float>::quiet_NaN();
        }
        const auto scale = torch::rand({3}) + 0.5;
        const auto recipe = lamp::Fp8Recipe()
                                .scaling(lamp::Fp8Scaling::kDelayed)
                                .amax_history_len(len)
                                .amax_compute(rule)
                                .margin(margin);
        const Fp8DelayedState reference{history.to(cuda), scale.to(cuda)};
        const Fp8DelayedState fused{history.to(cuda), scale.to(cuda)};
        ASSERT_TRUE(lamp::nn::detail::fp8_update_cuda_applies(fused));
        lamp::nn::detail::fp8_update_delayed_reference(reference, recipe);
        lamp::nn::detail::fp8_update_delayed_cuda(fused, recipe);
        const auto bits = [](const torch::Tensor& t) {
          return t.cpu().view(torch::kInt32);
        };
        const auto what = "len " + std::to_string(len) + " margin " +
            std::to_string(margin) +
            (rule == lamp::Fp8AmaxCompute::kMax ? " max" : " most recent");
        EXPECT_TRUE(torch::equal(bits(fused.history), bits(reference.history)))
            << what;
        EXPECT_TRUE(torch::equal(bits(fused.scale), bits(reference.scale)))
            << what << "\nfused " << fused.scale.cpu() << "\nreference "
            << reference.scale.cpu();
      }
    }
  }
  // A history past the kernel's length is left to the reference ops.
  EXPECT_FALSE(lamp::nn::detail::fp8_update_cuda_applies(
      {torch::zeros({3, 1025}, torch::dtype(torch::kFloat).device(cuda)),
       torch::ones({3}, torch::dtype(torch::kFloat).device(cuda))}));
}

#else

TEST(Fp8CastGpu, NotBuilt) {
  GTEST_SKIP() << "lamp was built without CUDA: no FP8 cast kernels";
}

#endif

} // namespace

} // namespace fp8_cast_test
