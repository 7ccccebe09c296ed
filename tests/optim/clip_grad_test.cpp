#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "optim/fused_clip_grad.h"
#include "support.h"

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "amp_trainer.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace clip_grad_test {

namespace {

using lamp::test::expect_error;

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- Cases shared with tests/clip_grad_oracle.py -----------------------------

struct ParamSpec {
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
  bool has_grad;
};

// The oracle's LAYOUTS.
const std::map<std::string, std::vector<ParamSpec>>& layouts() {
  using c10::kBFloat16, c10::kDouble, c10::kFloat, c10::kHalf;
  static const std::map<std::string, std::vector<ParamSpec>> layouts = {
      {"f32",
       {{{16, 8}, kFloat, true},
        {{16}, kFloat, true},
        {{60, 50}, kFloat, true},
        {{4}, kFloat, true}}},
      {"mixed",
       {{{16, 8}, kFloat, true},
        {{16}, kDouble, true},
        {{4, 16}, kBFloat16, true},
        {{3}, kFloat, false},
        {{60, 50}, kFloat, true},
        {{7, 5}, kBFloat16, true},
        {{2, 3}, kDouble, true},
        {{9}, kDouble, false}}},
      {"lowp",
       {{{16, 8}, kFloat, true},
        {{4, 16}, kBFloat16, true},
        {{60, 50}, kFloat, true},
        {{7, 5}, kBFloat16, true},
        {{7}, kHalf, true},
        {{5}, kHalf, true}}},
      {"nograd",
       {{{16, 8}, kFloat, false},
        {{16}, kFloat, true},
        {{60, 50}, kFloat, false},
        {{4}, kFloat, true}}},
      {"allnograd", {{{16, 8}, kFloat, false}, {{4}, kFloat, false}}},
      {"empty", {}},
  };
  return layouts;
}

// The oracle's make_params: "f32+inf" writes inf into one gradient.
std::vector<torch::Tensor> make_params(const std::string& layout) {
  const auto plus = layout.find('+');
  const auto base = layout.substr(0, plus);
  torch::manual_seed(1234);
  std::vector<torch::Tensor> params;
  for (const auto& [shape, dtype, has_grad] : layouts().at(base)) {
    auto p = torch::randn(shape).to(dtype).requires_grad_();
    if (has_grad) {
      p.mutable_grad() = (torch::randn(shape) * 0.3).to(dtype);
    }
    params.push_back(p);
  }
  if (plus != std::string::npos) {
    const std::map<std::string, double> inject = {
        {"inf", kInf}, {"nan", NAN}, {"neginf", -kInf}};
    params[1].grad().view({-1})[0].fill_(inject.at(layout.substr(plus + 1)));
  }
  return params;
}

// OP:NORM_TYPE:FOREACH:MAX:LAYOUT:ERROR_IF_NONFINITE, as the oracle reads it.
struct Case {
  std::string op;
  double norm_type = 2.0;
  std::optional<bool> foreach;
  double limit = 0.0;
  std::string layout;
  bool error_if_nonfinite = false;
};

Case parse_case(const std::string& spec) {
  std::vector<std::string> f;
  std::stringstream in(spec);
  for (std::string field; std::getline(in, field, ':');) {
    f.push_back(field);
  }
  EXPECT_EQ(f.size(), 6u) << spec;
  Case c;
  c.op = f[0];
  c.norm_type = std::strtod(f[1].c_str(), nullptr);
  if (f[2] != "none") {
    c.foreach = f[2] == "true";
  }
  c.limit = std::strtod(f[3].c_str(), nullptr);
  c.layout = f[4];
  c.error_if_nonfinite = f[5] == "1";
  return c;
}

// What one case printed (Python) or computed (C++).
struct Result {
  std::string error; // empty: none
  bool has_norm = false;
  double norm = 0.0;
  std::string norm_dtype;
  // Per parameter: its gradient after clipping, nullopt without one.
  std::vector<std::optional<std::vector<double>>> grads;
};

std::vector<double> values(const torch::Tensor& t) {
  auto flat = t.detach().cpu().to(torch::kDouble).contiguous().view({-1});
  return {flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel()};
}

// Python's str(dtype) without "torch.".
std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "float32";
    case c10::kDouble:
      return "float64";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

Result run_cpp(const Case& c) {
  auto params = make_params(c.layout);
  Result result;
  try {
    torch::Tensor norm;
    if (c.op == "norm") {
      norm = lamp::clip_grad_norm_(
          params, c.limit, c.norm_type, c.error_if_nonfinite, c.foreach);
    } else if (c.op == "split") {
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) {
        if (p.grad().defined()) {
          grads.push_back(p.grad());
        }
      }
      norm = lamp::get_total_norm(
          grads, c.norm_type, c.error_if_nonfinite, c.foreach);
      lamp::clip_grads_with_norm_(params, c.limit, norm, c.foreach);
    } else {
      EXPECT_EQ(c.op, "value");
      lamp::clip_grad_value_(params, c.limit, c.foreach);
    }
    if (norm.defined()) {
      EXPECT_EQ(norm.dim(), 0);
      EXPECT_FALSE(norm.requires_grad());
      result.has_norm = true;
      result.norm = norm.item<double>();
      result.norm_dtype = dtype_name(norm.scalar_type());
    }
  } catch (const c10::Error& e) {
    result.error = e.what_without_backtrace();
    return result;
  }
  for (const auto& p : params) {
    result.grads.push_back(
        p.grad().defined() ? std::optional(values(p.grad())) : std::nullopt);
  }
  return result;
}

