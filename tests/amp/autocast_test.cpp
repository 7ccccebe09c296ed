#include <lamp/autocast.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace autocast_test {

namespace {

using at::autocast::get_autocast_dtype;
using at::autocast::is_autocast_cache_enabled;
using at::autocast::is_autocast_enabled;
using c10::DeviceType;

const char* python_name(c10::ScalarType dtype) {
  return dtype == torch::kHalf ? "float16" : "bfloat16";
}

c10::ScalarType other_low_precision(c10::ScalarType dtype) {
  return dtype == torch::kHalf ? torch::kBFloat16 : torch::kHalf;
}

// The autocast nesting level, read without changing it.
int nesting() {
  at::autocast::increment_nesting();
  return at::autocast::decrement_nesting();
}

// The cases of tests/autocast_oracle.py, written with LibTorch. Returns the
// result dtype of each.
std::map<std::string, c10::ScalarType> run_cases(
    DeviceType device,
    c10::ScalarType lp) {
  torch::manual_seed(0);
  auto opts = torch::TensorOptions().device(device);
  auto r = [&](at::IntArrayRef shape) { return torch::randn(shape, opts); };
  auto a = r({8, 16}), b = r({16, 4}), c = r({8, 4});
  auto w = r({4, 16}), bias = r({4});
  auto a3 = r({2, 8, 16}), b3 = r({2, 16, 4});
  auto img = r({2, 3, 8, 8}), kernel = r({4, 3, 3, 3});
  auto ln_w = r({16}), ln_b = r({16});
  auto bn_mean = r({3}), bn_var = r({3}).abs() + 1, bn_w = r({3}),
       bn_b = r({3});
  auto logits = r({8, 10});
  auto target = torch::arange(8, opts.dtype(torch::kLong)) % 10;
  auto a_lp = r({8, 16}).to(lp);

  const std::vector<std::pair<std::string, std::function<at::Tensor()>>> ops = {
      {"mm", [&] { return torch::mm(a, b); }},
      {"addmm", [&] { return torch::addmm(c, a, b); }},
      {"linear", [&] { return torch::linear(a, w, bias); }},
      {"conv2d", [&] { return torch::conv2d(img, kernel, bias); }},
      {"bmm", [&] { return torch::bmm(a3, b3); }},
      {"matmul", [&] { return torch::matmul(a, b); }},
      {"relu", [&] { return torch::relu(a); }},
      {"softmax", [&] { return torch::softmax(a, -1); }},
      {"log_softmax", [&] { return torch::log_softmax(a, -1); }},
      {"layer_norm", [&] { return torch::layer_norm(a, {16}, ln_w, ln_b); }},
      {"batch_norm",
       [&] {
         return torch::batch_norm(
             img,
             bn_w,
             bn_b,
             bn_mean.clone(),
             bn_var.clone(),
             true,
             0.1,
             1e-5,
             true);
       }},
      {"sum", [&] { return torch::sum(a); }},
      {"mse_loss", [&] { return torch::mse_loss(a, a.flip(0)); }},
      {"cross_entropy",
       [&] { return torch::cross_entropy_loss(logits, target); }},
      {"bce_with_logits",
       [&] {
         return torch::binary_cross_entropy_with_logits(
             a, torch::sigmoid(a.flip(0)));
       }},
      {"exp", [&] { return torch::exp(a); }},
      {"gelu", [&] { return torch::gelu(a); }},
      {"vector_norm", [&] { return torch::linalg_vector_norm(a); }},
      {"cat_mixed",
       [&] {
         return torch::cat({a, a_lp});
       }},
      {"stack_mixed",
       [&] {
         return torch::stack({a, a_lp});
       }},
      {"add_mixed", [&] { return a + a_lp; }},
      {"relu_of_mm", [&] { return torch::relu(torch::mm(a, b)); }},
      {"softmax_of_lowp", [&] { return torch::softmax(a_lp, -1); }},
      {"layer_norm_of_lowp",
       [&] { return torch::layer_norm(a_lp, {16}, ln_w, ln_b); }},
      {"mm_of_lowp", [&] { return torch::mm(a_lp, b); }},
  };

  std::map<std::string, c10::ScalarType> out;
  const auto other = other_low_precision(lp);
  {
    lamp::AutocastGuard autocast(device, lp);
    for (const auto& [name, op] : ops) {
      out[name] = op().scalar_type();
    }
    {
      lamp::AutocastGuard off(device, std::nullopt, false);
      out["nested_disabled"] = torch::mm(a, b).scalar_type();
    }
    out["after_nested_disabled"] = torch::mm(a, b).scalar_type();
    {
      lamp::AutocastGuard inner(device, other);
      out["nested_other_dtype"] = torch::mm(a, b).scalar_type();
    }
    out["after_nested_other_dtype"] = torch::mm(a, b).scalar_type();
  }
  {
    lamp::AutocastGuard outer(device, other);
    lamp::AutocastGuard inner(device);
    out["nested_inherits_dtype"] = torch::mm(a, b).scalar_type();
  }
  out["outside"] = torch::mm(a, b).scalar_type();
  return out;
}

// Compares run_cases against what Python's torch.autocast gives for the same
// device and dtype.
void expect_same_dtypes_as_python(DeviceType device, c10::ScalarType lp) {
  const std::string device_name = device == DeviceType::CUDA ? "cuda" : "cpu";
  const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
      "amp/autocast_oracle.py", device_name + ":" + python_name(lp)));
  std::map<std::string, std::string> python;
  for (const auto& fields : lines) {
    ASSERT_EQ(fields.size(), 4u);
    python[fields[2]] = fields[3];
  }
  const auto cpp = run_cases(device, lp);
  ASSERT_GT(cpp.size(), 25u);
  EXPECT_EQ(cpp.size(), python.size())
      << "the C++ and Python case lists differ";
  for (const auto& [name, dtype] : cpp) {
    ASSERT_TRUE(python.count(name)) << name << " is missing from the oracle";
    EXPECT_EQ(c10::toString(dtype), python[name])
        << device_name << " autocast to " << lp << ", case " << name;
  }
}

