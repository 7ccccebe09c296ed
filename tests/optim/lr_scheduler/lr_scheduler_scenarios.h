#pragma once

// The learning-rate schedules that tests/lr_scheduler_test.cpp and
// tests/lr_scheduler_state_test.cpp compare with Python's: the same
// scenarios as SCENARIOS in tests/lr_scheduler_oracle.py, and one shared run
// of that oracle.

#include <lamp/lr_scheduler.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support.h"

namespace lamp::test::lr {

namespace fs = std::filesystem;
using namespace lamp::optim;
using torch::optim::Optimizer;

inline constexpr int kSteps = 300;
inline constexpr int kSaveAt = 123;
inline const std::vector<double> kLrs = {
    0.1,
    0.01}; // the two param groups' lrs

using Trajectory = std::vector<std::vector<double>>; // [step][value]

// ------------------------------------------------------------ scenarios
// The same schedules as SCENARIOS in lr_scheduler_oracle.py.

template <typename Opt, typename Options>
inline std::unique_ptr<Optimizer> build(Options defaults) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (double lr : kLrs) {
    auto options = std::make_unique<Options>(defaults);
    options->lr(lr);
    groups.emplace_back(
        std::vector<torch::Tensor>{torch::zeros({2}).requires_grad_()},
        std::move(options));
  }
  return std::make_unique<Opt>(groups, defaults);
}