std::vector<Result> parse_python(const std::string& out) {
  std::vector<Result> results;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string tag;
    words >> tag;
    if (tag == "case") {
      results.emplace_back();
    } else if (tag == "error") {
      results.back().error = line.substr(6);
    } else if (tag == "norm") {
      std::string hex;
      words >> hex >> results.back().norm_dtype;
      results.back().has_norm = true;
      results.back().norm = std::strtod(hex.c_str(), nullptr);
    } else if (tag == "grad") {
      int k = 0;
      words >> k;
      std::vector<double> grad;
      std::string hex;
      bool none = false;
      while (words >> hex) {
        none = hex == "none";
        grad.push_back(std::strtod(hex.c_str(), nullptr));
      }
      results.back().grads.push_back(none ? std::nullopt : std::optional(grad));
    }
  }
  return results;
}

// The same bits, or both NaN (Python prints every NaN as "nan").
bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) ||
      std::memcmp(&a, &b, sizeof(double)) == 0;
}

void expect_same_result(const Result& cpp, const Result& python) {
  EXPECT_EQ(cpp.error, python.error);
  EXPECT_EQ(cpp.has_norm, python.has_norm);
  if (cpp.has_norm && python.has_norm) {
    EXPECT_TRUE(same(cpp.norm, python.norm))
        << "norm: C++ " << cpp.norm << ", Python " << python.norm;
    EXPECT_EQ(cpp.norm_dtype, python.norm_dtype);
  }
  ASSERT_EQ(cpp.grads.size(), python.grads.size());
  for (size_t k = 0; k < cpp.grads.size(); ++k) {
    ASSERT_EQ(cpp.grads[k].has_value(), python.grads[k].has_value()) << k;
    if (!cpp.grads[k]) {
      continue;
    }
    const auto& a = *cpp.grads[k];
    const auto& b = *python.grads[k];
    ASSERT_EQ(a.size(), b.size()) << "grad " << k;
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same(a[i], b[i]) && differ++ == 0) {
        first = i;
      }
    }
    EXPECT_EQ(differ, 0u) << "grad " << k << " differs in " << differ
                          << " elements, first [" << first << "]: C++ "
                          << a[first] << ", Python " << b[first];
  }
}

// Runs `cases` through the oracle (one Python run) and in C++; expects the
// same bits.
void expect_cases_match_python(const std::vector<std::string>& cases) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  std::string args = "cases";
  for (const auto& c : cases) {
    args += " " + c;
  }
  const auto python = parse_python(
      lamp::test::run_python_oracle("optim/clip_grad_oracle.py", args));
  ASSERT_EQ(python.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i]);
    expect_same_result(run_cpp(parse_case(cases[i])), python[i]);
  }
}

TEST(ClipGradOracle, NormTypesAndForeachModes) {
  // Every norm type and foreach mode on fp32, clipping and not. The norm
  // of order 0 counts the ~3200 nonzeros: 1e9 does not clip it either.
  // NOTE: max norms that are not powers of two (0.7, 0.3): only those tell
  // Python's reciprocal() * max_norm from max_norm / x.
  std::vector<std::string> cases;
  for (const char* norm : {"1", "2", "inf", "0", "3"}) {
    for (const char* foreach : {"none", "true", "false"}) {
      for (const char* max : {"1e9", "0.7"}) {
        cases.push_back(
            std::string("norm:") + norm + ":" + foreach + ":" + max + ":f32:0");
      }
    }
  }
  for (const char* norm : {"0.5", "1.5", "-inf", "1e-05"}) {
    cases.push_back(std::string("norm:") + norm + ":none:0.7:f32:0");
  }
  cases.insert(
      cases.end(),
      {"norm:2:none:0.3:f32:0",
       "split:inf:true:0.7:f32:0",
       "split:3:false:0.3:f32:0"});
  expect_cases_match_python(cases);
}

TEST(ClipGradOracle, SeveralDtypesGroupedAsPythonGroupsThem) {
  // fp32, fp64 and bf16 ("mixed"); fp32, bf16 and fp16 ("lowp"), where the
  // order of the groups decides the last bit of the 2- and 0.5-norms:
  // first-seen order fails those cases.
  std::vector<std::string> cases;
  for (const char* layout : {"mixed", "lowp"}) {
    for (const char* norm : {"1", "2", "inf", "0.5", "3"}) {
      for (const char* foreach : {"none", "false"}) {
        cases.push_back(
            std::string("norm:") + norm + ":" + foreach + ":0.7:" + layout +
            ":0");
      }
    }
  }
  cases.insert(
      cases.end(),
      {"norm:2:none:1e9:mixed:0",
       "norm:2:true:0.3:mixed:0",
       "split:2:none:0.7:mixed:0",
       "split:1:false:0.7:lowp:0"});
  expect_cases_match_python(cases);
}

TEST(ClipGradOracle, ParametersWithoutGradsAndEmptyLists) {
  expect_cases_match_python(
      {"norm:2:none:0.7:nograd:0",
       "norm:2:false:0.7:nograd:0",
       "split:2:none:0.7:nograd:0",
       "norm:2:none:0.7:allnograd:0",
       "norm:2:none:0.7:empty:0",
       "split:2:none:0.7:empty:0",
       "value:2:none:0.1:nograd:0"});
}

TEST(ClipGradOracle, ClipGradValue) {
  expect_cases_match_python(
      {"value:2:none:0.1:f32:0",
       "value:2:true:0.1:f32:0",
       "value:2:false:0.1:f32:0",
       "value:2:none:10:f32:0",
       "value:2:none:0.05:mixed:0",
       "value:2:false:0.05:mixed:0",
       "value:2:true:0.05:lowp:0",
       "value:2:none:0.1:f32+inf:0",
       "value:2:none:0.1:f32+nan:0"});
}

TEST(ClipGradOracle, OverflowGivesInfNormAndNanGrads) {
  expect_cases_match_python(
      {"norm:2:none:1:f32+inf:0",
       "norm:2:false:1:f32+inf:0",
       "norm:1:none:1:f32+inf:0",
       "norm:inf:none:1:f32+neginf:0",
       "norm:0:none:1:f32+inf:0",
       "norm:2:none:1:f32+nan:0",
       "norm:inf:true:1:f32+nan:0",
       "norm:2:none:1:mixed+inf:0",
       "split:2:none:1:lowp+inf:0"});
}

