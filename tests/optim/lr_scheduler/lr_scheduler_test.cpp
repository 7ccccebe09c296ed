// lamp's learning-rate schedulers against Python's
// (tests/lr_scheduler_oracle.py): every step's learning rates (and
// OneCycleLR's momentum / beta1), the state dicts, Python's validation
// errors, and initial_lr shared between the schedulers of an optimizer.

#include <lamp/lr_scheduler.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lr_scheduler_scenarios.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace lr_scheduler_test {

using namespace lamp::optim;
using namespace lamp::test::lr;
using lamp::test::expect_error;
using torch::optim::Optimizer;

// NOTE: CTest runs every test in its own process, and each test that reads
// oracle() starts Python once; so the tests against Python loop over all
// scenarios (SCOPED_TRACE names the one that fails) instead of being one
// test per scenario.

TEST(LRSchedulerOracle, EveryStepMatchesPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  for (const auto& name : kScenarios) {
    SCOPED_TRACE(name);
    const auto& python = oracle().trajectories.at(name);
    ASSERT_EQ(python.size(), static_cast<size_t>(kSteps + 1));
    auto s = make_scenario(name);
    expect_matches(s.values(), python[0], "after construction");
    for (int i = 1; i <= kSteps; ++i) {
      s.step(i);
      expect_matches(s.values(), python[i], "step " + std::to_string(i));
      const std::vector<double> lrs(python[i].begin(), python[i].begin() + 2);
      expect_matches(s.scheduler->get_last_lr(), lrs, "get_last_lr");
    }
  }
}

TEST(LRSchedulerOracle, StateDictIsPythons) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  for (const auto& name : kScenarios) {
    SCOPED_TRACE(name);
    auto s = make_scenario(name);
    for (int i = 1; i <= kSaveAt; ++i) {
      s.step(i);
    }
    EXPECT_EQ(sig(s.scheduler->state_dict()), oracle().states.at(name));
  }
}

TEST(LRSchedulerOracle, ConstructorErrorsMatchPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  using Make = std::function<void(Optimizer&)>;
  auto one_cycle = [](Optimizer& o, OneCycleLROptions options) {
    OneCycleLR s(o, std::move(options));
  };
  auto sequential = [](Optimizer& o,
                       std::vector<std::shared_ptr<LRScheduler>> schedulers,
                       std::vector<int64_t> milestones) {
    SequentialLR s(o, std::move(schedulers), std::move(milestones));
  };
  const std::map<std::string, Make> cases = {
      {"constant_factor", [](Optimizer& o) { ConstantLR s(o, 1.5); }},
      {"linear_start", [](Optimizer& o) { LinearLR s(o, 0.0); }},
      {"linear_end", [](Optimizer& o) { LinearLR s(o, 1.0 / 3, 1.5); }},
      {"warm_restarts_T_0",
       [](Optimizer& o) { CosineAnnealingWarmRestarts s(o, 0); }},
      {"warm_restarts_T_mult",
       [](Optimizer& o) { CosineAnnealingWarmRestarts s(o, 5, 0); }},
      {"one_cycle_no_steps",
       [&](Optimizer& o) { one_cycle(o, OneCycleLROptions(0.1)); }},
      {"one_cycle_total_steps",
       [&](Optimizer& o) {
         one_cycle(o, OneCycleLROptions(0.1).total_steps(0));
       }},
      {"one_cycle_epochs",
       [&](Optimizer& o) {
         one_cycle(o, OneCycleLROptions(0.1).epochs(-2).steps_per_epoch(3));
       }},
      {"one_cycle_pct_start",
       [&](Optimizer& o) {
         one_cycle(o, OneCycleLROptions(0.1).total_steps(10).pct_start(1.5));
       }},
      {"one_cycle_anneal",
       [&](Optimizer& o) {
         one_cycle(
             o, OneCycleLROptions(0.1).total_steps(10).anneal_strategy("exp"));
       }},
      {"one_cycle_max_lr",
       [&](Optimizer& o) {
         one_cycle(o, OneCycleLROptions({0.1, 0.2, 0.3}).total_steps(10));
       }},
      {"one_cycle_no_momentum",
       [&](Optimizer&) {
         auto adagrad = make_optimizer("adagrad");
         one_cycle(*adagrad, OneCycleLROptions(0.1).total_steps(10));
       }},
      {"plateau_factor",
       [](Optimizer& o) {
         ReduceLROnPlateau s(o, ReduceLROnPlateauOptions().factor(1.0));
       }},
      {"plateau_mode",
       [](Optimizer& o) {
         ReduceLROnPlateau s(o, ReduceLROnPlateauOptions().mode("foo"));
       }},
      {"plateau_threshold_mode",
       [](Optimizer& o) {
         ReduceLROnPlateau s(o, ReduceLROnPlateauOptions().threshold_mode("x"));
       }},
      {"plateau_min_lr",
       [](Optimizer& o) {
         ReduceLROnPlateau s(o, ReduceLROnPlateauOptions().min_lr({0.1}));
       }},
      {"lambda_count",
       [](Optimizer& o) {
         LambdaLR s(o, std::vector<LRLambda>(3, [](int64_t) { return 1.0; }));
       }},
      {"sequential_empty", [&](Optimizer& o) { sequential(o, {}, {}); }},
      {"sequential_milestones",
       [&](Optimizer& o) {
         sequential(
             o,
             {std::make_shared<StepLR>(o, 3), std::make_shared<StepLR>(o, 4)},
             {});
       }},
      {"sequential_plateau",
       [&](Optimizer& o) {
         sequential(
             o,
             {std::make_shared<StepLR>(o, 3),
              std::make_shared<ReduceLROnPlateau>(o)},
             {5});
       }},
      {"chained_empty", [](Optimizer&) { ChainedScheduler s({}); }},
      {"one_cycle_overstep",
       [](Optimizer& o) {
         OneCycleLR s(o, OneCycleLROptions(0.1).total_steps(10));
         for (int i = 0; i < 11; ++i) {
           s.step();
         }
       }},
  };
  ASSERT_EQ(cases.size(), oracle().errors.size());
  for (const auto& [name, make] : cases) {
    SCOPED_TRACE(name);
    const auto& [type, message] = oracle().errors.at(name);
    ASSERT_EQ(type, "ValueError") << message;
    auto optimizer = make_optimizer("sgd");
    try {
      make(*optimizer);
      ADD_FAILURE() << "no error; Python: " << message;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(
          std::string(e.what_without_backtrace()).find(message),
          std::string::npos)
          << "C++: " << e.what_without_backtrace() << "\nPython: " << message;
    }
  }
}