inline std::unique_ptr<Optimizer> make_optimizer(const std::string& kind) {
  using namespace torch::optim;
  if (kind == "sgd") {
    return build<SGD>(SGDOptions(kLrs[0]));
  }
  if (kind == "sgd_momentum") {
    return build<SGD>(SGDOptions(kLrs[0]).momentum(0.9));
  }
  if (kind == "adam") {
    return build<Adam>(AdamOptions(kLrs[0]));
  }
  if (kind == "adamw") {
    return build<AdamW>(AdamWOptions(kLrs[0]));
  }
  if (kind == "rmsprop") {
    return build<RMSprop>(RMSpropOptions(kLrs[0]).momentum(0.5));
  }
  if (kind == "adagrad") {
    return build<Adagrad>(AdagradOptions(kLrs[0]));
  }
  if (kind == "fused_adamw") {
    return build<FusedAdamW>(AdamWOptions(kLrs[0]));
  }
  if (kind == "fused_sgd") {
    return build<FusedSGD>(SGDOptions(kLrs[0]).momentum(0.9));
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

inline double plateau_metric(int i, const std::string& mode) {
  const double value = 1.0 / static_cast<double>(1 + i / 20) +
      0.001 * static_cast<double>((i * 7) % 5);
  return mode == "min" ? value : 1.0 - value;
}

struct Scenario {
  std::unique_ptr<Optimizer> optimizer;
  std::shared_ptr<LRScheduler> scheduler; // destroyed before the optimizer
  std::string momentum; // "", "momentum" or "beta1"
  std::string plateau_mode; // "" unless ReduceLROnPlateau

  void step(int i) {
    if (plateau_mode.empty()) {
      scheduler->step();
    } else {
      static_cast<ReduceLROnPlateau&>(*scheduler)
          .step(plateau_metric(i, plateau_mode));
    }
  }

  // The groups' lrs, then their momentum or beta1 when cycled.
  std::vector<double> values() const {
    std::vector<double> out;
    for (const auto& group : optimizer->param_groups()) {
      out.push_back(group.options().get_lr());
    }
    for (const auto& group : optimizer->param_groups()) {
      const auto* options = &group.options();
      if (momentum == "momentum") {
        out.push_back(
            dynamic_cast<const torch::optim::SGDOptions&>(*options).momentum());
      } else if (momentum == "beta1") {
        if (auto* adam =
                dynamic_cast<const torch::optim::AdamOptions*>(options)) {
          out.push_back(std::get<0>(adam->betas()));
        } else {
          out.push_back(std::get<0>(
              dynamic_cast<const torch::optim::AdamWOptions&>(*options)
                  .betas()));
        }
      }
    }
    return out;
  }

  void set_lrs(const std::vector<double>& values) {
    auto& groups = optimizer->param_groups();
    for (size_t i = 0; i < groups.size(); ++i) {
      groups[i].options().set_lr(values[i]);
    }
  }
};

inline const std::vector<std::string> kScenarios = {
    "lambda_one",
    "lambda_list",
    "multiplicative",
    "step",
    "multistep",
    "exponential",
    "linear",
    "constant",
    "polynomial",
    "cosine",
    "warm_restarts_2",
    "warm_restarts_1",
    "one_cycle_sgd",
    "one_cycle_adam",
    "one_cycle_fused_adamw",
    "one_cycle_fused_sgd",
    "one_cycle_rmsprop",
    "warmup_cosine",
    "sequential_3",
    "chained",
    "plateau_min_rel",
    "plateau_max_abs"};

inline Scenario make_scenario(const std::string& name) {
  Scenario s;
  auto opt = [&](const std::string& kind) -> Optimizer& {
    s.optimizer = make_optimizer(kind);
    return *s.optimizer;
  };
  if (name == "lambda_one") {
    s.scheduler = std::make_shared<LambdaLR>(
        opt("sgd"), [](int64_t e) { return std::pow(0.97, e); });
  } else if (name == "lambda_list") {
    s.scheduler = std::make_shared<LambdaLR>(
        opt("adam"),
        std::vector<LRLambda>{
            [](int64_t e) { return std::pow(0.97, e); },
            [](int64_t e) { return 1.0 / (1.0 + 0.05 * e); }});
  } else if (name == "multiplicative") {
    s.scheduler = std::make_shared<MultiplicativeLR>(
        opt("sgd"), [](int64_t e) { return e % 2 ? 0.99 : 0.995; });
  } else if (name == "step") {
    s.scheduler = std::make_shared<StepLR>(opt("adam"), 30, 0.5);
  } else if (name == "multistep") {
    s.scheduler = std::make_shared<MultiStepLR>(
        opt("sgd"), std::vector<int64_t>{30, 80, 80, 150}, 0.3);
  } else if (name == "exponential") {
    s.scheduler = std::make_shared<ExponentialLR>(opt("rmsprop"), 0.98);
  } else if (name == "linear") {
    s.scheduler = std::make_shared<LinearLR>(opt("adamw"), 0.1, 0.9, 100);
  } else if (name == "constant") {
    s.scheduler = std::make_shared<ConstantLR>(opt("sgd"), 0.25, 40);
  } else if (name == "polynomial") {
    s.scheduler = std::make_shared<PolynomialLR>(opt("adagrad"), 200, 2.0);
  } else if (name == "cosine") {
    s.scheduler = std::make_shared<CosineAnnealingLR>(opt("adamw"), 70, 0.001);
  } else if (name == "warm_restarts_2") {
    s.scheduler =
        std::make_shared<CosineAnnealingWarmRestarts>(opt("sgd"), 10, 2, 1e-4);
  } else if (name == "warm_restarts_1") {
    s.scheduler =
        std::make_shared<CosineAnnealingWarmRestarts>(opt("adam"), 25);
  } else if (name == "one_cycle_sgd") {
    s.momentum = "momentum";
    s.scheduler = std::make_shared<OneCycleLR>(
        opt("sgd_momentum"), OneCycleLROptions({0.5, 0.05}).total_steps(300));
  } else if (name == "one_cycle_adam") {
    s.momentum = "beta1";
    s.scheduler = std::make_shared<OneCycleLR>(
        opt("adam"),
        OneCycleLROptions(0.01)
            .total_steps(320)
            .three_phase(true)
            .anneal_strategy("linear")
            .base_momentum({0.8, 0.85})
            .max_momentum(0.95));
  } else if (name == "one_cycle_fused_adamw") {
    s.momentum = "beta1";
    s.scheduler = std::make_shared<OneCycleLR>(
        opt("fused_adamw"),
        OneCycleLROptions(0.02)
            .epochs(10)
            .steps_per_epoch(31)
            .pct_start(0.25)
            .div_factor(10.0)
            .final_div_factor(100.0));
  } else if (name == "one_cycle_fused_sgd") {
    s.momentum = "momentum";
    s.scheduler = std::make_shared<OneCycleLR>(
        opt("fused_sgd"), OneCycleLROptions(0.3).total_steps(305));
  } else if (name == "one_cycle_rmsprop") {
    s.scheduler = std::make_shared<OneCycleLR>(
        opt("rmsprop"),
        OneCycleLROptions(0.05).total_steps(300).cycle_momentum(false));
  } else if (name == "warmup_cosine") {
    auto& o = opt("adamw");
    auto warmup = std::make_shared<LinearLR>(o, 0.01, 1.0, 50);
    auto cosine = std::make_shared<CosineAnnealingLR>(o, 250, 1e-5);
    s.scheduler = std::make_shared<SequentialLR>(
        o,
        std::vector<std::shared_ptr<LRScheduler>>{warmup, cosine},
        std::vector<int64_t>{50});
  } else if (name == "sequential_3") {
    auto& o = opt("sgd");
    s.scheduler = std::make_shared<SequentialLR>(
        o,
        std::vector<std::shared_ptr<LRScheduler>>{
            std::make_shared<ConstantLR>(o, 0.5, 20),
            std::make_shared<ExponentialLR>(o, 0.99),
            std::make_shared<StepLR>(o, 30, 0.5)},
        std::vector<int64_t>{40, 150});
  } else if (name == "chained") {
    auto& o = opt("sgd");
    s.scheduler = std::make_shared<ChainedScheduler>(
        std::vector<std::shared_ptr<LRScheduler>>{
            std::make_shared<ConstantLR>(o, 0.5, 25),
            std::make_shared<ExponentialLR>(o, 0.99)});
  } else if (name == "plateau_min_rel") {
    s.plateau_mode = "min";
    s.scheduler = std::make_shared<ReduceLROnPlateau>(
        opt("sgd"),
        ReduceLROnPlateauOptions()
            .mode("min")
            .factor(0.8)
            .patience(5)
            .threshold(0.01)
            .threshold_mode("rel")
            .cooldown(3)
            .min_lr({0.001, 0.0005}));
  } else if (name == "plateau_max_abs") {
    s.plateau_mode = "max";
    s.scheduler = std::make_shared<ReduceLROnPlateau>(
        opt("adam"),
        ReduceLROnPlateauOptions()
            .mode("max")
            .factor(0.7)
            .patience(3)
            .threshold(0.05)
            .threshold_mode("abs")
            .min_lr(1e-4)
            .eps(1e-6));
  } else {
    throw std::runtime_error("unknown scenario " + name);
  }
  return s;
}

// Runs `name` uninterrupted: values after construction and each step.
inline Trajectory run_cpp(const std::string& name) {
  auto s = make_scenario(name);
  Trajectory out{s.values()};
  for (int i = 1; i <= kSteps; ++i) {
    s.step(i);
    out.push_back(s.values());
  }
  return out;
}

// --------------------------------------------------------------- helpers

// Python's float.hex().
inline std::string python_hex(double v) {
  if (std::isnan(v)) {
    return "nan";
  }
  if (std::isinf(v)) {
    return v > 0 ? "inf" : "-inf";
  }
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  const char* sign = (bits >> 63) ? "-" : "";
  const unsigned long long mantissa = bits & ((1ULL << 52) - 1);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff);
  char buffer[64];
  if (exponent == 0 && mantissa == 0) {
    std::snprintf(buffer, sizeof(buffer), "%s0x0.0p+0", sign);
  } else if (exponent == 0) {
    std::snprintf(
        buffer, sizeof(buffer), "%s0x0.%013llxp-1022", sign, mantissa);
  } else {
    std::snprintf(
        buffer,
        sizeof(buffer),
        "%s0x1.%013llxp%+d",
        sign,
        mantissa,
        exponent - 1023);
  }
  return buffer;
}

// Type and value of a state dict entry, as sig() in the oracle.
inline std::string sig(const c10::IValue& v) {
  if (v.isBool()) {
    return std::string("bool=") + (v.toBool() ? "True" : "False");
  }
  if (v.isInt()) {
    return "int=" + std::to_string(v.toInt());
  }
  if (v.isDouble()) {
    return "float=" + python_hex(v.toDouble());
  }
  if (v.isString()) {
    return "str=" + v.toStringRef();
  }
  if (v.isNone()) {
    return "None";
  }
  std::string out;
  if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) {
      out += (out.empty() ? "" : ",") +
          (entry.key().isString() ? entry.key().toStringRef()
                                  : std::to_string(entry.key().toInt())) +
          ":" + sig(entry.value());
    }
    return "{" + out + "}";
  }
  if (v.isList()) {
    for (const auto& x : v.toListRef()) {
      out += (out.empty() ? "" : ",") + sig(x);
    }
    return "[" + out + "]";
  }
  return "?" + std::string(v.tagKind());
}