TEST(ClipGradOracle, ErrorIfNonfiniteRaisesPythonsError) {
  // Python's message, with Python's repr() of the order.
  expect_cases_match_python(
      {"norm:2:none:1:f32:1",
       "norm:2:none:1:f32+inf:1",
       "norm:2:false:1:f32+nan:1",
       "norm:inf:none:1:f32+neginf:1",
       "norm:0.7:none:1:f32+inf:1",
       "norm:3:none:1:f32+inf:1",
       "norm:1e-05:none:1:f32+inf:1",
       "norm:1e16:none:1:f32+inf:1",
       "norm:-inf:none:1:f32+inf:1", // smallest magnitude: finite
       "split:1:none:1:mixed+nan:1"});
}

// --- The mixed-precision recipe against Python's ---------------------------

// The oracle's AMP_INJECT and AMP_MAX_NORM.
const std::map<int, double> kAmpInject =
    {{3, kInf}, {4, NAN}, {17, kInf}, {18, -kInf}, {40, NAN}};
constexpr double kAmpMaxNorm = 0.4;

// Python's a == b within `rtol` (0: bit for bit); NaN equals NaN.
bool close(double a, double b, double rtol) {
  if (rtol == 0 || !std::isfinite(a) || !std::isfinite(b)) {
    return same(a, b) || a == b;
  }
  return std::abs(a - b) <= rtol * std::max(1.0, std::abs(b));
}

// The oracle's AMP recipe (unscale_, clip_grad_norm_, step, update) in C++,
// or with GradScaler::clip_grad_norm_and_step (`in_step`), against Python's:
// the scales and skips exactly, norms and parameters within `rtol`.
void expect_amp_recipe_matches_python(bool in_step, double rtol) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  constexpr int kSteps = 100;
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (auto [shape, k] : std::vector<std::pair<std::vector<int64_t>, double>>{
           {{16, 8}, 0.25}, {{16}, 0.1}, {{4, 16}, 0.25}, {{4}, 0.1}}) {
    params.push_back((torch::randn(shape) * k).requires_grad_());
  }
  lamp::optim::FusedAdam optimizer(params, torch::optim::AdamOptions(1e-2));
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(1024.0).growth_interval(7));
  std::vector<std::vector<double>> steps; // scale, found_inf, norm
  for (int i = 0; i < kSteps; ++i) {
    auto x = torch::randn({32, 8});
    auto target = torch::randn({32, 4});
    optimizer.zero_grad();
    auto out = torch::linear(
        torch::relu(torch::linear(x, params[0], params[1])),
        params[2],
        params[3]);
    scaler.scale(torch::mse_loss(out, target)).backward();
    if (kAmpInject.count(i)) {
      params[i % 4].grad().view({-1})[0].fill_(kAmpInject.at(i));
    }
    torch::Tensor norm;
    if (in_step) {
      norm = scaler.clip_grad_norm_and_step(optimizer, kAmpMaxNorm);
    } else {
      scaler.unscale_(optimizer);
      norm = lamp::clip_grad_norm_(params, kAmpMaxNorm);
      scaler.step(optimizer);
    }
    scaler.update();
    steps.push_back(
        {scaler.get_scale(),
         scaler.get_found_inf_async().item<double>() != 0 ? 1.0 : 0.0,
         norm.item<double>()});
  }

  const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
      "optim/clip_grad_oracle.py", "amp " + std::to_string(kSteps)));
  size_t step = 0, param = 0, clipped = 0, skipped = 0;
  for (const auto& f : lines) {
    if (f[0] == "step") {
      ASSERT_LT(step, steps.size());
      const auto& s = steps[step];
      EXPECT_EQ(s[0], std::strtod(f[2].c_str(), nullptr)) << "scale " << step;
      EXPECT_EQ(s[1], std::stod(f[3])) << "skip of step " << step;
      EXPECT_TRUE(close(s[2], std::strtod(f[4].c_str(), nullptr), rtol))
          << "norm of step " << step << ": C++ " << s[2] << ", Python " << f[4];
      clipped += s[2] > kAmpMaxNorm && std::isfinite(s[2]);
      skipped += s[1] != 0;
      ++step;
    } else if (f[0] == "param") {
      ASSERT_LT(param, params.size());
      const auto got = values(params[param]);
      ASSERT_EQ(got.size(), f.size() - 2);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(close(got[i], std::strtod(f[i + 2].c_str(), nullptr), rtol))
            << "param " << param << "[" << i << "]: C++ " << got[i]
            << ", Python " << f[i + 2];
      }
      ++param;
    }
  }
  EXPECT_EQ(step, steps.size());
  EXPECT_EQ(param, params.size());
  EXPECT_EQ(skipped, kAmpInject.size()) << "each injected step was skipped";
  EXPECT_GT(clipped, 10u) << "the recipe should clip some steps";
  EXPECT_LT(clipped, kSteps - skipped - 10) << "and leave others";
  for (const auto& p : params) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(ClipGradAmp, GradScalerFusedAdamRecipeMatchesPython) {
  expect_amp_recipe_matches_python(/*in_step=*/false, /*rtol=*/0);
}

// The clip's coefficient applied by the step's kernel as a divisor: the
// same recipe within fp32 rounding, over 100 steps.
TEST(ClipGradAmp, ClipInTheStepMatchesPythonWithinRounding) {
  expect_amp_recipe_matches_python(/*in_step=*/true, /*rtol=*/1e-5);
}