TEST(LRSchedulerTest, ResumingNeedsInitialLr) {
  auto optimizer = make_optimizer("sgd");
  expect_error(
      [&] { StepLR s(*optimizer, 10, 0.1, /*last_epoch=*/5); },
      "param 'initial_lr' is not specified in param_groups[0] when resuming "
      "scheduler with last_epoch >= 0.");
  // While another scheduler of the optimizer lives, its initial_lr is there.
  ExponentialLR first(*optimizer, 0.9);
  optimizer->param_groups()[0].options().set_lr(0.5);
  StepLR resumed(*optimizer, 10, 0.1, /*last_epoch=*/5);
  EXPECT_EQ(resumed.base_lrs(), kLrs);
  EXPECT_EQ(resumed.last_epoch(), 6);
}

TEST(LRSchedulerTest, InitialLrLivesWithTheSchedulers) {
  auto optimizer = make_optimizer("sgd");
  {
    LinearLR warmup(*optimizer, 0.5);
    CosineAnnealingLR cosine(*optimizer, 10);
    EXPECT_EQ(cosine.base_lrs(), kLrs); // Python's setdefault("initial_lr")
    EXPECT_EQ(cosine.get_last_lr(), (std::vector<double>{0.05, 0.005}));
  }
  // Documented difference: with no scheduler of the optimizer left, a new
  // one starts from the current learning rates (Python would still find
  // initial_lr in the param groups).
  ExponentialLR later(*optimizer, 0.9);
  EXPECT_EQ(later.base_lrs(), (std::vector<double>{0.05, 0.005}));
}

TEST(LRSchedulerTest, PlateauNeedsMetric) {
  auto optimizer = make_optimizer("sgd");
  ReduceLROnPlateau plateau(*optimizer);
  LRScheduler& base = plateau;
  expect_error([&] { base.step(); }, "needs the metric");
  EXPECT_EQ(plateau.last_epoch(), 0);
}

TEST(LRSchedulerTest, WorksWithAnyOptimizer) {
  auto p = torch::zeros({2}).requires_grad_();
  torch::optim::LBFGS lbfgs({p}, torch::optim::LBFGSOptions(1.0));
  StepLR scheduler(lbfgs, 2, 0.5);
  std::vector<double> lrs;
  for (int i = 0; i < 4; ++i) {
    scheduler.step();
    lrs.push_back(lbfgs.param_groups()[0].options().get_lr());
  }
  EXPECT_EQ(lrs, (std::vector<double>{1.0, 0.5, 0.5, 0.25}));
}

} // namespace lr_scheduler_test