struct State {
  bool enabled;
  c10::ScalarType dtype;
  bool cache;
  int nesting;
  bool operator==(const State& o) const {
    return enabled == o.enabled && dtype == o.dtype && cache == o.cache &&
        nesting == o.nesting;
  }
};

State state(DeviceType device) {
  return {
      is_autocast_enabled(device),
      get_autocast_dtype(device),
      is_autocast_cache_enabled(),
      nesting()};
}

class AutocastDtypes : public testing::TestWithParam<c10::ScalarType> {};

TEST_P(AutocastDtypes, MatchesPythonOnCpu) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  expect_same_dtypes_as_python(DeviceType::CPU, GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Cpu,
    AutocastDtypes,
    testing::Values(torch::kBFloat16, torch::kHalf),
    [](const auto& info) { return std::string(python_name(info.param)); });

TEST(Autocast, DefaultDtypesArePythons) {
  {
    lamp::AutocastGuard cpu(DeviceType::CPU);
    EXPECT_EQ(cpu.dtype(), torch::kBFloat16);
    EXPECT_TRUE(cpu.enabled());
    EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), torch::kBFloat16);
  }
  lamp::AutocastGuard cuda(DeviceType::CUDA, std::nullopt, false);
  EXPECT_EQ(cuda.dtype(), torch::kHalf);
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
}

TEST(Autocast, SetsAndRestoresState) {
  const auto before = state(DeviceType::CPU);
  EXPECT_EQ(before, (State{false, torch::kBFloat16, true, 0}));
  {
    lamp::AutocastGuard guard(DeviceType::CPU, torch::kHalf, true, false);
    EXPECT_EQ(state(DeviceType::CPU), (State{true, torch::kHalf, false, 1}));
  }
  EXPECT_EQ(state(DeviceType::CPU), before);
}

TEST(Autocast, NestedGuardsRestoreExactly) {
  lamp::AutocastGuard outer(DeviceType::CPU, torch::kHalf);
  const auto in_outer = state(DeviceType::CPU);
  {
    lamp::AutocastGuard off(DeviceType::CPU, std::nullopt, false);
    EXPECT_EQ(state(DeviceType::CPU), (State{false, torch::kHalf, true, 2}));
    {
      lamp::AutocastGuard bf16(DeviceType::CPU, torch::kBFloat16);
      EXPECT_EQ(
          state(DeviceType::CPU), (State{true, torch::kBFloat16, true, 3}));
    }
    EXPECT_EQ(state(DeviceType::CPU), (State{false, torch::kHalf, true, 2}));
  }
  EXPECT_EQ(state(DeviceType::CPU), in_outer);
}