// FusedOptimizer::clip_grad_norm_and_step against lamp::clip_grad_norm_ and
// step (Python's, bit for bit on the CPU), for each fused optimizer, two
// param groups, a weight listed twice (counted and stepped once), a
// parameter without a gradient; clipping (within rounding) and not (the
// divisor is 1: bit for bit). After the step the gradients hold what the
// step used: clipped. Each step from the same gradients (given, not
// computed), so that the two runs differ by the steps' rounding alone.
// `scaler`: through an enabled GradScaler (the gradients scaled by its 1024,
// unscale_, clip, step against clip_grad_norm_and_step).
void expect_clip_in_step_equals_clip_then_step(
    torch::Device device,
    torch::Dtype dtype,
    bool scaler) {
  using torch::optim::OptimizerParamGroup;
  auto make = [](int which,
                 const std::vector<torch::Tensor>& a,
                 const std::vector<torch::Tensor>& b)
      -> std::unique_ptr<lamp::optim::FusedOptimizer> {
    std::vector<OptimizerParamGroup> groups{
        OptimizerParamGroup(a), OptimizerParamGroup(b)};
    if (which == 0) {
      return std::make_unique<lamp::optim::FusedAdamW>(
          groups, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    }
    if (which == 1) {
      return std::make_unique<lamp::optim::FusedAdam>(
          groups, torch::optim::AdamOptions(1e-2).weight_decay(0.1));
    }
    return std::make_unique<lamp::optim::FusedSGD>(
        groups, torch::optim::SGDOptions(1e-2).momentum(0.9));
  };
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  // bf16 parameters: the update is rounded to 8 bits.
  const double rtol = dtype == torch::kBFloat16 ? 1e-2 : 1e-6;
  const double atol = dtype == torch::kBFloat16 ? 1e-3 : 1e-7;
  for (int which = 0; which < 3; ++which) {
    for (const double max_norm : {0.3, 1e6}) {
      SCOPED_TRACE(
          "optimizer " + std::to_string(which) + ", max_norm " +
          std::to_string(max_norm) + ", " + c10::toString(dtype) + " on " +
          device.str() + (scaler ? ", GradScaler" : ""));
      // Two identical sets: clipped then stepped, and clipped in the step.
      std::vector<std::vector<torch::Tensor>> sets;
      for (int k = 0; k < 2; ++k) {
        torch::manual_seed(1);
        std::vector<torch::Tensor> ps;
        for (const auto& shape :
             std::vector<std::vector<int64_t>>{{8, 4}, {4}, {3, 3}, {5}}) {
          ps.push_back(torch::randn(shape).to(options).requires_grad_());
        }
        sets.push_back(ps);
      }
      std::vector<std::unique_ptr<lamp::optim::FusedOptimizer>> opts;
      std::vector<std::unique_ptr<lamp::GradScaler>> scalers;
      for (auto& ps : sets) {
        // ps[0] twice in the first group; ps[3] never gets a gradient.
        opts.push_back(make(which, {ps[0], ps[1], ps[0]}, {ps[2], ps[3]}));
        scalers.push_back(std::make_unique<lamp::GradScaler>(
            lamp::GradScalerOptions().enabled(scaler).init_scale(1024)));
        (void)scalers.back()->scale(torch::zeros({}, options)); // its scale
      }
      const double scale = scaler ? 1024 : 1;
      for (int step = 0; step < 3; ++step) {
        torch::manual_seed(10 + step);
        const auto g = std::vector<torch::Tensor>{
            torch::randn({8, 4}), torch::randn({4}), torch::randn({3, 3})};
        for (auto& ps : sets) {
          for (size_t i = 0; i < g.size(); ++i) {
            ps[i].mutable_grad() = (g[i] * scale).to(options);
          }
        }
        scalers[0]->unscale_(*opts[0]);
        const auto expected = lamp::clip_grad_norm_(
            {sets[0][0], sets[0][1], sets[0][2]}, max_norm);
        scalers[0]->step(*opts[0]);
        scalers[0]->update();
        const auto norm =
            scalers[1]->clip_grad_norm_and_step(*opts[1], max_norm);
        scalers[1]->update();
        EXPECT_EQ(norm.device(), expected.device());
        if (device.is_cpu()) {
          EXPECT_TRUE(torch::equal(norm, expected)) << "the same gradients";
        } else {
          EXPECT_TRUE(torch::allclose(norm, expected, 1e-5, 0))
              << "lamp's kernels, Python's ops: " << norm.item<double>()
              << " vs " << expected.item<double>();
        }
        for (size_t i = 0; i < 4; ++i) {
          const auto& a = sets[0][i];
          const auto& b = sets[1][i];
          if (max_norm > 1e3 && device.is_cpu()) {
            EXPECT_TRUE(torch::equal(a, b)) << "param " << i;
          } else {
            EXPECT_TRUE(torch::allclose(a, b, rtol, atol)) << "param " << i;
          }
          EXPECT_EQ(a.grad().defined(), b.grad().defined()) << i;
          if (a.grad().defined()) {
            EXPECT_TRUE(torch::allclose(a.grad(), b.grad(), rtol, atol))
                << "grad " << i;
          }
        }
      }
      EXPECT_TRUE(torch::equal(sets[1][3], sets[0][3])) << "no gradient";
    }
  }
}

TEST(ClipGrad, ClipInTheStepEqualsClipThenStep) {
  expect_clip_in_step_equals_clip_then_step(
      torch::kCPU, torch::kFloat, /*scaler=*/false);
  expect_clip_in_step_equals_clip_then_step(
      torch::kCPU, torch::kFloat, /*scaler=*/true);
}

// As step(): once between update()s, and after it the next iteration.
TEST(ClipGrad, ClipInTheStepTwiceBeforeUpdateIsAnError) {
  auto p = torch::ones({3}).requires_grad_();
  lamp::optim::FusedAdamW optimizer({p}, torch::optim::AdamWOptions(0.1));
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(2.0));
  scaler.scale(p.sum()).backward();
  (void)scaler.clip_grad_norm_and_step(optimizer, 1.0);
  expect_error(
      [&] { (void)scaler.clip_grad_norm_and_step(optimizer, 1.0); },
      "step() has already been called since the last update()");
  expect_error(
      [&] { scaler.step(optimizer); },
      "step() has already been called since the last update()");
  scaler.update();
  optimizer.zero_grad();
  scaler.scale(p.sum()).backward();
  EXPECT_NO_THROW((void)scaler.clip_grad_norm_and_step(optimizer, 1.0));
}