inline void expect_matches(
    const std::vector<double>& cpp,
    const std::vector<double>& py,
    const std::string& what) {
  ASSERT_EQ(cpp.size(), py.size()) << what;
  for (size_t i = 0; i < cpp.size(); ++i) {
    EXPECT_LE(std::abs(cpp[i] - py[i]), 1e-12 * std::abs(py[i]))
        << what << " value " << i << ": C++ " << python_hex(cpp[i])
        << ", Python " << python_hex(py[i]);
  }
}

inline std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A folder for this process's files, removed when its tests end
// (lamp::test::fresh_dir).
inline const fs::path& temp_dir() {
  static const fs::path path = lamp::test::fresh_dir("lr_scheduler_test");
  return path;
}

inline std::string oracle_args(const std::string& mode) {
  return mode + " \"" + temp_dir().string() + "\" " + std::to_string(kSteps) +
      " " + std::to_string(kSaveAt);
}

// Parses "KIND NAME I V..." lines into trajectories.
inline std::map<std::string, Trajectory> parse_values(
    const std::vector<std::vector<std::string>>& lines,
    const std::string& kind) {
  std::map<std::string, Trajectory> out;
  for (const auto& line : lines) {
    if (line[0] != kind) {
      continue;
    }
    std::vector<double> values;
    for (size_t i = 3; i < line.size(); ++i) {
      values.push_back(std::strtod(line[i].c_str(), nullptr));
    }
    out[line[1]].push_back(std::move(values));
  }
  return out;
}

// One run of the oracle for all scenarios (Python starts once).
struct Oracle {
  std::map<std::string, Trajectory> trajectories;
  std::map<std::string, std::string> states;
  std::map<std::string, std::pair<std::string, std::string>> errors;
};

inline const Oracle& oracle() {
  static const Oracle result = [] {
    Oracle o;
    const auto lines = lamp::test::split_lines(lamp::test::run_python_oracle(
        "optim/lr_scheduler/lr_scheduler_oracle.py", oracle_args("run")));
    o.trajectories = parse_values(lines, "traj");
    for (const auto& line : lines) {
      if (line[0] == "state") {
        o.states[line[1]] = line[2];
      } else if (line[0] == "error") {
        std::string message;
        for (size_t i = 3; i < line.size(); ++i) {
          message += (i > 3 ? " " : "") + line[i];
        }
        o.errors[line[1]] = {line[2], message};
      }
    }
    return o;
  }();
  return result;
}

} // namespace lamp::test::lr