TEST(Autocast, GuardsOfOtherDevicesAreIndependent) {
  lamp::AutocastGuard cpu(DeviceType::CPU, torch::kHalf);
  {
    lamp::AutocastGuard cuda(DeviceType::CUDA, torch::kBFloat16, false);
    EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), torch::kHalf);
    EXPECT_EQ(get_autocast_dtype(DeviceType::CUDA), torch::kBFloat16);
  }
  EXPECT_EQ(get_autocast_dtype(DeviceType::CUDA), torch::kHalf);
  EXPECT_EQ(nesting(), 1);
}

TEST(Autocast, RestoresStateWhenAnExceptionUnwinds) {
  const auto before = state(DeviceType::CPU);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  torch::Tensor cast;
  try {
    lamp::AutocastGuard guard(DeviceType::CPU, torch::kHalf, true, true);
    cast = at::autocast::cached_cast(torch::kHalf, w, DeviceType::CPU);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(state(DeviceType::CPU), before);
  // The outermost guard's exit cleared the cache: a new region casts again.
  lamp::AutocastGuard again(DeviceType::CPU, torch::kHalf);
  auto recast = at::autocast::cached_cast(torch::kHalf, w, DeviceType::CPU);
  EXPECT_NE(recast.data_ptr(), cast.data_ptr());
}

TEST(Autocast, CastCacheIsClearedOnlyAtTheOutermostExit) {
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto cast = [&] {
    return at::autocast::cached_cast(torch::kBFloat16, w, DeviceType::CPU);
  };
  torch::Tensor first;
  {
    lamp::AutocastGuard outer(DeviceType::CPU);
    first = cast();
    EXPECT_EQ(cast().data_ptr(), first.data_ptr()) << "weight cast not cached";
    {
      lamp::AutocastGuard inner(DeviceType::CPU);
      EXPECT_EQ(cast().data_ptr(), first.data_ptr());
      lamp::AutocastGuard off(DeviceType::CPU, std::nullopt, false);
    }
    // Leaving the inner guards must not clear the cache.
    EXPECT_EQ(cast().data_ptr(), first.data_ptr());
  }
  lamp::AutocastGuard next(DeviceType::CPU);
  EXPECT_NE(cast().data_ptr(), first.data_ptr());
}

TEST(Autocast, CacheFlagIsInheritedWhenNotGiven) {
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto cast = [&] {
    return at::autocast::cached_cast(torch::kBFloat16, w, DeviceType::CPU);
  };
  lamp::AutocastGuard outer(DeviceType::CPU, std::nullopt, true, false);
  EXPECT_NE(cast().data_ptr(), cast().data_ptr()) << "cache should be off";
  lamp::AutocastGuard inner(DeviceType::CPU);
  EXPECT_FALSE(is_autocast_cache_enabled());
  lamp::AutocastGuard cached(DeviceType::CPU, std::nullopt, true, true);
  EXPECT_TRUE(is_autocast_cache_enabled());
}

TEST(Autocast, StateIsThreadLocal) {
  auto a = torch::randn({8, 8});
  lamp::AutocastGuard guard(DeviceType::CPU);
  ASSERT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  c10::ScalarType other_thread_mm = torch::kBFloat16;
  bool other_thread_enabled = true;
  std::thread([&] {
    other_thread_enabled = is_autocast_enabled(DeviceType::CPU);
    other_thread_mm = torch::mm(a, a).scalar_type();
    // A guard here must not reach the main thread.
    lamp::AutocastGuard off(DeviceType::CPU, torch::kHalf, false);
  }).join();
  EXPECT_FALSE(other_thread_enabled);
  EXPECT_EQ(other_thread_mm, torch::kFloat);
  EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

TEST(Autocast, UnsupportedDtypeIsALoudError) {
  const auto before = state(DeviceType::CPU);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong}) {
    for (auto device : {DeviceType::CPU, DeviceType::CUDA}) {
      try {
        lamp::AutocastGuard guard(device, dtype);
        ADD_FAILURE() << "no error for " << device << " " << dtype;
      } catch (const c10::Error& e) {
        const std::string msg = e.what_without_backtrace();
        EXPECT_NE(
            msg.find(c10::DeviceTypeName(device, /*lower_case=*/false)),
            std::string::npos)
            << msg;
        EXPECT_NE(msg.find(c10::toString(dtype)), std::string::npos) << msg;
        EXPECT_NE(msg.find("Half"), std::string::npos) << msg;
        EXPECT_NE(msg.find("BFloat16"), std::string::npos) << msg;
      }
    }
  }
  EXPECT_EQ(state(DeviceType::CPU), before);
  // As in Python, a disabled region does not check the dtype.
  lamp::AutocastGuard fp32(DeviceType::CPU, torch::kFloat, false);
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
}