TEST(ClipGrad, ClipInTheStepWithoutGradientsStillSteps) {
  auto p = torch::ones({3}).requires_grad_();
  lamp::optim::FusedAdamW optimizer({p}, torch::optim::AdamWOptions(0.1));
  const auto norm = optimizer.clip_grad_norm_and_step(1.0);
  EXPECT_EQ(norm.item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(p, torch::ones({3})));
  // A disabled scaler clips and steps.
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(false));
  p.mutable_grad() = torch::full({3}, 4.0);
  lamp::optim::FusedAdamW twin_optimizer({p}, torch::optim::AdamWOptions(0.1));
  const auto clipped = scaler.clip_grad_norm_and_step(twin_optimizer, 1.0);
  EXPECT_NEAR(clipped.item<double>(), std::sqrt(48.0), 1e-5);
  EXPECT_TRUE(
      torch::allclose(p.grad(), torch::full({3}, 4.0 / std::sqrt(48.0))));
  EXPECT_FALSE(torch::equal(p, torch::ones({3}))) << "it stepped";
}

// --- Behaviour --------------------------------------------------------------

TEST(ClipGrad, ValueWithoutGradientsIsANoOpWherePythonThrows) {
  auto params = make_params("allnograd");
  EXPECT_NO_THROW(lamp::clip_grad_value_(params, 0.1));
  EXPECT_NO_THROW(
      lamp::clip_grad_value_(std::vector<torch::Tensor>{}, 0.1, true));
  for (const auto& p : params) {
    EXPECT_FALSE(p.grad().defined());
  }
  if (lamp::test::have_python_oracle()) {
    // The departure is deliberate: Python's grouping rejects an empty list.
    const auto python = parse_python(lamp::test::run_python_oracle(
        "optim/clip_grad_oracle.py", "cases value:2:none:0.1:allnograd:0"));
    ASSERT_EQ(python.size(), 1u);
    EXPECT_NE(
        python[0].error.find("nested_tensorlist[0].empty()"), std::string::npos)
        << python[0].error;
  }
}

TEST(ClipGrad, SingleTensorOverloadsMatchTheListOnes) {
  for (const char* op : {"norm", "value", "split"}) {
    auto one = make_params("f32");
    auto list = make_params("f32");
    if (std::string(op) == "norm") {
      const auto a = lamp::clip_grad_norm_(one[2], 0.5, 3.0);
      const auto b =
          lamp::clip_grad_norm_(std::vector<torch::Tensor>{list[2]}, 0.5, 3.0);
      EXPECT_TRUE(torch::equal(a, b));
    } else if (std::string(op) == "value") {
      lamp::clip_grad_value_(one[2], 0.1);
      lamp::clip_grad_value_(std::vector<torch::Tensor>{list[2]}, 0.1);
    } else {
      const auto a = lamp::get_total_norm(one[2].grad(), 1.0);
      const auto b =
          lamp::get_total_norm(std::vector<torch::Tensor>{list[2].grad()}, 1.0);
      EXPECT_TRUE(torch::equal(a, b));
      lamp::clip_grads_with_norm_(one[2], 1.0, a);
      lamp::clip_grads_with_norm_(std::vector<torch::Tensor>{list[2]}, 1.0, b);
    }
    for (size_t k = 0; k < one.size(); ++k) {
      EXPECT_TRUE(torch::equal(one[k].grad(), list[k].grad())) << op << k;
    }
  }
}

TEST(ClipGrad, ClipsInPlaceWithoutAutogradEvenForGradsThatRequireGrad) {
  auto params = make_params("f32");
  // A gradient kept from a create_graph backward requires grad itself.
  params[0].grad().requires_grad_();
  const auto before = params[0].grad();
  const auto expected = before.detach().clone();
  torch::Tensor norm;
  ASSERT_NO_THROW(norm = lamp::clip_grad_norm_(params, 0.5));
  ASSERT_GT(norm.item<double>(), 0.5);
  EXPECT_FALSE(norm.requires_grad());
  EXPECT_TRUE(before.is_same(params[0].grad())) << "same tensor, in place";
  EXPECT_FALSE(torch::equal(before, expected)) << "and clipped";
  EXPECT_TRUE(
      torch::allclose(before, expected * (0.5 / (norm + 1e-6)), 1e-6, 0.0));
}

TEST(ClipGrad, ForeachFollowsPythonsDeviceRules) {
  // Meta tensors have no foreach kernels: Python falls back per tensor when
  // foreach is None and refuses foreach=True with this message.
  auto p = torch::ones({3}, torch::device(torch::kMeta).requires_grad(true));
  p.mutable_grad() = torch::ones({3}, torch::kMeta);
  const auto norm = lamp::clip_grad_norm_(p, 1.0);
  EXPECT_TRUE(norm.is_meta());
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_NO_THROW(lamp::clip_grad_value_(p, 1.0));
  EXPECT_NO_THROW(lamp::clip_grad_norm_(p, 1.0, 2.0, false, false));
  const std::string message =
      "foreach=True was passed, but can't use the foreach API on meta tensors";
  expect_error(
      [&] { lamp::clip_grad_norm_(p, 1.0, 2.0, false, true); }, message);
  expect_error([&] { lamp::clip_grad_value_(p, 1.0, true); }, message);
  expect_error(
      [&] { lamp::clip_grads_with_norm_(p, 1.0, norm, true); }, message);
}

// --- GPU ----------------------------------------------------------------

class ClipGradGpu : public lamp::test::GpuTest {};

#if LAMP_WITH_CUDA

// Sets the CUDA sync debug mode; restores the previous one when destroyed.
class SyncDebugModeGuard {
 public:
  explicit SyncDebugModeGuard(c10::cuda::SyncDebugMode mode)
      : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(mode);
  }
  ~SyncDebugModeGuard() {
    c10::cuda::warning_state().set_sync_debug_mode(previous_);
  }
  SyncDebugModeGuard(const SyncDebugModeGuard&) = delete;
  SyncDebugModeGuard& operator=(const SyncDebugModeGuard&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};

// `params` with their gradients moved to `device` as `dtype`.
std::vector<torch::Tensor> moved(
    const std::vector<torch::Tensor>& params,
    torch::Device device,
    c10::ScalarType dtype) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    auto q = p.detach().to(device, dtype).requires_grad_();
    if (p.grad().defined()) {
      q.mutable_grad() = p.grad().to(device, dtype);
    }
    out.push_back(q);
  }
  return out;
}

void expect_close(
    const torch::Tensor& got,
    const torch::Tensor& expected,
    double rtol,
    const std::string& what) {
  const auto a = got.cpu().to(torch::kDouble);
  const auto b = expected.cpu().to(torch::kDouble);
  const double scale = b.abs().max().item<double>();
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, rtol * scale) << what;
}

TEST_F(ClipGradGpu, MatchesCpuFloat64) {
  const auto cpu = make_params("f32");
  for (const auto dtype : {torch::kFloat, torch::kHalf}) {
    // fp16: the gradients, norms and products are each rounded to 11 bits.
    const double rtol = dtype == torch::kFloat ? 1e-6 : 5e-3;
    for (const double norm_type : {1.0, 2.0, kInf, 0.0, 3.0}) {
      for (const auto foreach : {std::optional<bool>(), std::optional(false)}) {
        const std::string what = std::string(c10::toString(dtype)) +
            " norm_type " + std::to_string(norm_type) + " foreach " +
            (foreach ? "false" : "none");
        auto reference = moved(cpu, torch::kCPU, torch::kDouble);
        auto cuda = moved(cpu, torch::kCUDA, dtype);
        const auto expected =
            lamp::clip_grad_norm_(reference, 0.5, norm_type, false, foreach);
        const auto got =
            lamp::clip_grad_norm_(cuda, 0.5, norm_type, false, foreach);
        EXPECT_TRUE(got.is_cuda()) << what;
        EXPECT_EQ(got.scalar_type(), dtype) << what;
        expect_close(got, expected, rtol, what + ": norm");
        for (size_t k = 0; k < cuda.size(); ++k) {
          expect_close(
              cuda[k].grad(),
              reference[k].grad(),
              rtol,
              what + ": grad " + std::to_string(k));
        }
      }
    }
    auto reference = moved(cpu, torch::kCPU, torch::kDouble);
    auto cuda = moved(cpu, torch::kCUDA, dtype);
    lamp::clip_grad_value_(reference, 0.1);
    lamp::clip_grad_value_(cuda, 0.1);
    for (size_t k = 0; k < cuda.size(); ++k) {
      expect_close(cuda[k].grad(), reference[k].grad(), rtol, "clip value");
    }
  }
}

TEST_F(ClipGradGpu, OverflowGivesInfNormAndNanGrads) {
  auto params = moved(make_params("f32+inf"), torch::kCUDA, torch::kFloat);
  const auto norm = lamp::clip_grad_norm_(params, 1.0);
  EXPECT_TRUE(std::isinf(norm.item<double>()));
  EXPECT_TRUE(torch::isnan(params[1].grad().view({-1})[0]).item<bool>());
  EXPECT_EQ(params[0].grad().abs().sum().item<double>(), 0.0);
}

TEST_F(ClipGradGpu, NeverSynchronisesWithTheHost) {
  auto params = moved(make_params("f32"), torch::kCUDA, torch::kFloat);
  lamp::clip_grad_norm_(params, 0.5); // warm-up: lazy CUDA initialisation
  torch::cuda::synchronize();
  {
    SyncDebugModeGuard guard(c10::cuda::SyncDebugMode::L_ERROR);
    for (const double norm_type : {1.0, 2.0, kInf, 0.0, 3.0}) {
      for (const auto foreach : {std::optional<bool>(), std::optional(false)}) {
        EXPECT_NO_THROW(
            lamp::clip_grad_norm_(params, 0.5, norm_type, false, foreach))
            << norm_type;
      }
    }
    EXPECT_NO_THROW({
      auto norm = lamp::get_total_norm(params[0].grad());
      lamp::clip_grads_with_norm_(params, 0.5, norm);
    });
    EXPECT_NO_THROW(lamp::clip_grad_value_(params, 0.1));
    // The one documented sync: error_if_nonfinite reads a bool.
    expect_error(
        [&] { lamp::clip_grad_norm_(params, 0.5, 2.0, true); },
        "called a synchronizing CUDA operation");
  }
  EXPECT_EQ(
      c10::cuda::warning_state().get_sync_debug_mode(),
      c10::cuda::SyncDebugMode::L_DISABLED);
}

// A small MLP whose hidden layer is large enough for the foreach ops to be
// sliced in capture.
struct MlpImpl : torch::nn::SequentialImpl {
  MlpImpl() {
    push_back(torch::nn::Linear(32, 8192));
    push_back(torch::nn::ReLU());
    push_back(torch::nn::Linear(8192, 10));
  }
};

// How an AMP training step clips: between unscale_ and step, by value or
// by norm, or by norm in the step (GradScaler::clip_grad_norm_and_step).
enum class Clip { kValue, kNorm, kNormInStep };

struct ClippingTrainer : lamp::test::AmpTrainer<MlpImpl> {
  explicit ClippingTrainer(Clip clip) {
    if (clip == Clip::kNormInStep) {
      clip_in_step = 0.5;
      return;
    }
    after_unscale = [this, clip] {
      if (clip == Clip::kValue) {
        lamp::clip_grad_value_(net->parameters(), 1e-3);
      } else {
        norm = lamp::clip_grad_norm_(net->parameters(), 0.5);
      }
    };
  }
};