TEST(Autocast, UnsupportedDeviceTypeIsALoudError) {
  for (auto device : {DeviceType::Meta, DeviceType::Vulkan, DeviceType::FPGA}) {
    try {
      lamp::AutocastGuard guard(device);
      ADD_FAILURE() << "no error for " << device;
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("not available for device type"), std::string::npos)
          << msg;
      EXPECT_NE(
          msg.find(c10::DeviceTypeName(device, /*lower_case=*/false)),
          std::string::npos)
          << msg;
      EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(nesting(), 0);
}

TEST(Autocast, CudaGuardWithoutCudaDisablesItself) {
  if (torch::cuda::is_available()) {
    GTEST_SKIP() << "this machine has CUDA; AutocastGpu tests cover it";
  }
  lamp::AutocastGuard guard(DeviceType::CUDA);
  EXPECT_FALSE(guard.enabled());
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
}

// GPU: label `gpu`; skipped without a CUDA device.
class AutocastGpu : public testing::TestWithParam<c10::ScalarType> {
 protected:
  void SetUp() override {
    LAMP_SKIP_WITHOUT_CUDA();
  }
};

TEST_P(AutocastGpu, MatchesPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  expect_same_dtypes_as_python(DeviceType::CUDA, GetParam());
}

TEST_P(AutocastGpu, TrainingStepRunsInLowPrecisionWithFp32Grads) {
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  model->to(torch::kCUDA);
  auto x = torch::randn({16, 32}, torch::kCUDA);
  auto y = torch::randint(
      10, {16}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  torch::Tensor logits, loss;
  {
    lamp::AutocastGuard guard(torch::kCUDA, GetParam());
    EXPECT_TRUE(guard.enabled());
    logits = model->forward(x);
    loss = torch::cross_entropy_loss(logits, y);
  }
  EXPECT_EQ(logits.scalar_type(), GetParam());
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  loss.backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
    EXPECT_TRUE(p.grad().isfinite().all().item<bool>());
  }
}

TEST_P(AutocastGpu, WeightCastsAreCachedUntilTheOutermostExit) {
  auto w = torch::randn(
      {64, 64}, torch::TensorOptions(torch::kCUDA).requires_grad(true));
  torch::Tensor first;
  {
    lamp::AutocastGuard outer(torch::kCUDA, GetParam());
    first = at::autocast::cached_cast(GetParam(), w, DeviceType::CUDA);
    EXPECT_EQ(first.scalar_type(), GetParam());
    { lamp::AutocastGuard inner(torch::kCUDA, GetParam()); }
    EXPECT_EQ(
        at::autocast::cached_cast(GetParam(), w, DeviceType::CUDA).data_ptr(),
        first.data_ptr());
  }
  lamp::AutocastGuard next(torch::kCUDA, GetParam());
  EXPECT_NE(
      at::autocast::cached_cast(GetParam(), w, DeviceType::CUDA).data_ptr(),
      first.data_ptr());
}

INSTANTIATE_TEST_SUITE_P(
    Cuda,
    AutocastGpu,
    testing::Values(torch::kHalf, torch::kBFloat16),
    [](const auto& info) { return std::string(python_name(info.param)); });

} // namespace

} // namespace autocast_test