std::vector<std::vector<torch::Tensor>> clip_batches(int64_t n) {
  torch::manual_seed(11);
  std::vector<std::vector<torch::Tensor>> out;
  for (int64_t i = 0; i < n; ++i) {
    auto x = torch::randn({16, 32}, torch::kCUDA);
    if (i == 5 || i == 6) {
      x.fill_(INFINITY); // two overflowing steps: skipped, scale backs off
    }
    out.push_back(
        {x,
         torch::randint(
             0, 10, {16}, torch::dtype(torch::kLong).device(torch::kCUDA))});
  }
  return out;
}

void expect_graphed_clipping_matches_eager(Clip clip) {
  const bool by_value = clip == Clip::kValue;
  const auto data = clip_batches(12);
  ClippingTrainer eager(clip);
  std::vector<double> eager_scales, eager_norms;
  for (const auto& batch : data) {
    eager.step(batch);
    eager_scales.push_back(eager.scaler.get_scale());
    eager_norms.push_back(by_value ? 0.0 : eager.norm.item<double>());
  }

  ClippingTrainer graphed(clip);
  lamp::GraphedStep step(
      [&](const std::vector<torch::Tensor>& in) { return graphed.step(in); },
      data[0],
      {graphed.optimizer.get()});
  std::vector<double> graphed_scales, graphed_norms;
  for (const auto& batch : data) {
    step(batch);
    graphed_scales.push_back(graphed.scaler.get_scale());
    graphed_norms.push_back(by_value ? 0.0 : graphed.norm.item<double>());
  }
  EXPECT_TRUE(step.is_captured());
  EXPECT_EQ(graphed_scales, eager_scales);
  EXPECT_LT(eager_scales[6], eager_scales[4]) << "the inf steps backed off";
  for (size_t i = 0; i < data.size(); ++i) {
    const double a = eager_norms[i], b = graphed_norms[i];
    EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || std::abs(a - b) <= 1e-5 * a)
        << "norm of step " << i << ": eager " << a << ", graphed " << b;
    if (!by_value && i != 5 && i != 6) {
      EXPECT_TRUE(std::isfinite(a)) << i;
    }
  }
  if (!by_value) {
    EXPECT_GT(*std::max_element(eager_norms.begin(), eager_norms.end()), 0.5)
        << "some steps should be clipped";
  }
  const auto a = eager.state();
  const auto b = graphed.state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::isfinite(a[i]).all().item<bool>()) << i;
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "tensor #" << i;
  }
}

TEST_F(ClipGradGpu, GraphedClipGradNormStepMatchesEager) {
  expect_graphed_clipping_matches_eager(Clip::kNorm);
}

TEST_F(ClipGradGpu, GraphedClipGradValueStepMatchesEager) {
  expect_graphed_clipping_matches_eager(Clip::kValue);
}

TEST_F(ClipGradGpu, GraphedClipInTheStepMatchesEager) {
  expect_graphed_clipping_matches_eager(Clip::kNormInStep);
}

// GradScaler::clip_grad_norm_and_step on CUDA: the norm and the divisor
// from lamp's clip kernels, the unscale's kept sums making the norm one
// kernel; the same training as unscale_, clip_grad_norm_, step within
// rounding, the same scales and skipped steps.
TEST_F(ClipGradGpu, ClipInTheStepEqualsClipThenStep) {
  const auto data = clip_batches(12);
  ClippingTrainer clipped(Clip::kNorm), in_step(Clip::kNormInStep);
  for (size_t i = 0; i < data.size(); ++i) {
    clipped.step(data[i]);
    const auto kept = lamp::detail::clips_from_kept_sums();
    in_step.step(data[i]);
    EXPECT_EQ(lamp::detail::clips_from_kept_sums(), kept + 1)
        << "step " << i << " took the unscale's sums";
    EXPECT_EQ(in_step.scaler.get_scale(), clipped.scaler.get_scale()) << i;
    const double a = clipped.norm.item<double>();
    const double b = in_step.norm.item<double>();
    EXPECT_TRUE(
        (std::isnan(a) && std::isnan(b)) || a == b ||
        std::abs(a - b) <= 1e-5 * a)
        << "norm of step " << i << ": " << a << " vs " << b;
  }
  // NOTE: the parameters are not compared: a rounding-level difference
  // in an update changes the next steps' fp16 forward (autocast), so the
  // two runs drift apart far beyond rounding over 12 steps (seen on an
  // H100: beyond 1e-5 after 12). The norms above, computed from those
  // parameters, agree within 1e-5 at every step; one step from the same
  // state is compared exactly in ClipInTheStepEqualsClipThenStepOnCuda.
  for (const auto& t : in_step.state()) {
    EXPECT_TRUE(torch::isfinite(t).all().item<bool>());
  }
}

TEST_F(ClipGradGpu, ClipInTheStepEqualsClipThenStepOnCuda) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    expect_clip_in_step_equals_clip_then_step(
        torch::kCUDA, dtype, /*scaler=*/false);
  }
  expect_clip_in_step_equals_clip_then_step(
      torch::kCUDA, torch::kFloat, /*scaler=*/true);
}

// Parameters whose gradients are views at odd offsets of one buffer (dense
// but not 16-byte aligned), of several sizes, in `dtypes` by turns.
std::vector<torch::Tensor> odd_params(
    const std::vector<torch::Dtype>& dtypes,
    const std::vector<int64_t>& sizes,
    double magnitude) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto dtype = dtypes[i % dtypes.size()];
    auto buffer = torch::randn({sizes[i] + 3}, torch::kCUDA) * magnitude;
    auto p = torch::zeros({sizes[i]}, torch::kCUDA).to(dtype);
    p.mutable_grad() = buffer.to(dtype).narrow(0, i % 4, sizes[i]);
    params.push_back(p);
  }
  return params;
}

std::vector<torch::Tensor> copied(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    auto q = p.detach().clone();
    q.mutable_grad() = p.grad().clone();
    out.push_back(q);
  }
  return out;
}

// lamp's two kernels (foreach nullopt) against ATen's foreach kernels
// (foreach true: Python's, bit for bit), on the same gradients.
TEST_F(ClipGradGpu, TwoKernelClipEqualsPythonsKernelsWithinRounding) {
  using torch::kBFloat16, torch::kFloat, torch::kHalf;
  struct Case {
    std::vector<torch::Dtype> dtypes;
    double rtol; // of the norm and of each gradient's largest element
  };
  const std::vector<Case> cases{
      {{kFloat}, 2e-6},
      {{kHalf}, 5e-3},
      {{kBFloat16}, 4e-2},
      {{kFloat, kHalf}, 5e-3},
      {{kBFloat16, kFloat, kHalf}, 4e-2}};
  // One tensor of 5 elements, odd sizes, and one of 20 M elements: more
  // than 2,048 blocks of the smallest chunk, so chunks grow.
  const std::vector<int64_t> sizes{5, 1, 4097, 300001, 20000003, 77, 65536};
  for (const auto& c : cases) {
    for (const double max_norm : {1e9, 10.0}) { // not clipped, clipped
      const std::string what = "dtypes " + std::to_string(c.dtypes.size()) +
          " first " + c10::toString(c.dtypes[0]) + " max_norm " +
          std::to_string(max_norm);
      auto ours = odd_params(c.dtypes, sizes, 0.01);
      auto aten = copied(ours);
      const auto norm = lamp::clip_grad_norm_(ours, max_norm);
      const auto expected =
          lamp::clip_grad_norm_(aten, max_norm, 2.0, false, true);
      EXPECT_EQ(norm.scalar_type(), expected.scalar_type()) << what;
      EXPECT_EQ(norm.dim(), 0) << what;
      EXPECT_TRUE(norm.is_cuda()) << what;
      expect_close(norm, expected, c.rtol, what + ": norm");
      for (size_t k = 0; k < ours.size(); ++k) {
        expect_close(
            ours[k].grad(),
            aten[k].grad(),
            c.rtol,
            what + ": grad " + std::to_string(k));
      }
      // Deterministic: the same sums in the same order every time.
      auto again = odd_params(c.dtypes, sizes, 0.01);
      EXPECT_TRUE(torch::equal(lamp::clip_grad_norm_(again, max_norm), norm))
          << what;
      for (size_t k = 0; k < ours.size(); ++k) {
        EXPECT_TRUE(torch::equal(again[k].grad(), ours[k].grad())) << what;
      }
    }
  }
}

TEST_F(ClipGradGpu, TwoKernelClipOfNonFiniteAndEmptyGradients) {
  // NaN anywhere: NaN norm, every gradient NaN (as Python: NaN factor).
  auto params = odd_params({torch::kFloat}, {10, 1000}, 1.0);
  params[1].grad()[7] = NAN;
  const auto norm = lamp::clip_grad_norm_(params, 1.0);
  EXPECT_TRUE(std::isnan(norm.item<float>()));
  EXPECT_TRUE(torch::isnan(params[0].grad()).all().item<bool>());
  // Only empty gradients: norm 0 in their dtype, as Python's.
  auto empty = odd_params({torch::kHalf}, {0, 0}, 1.0);
  auto aten = copied(empty);
  const auto zero = lamp::clip_grad_norm_(empty, 1.0);
  const auto expected = lamp::clip_grad_norm_(aten, 1.0, 2.0, false, true);
  EXPECT_EQ(zero.scalar_type(), expected.scalar_type());
  EXPECT_EQ(zero.item<float>(), 0.f);
  EXPECT_EQ(expected.item<float>(), 0.f);
}

// More gradients than one launch takes (a 24-layer GPT has ~290): lamp's
// kernels still, one launch of each a list of 176, within rounding of
// ATen's and deterministic.
TEST_F(ClipGradGpu, TwoKernelClipOfAnyNumberOfGradients) {
  for (const int64_t count : {176, 177, 600}) {
    const std::string what = std::to_string(count) + " gradients";
    std::vector<int64_t> sizes;
    for (int64_t k = 0; k < count; ++k) {
      sizes.push_back(k % 7 == 0 ? 40000 + k : 33 + k);
    }
    auto ours = odd_params({torch::kFloat, torch::kHalf}, sizes, 0.01);
    auto aten = copied(ours);
    // NOTE: drawn again rather than copied: a copy is aligned otherwise,
    // which moves the blocks' boundaries and so the order of the sums.
    auto again = odd_params({torch::kFloat, torch::kHalf}, sizes, 0.01);
    std::vector<torch::Tensor> grads;
    for (const auto& p : ours) {
      grads.push_back(p.grad());
    }
    const auto norm = lamp::detail::fused_clip_grad_norm_(grads, 0.5);
    ASSERT_TRUE(norm.has_value()) << what;
    const auto expected = lamp::clip_grad_norm_(aten, 0.5, 2.0, false, true);
    expect_close(*norm, expected, 5e-3, what + ": norm");
    for (size_t k = 0; k < ours.size(); ++k) {
      expect_close(
          ours[k].grad(),
          aten[k].grad(),
          5e-3,
          what + ": grad " + std::to_string(k));
    }
    EXPECT_TRUE(torch::equal(lamp::clip_grad_norm_(again, 0.5), *norm)) << what;
    for (size_t k = 0; k < ours.size(); ++k) {
      EXPECT_TRUE(torch::equal(again[k].grad(), ours[k].grad())) << what;
    }
  }
}

#else

TEST_F(ClipGradGpu, NeedsACudaBuild) {
  GTEST_SKIP() << "lamp was built without CUDA";
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace clip_grad_test
