// Saving and restoring lamp's learning-rate schedulers: round trips through
// state_dict() and torch::save, state moving between C++ and Python (both
// ways), and bad states that must be rejected without changing anything.

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
namespace lr_scheduler_state_test {

using namespace lamp::optim;
using namespace lamp::test::lr;
using lamp::test::expect_error;
using torch::optim::Optimizer;

class LRSchedulerRoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(LRSchedulerRoundTrip, MatchesUninterrupted) {
  const auto full = run_cpp(GetParam());
  auto s = make_scenario(GetParam());
  for (int i = 1; i <= kSaveAt; ++i) {
    s.step(i);
  }
  const auto state = s.scheduler->state_dict();
  const auto scheduler_file = temp_dir() / (GetParam() + ".scheduler.pt");
  const auto optimizer_file = temp_dir() / (GetParam() + ".optimizer.pt");
  torch::save(*s.scheduler, scheduler_file.string());
  torch::save(*s.optimizer, optimizer_file.string());
  for (bool through_files : {false, true}) {
    SCOPED_TRACE(through_files ? "torch::save/load" : "state_dict()");
    // A fresh optimizer and scheduler, made as before, then restored in
    // Python's order: scheduler first, then the optimizer's and the
    // scheduler's state.
    auto fresh = make_scenario(GetParam());
    if (through_files) {
      torch::load(*fresh.optimizer, optimizer_file.string());
      torch::load(*fresh.scheduler, scheduler_file.string());
    } else {
      fresh.set_lrs(full[kSaveAt]);
      fresh.scheduler->load_state_dict(state);
    }
    EXPECT_EQ(sig(fresh.scheduler->state_dict()), sig(state));
    for (int i = kSaveAt + 1; i <= kSteps; ++i) {
      fresh.step(i);
      EXPECT_EQ(fresh.values(), full[i]) << "step " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    LRScheduler,
    LRSchedulerRoundTrip,
    testing::ValuesIn(kScenarios),
    [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// NOTE: as in lr_scheduler_test.cpp, one test for all scenarios: each
// test that reads oracle() starts Python once under CTest.
TEST(LRSchedulerInterop, CppContinuesFromPythonState) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  for (const auto& name : kScenarios) {
    SCOPED_TRACE(name);
    const auto& python = oracle().trajectories.at(name); // writes NAME.py.pt
    const auto state =
        torch::pickle_load(read_bytes(temp_dir() / (name + ".py.pt")));
    ASSERT_TRUE(state.isGenericDict());
    auto fresh = make_scenario(name);
    fresh.set_lrs(python[kSaveAt]); // what loading the optimizer restores
    fresh.scheduler->load_state_dict(state.toGenericDict());
    EXPECT_EQ(sig(fresh.scheduler->state_dict()), oracle().states.at(name));
    for (int i = kSaveAt + 1; i <= kSteps; ++i) {
      fresh.step(i);
      expect_matches(fresh.values(), python[i], "step " + std::to_string(i));
    }
  }
}

TEST(LRSchedulerInterop, PythonContinuesFromCppState) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto& python = oracle().trajectories;
  for (const auto& name : kScenarios) {
    auto s = make_scenario(name);
    for (int i = 1; i <= kSaveAt; ++i) {
      s.step(i);
    }
    write_bytes(
        temp_dir() / (name + ".cpp.pt"),
        torch::pickle_save(s.scheduler->state_dict()));
  }
  const auto continued = parse_values(
      lamp::test::split_lines(lamp::test::run_python_oracle(
          "optim/lr_scheduler/lr_scheduler_oracle.py", oracle_args("resume"))),
      "cont");
  for (const auto& name : kScenarios) {
    SCOPED_TRACE(name);
    ASSERT_EQ(continued.count(name), 1u);
    const auto& values = continued.at(name);
    ASSERT_EQ(values.size(), static_cast<size_t>(kSteps - kSaveAt));
    for (int i = kSaveAt + 1; i <= kSteps; ++i) {
      expect_matches(
          values[i - kSaveAt - 1],
          python.at(name)[i],
          "step " + std::to_string(i));
    }
  }
}

namespace {

using GenericDict = c10::impl::GenericDict;

// A copy of `state` (nested dicts and lists are shared: replace, never
// modify them).
GenericDict copy_of(const c10::IValue& state) {
  return state.toGenericDict().copy();
}

c10::IValue list_of(std::vector<c10::IValue> values) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (auto& v : values) {
    list.push_back(std::move(v));
  }
  return list;
}

struct BadState {
  std::string scenario;
  std::function<GenericDict(const GenericDict&)> make;
  std::vector<std::string> message; // parts the error must contain
};

std::vector<BadState> bad_states() {
  auto set = [](std::string key, c10::IValue value) {
    return [key, value](const GenericDict& good) {
      auto bad = good.copy();
      bad.insert_or_assign(key, value);
      bad.insert_or_assign("last_epoch", int64_t{7}); // must not be applied
      return bad;
    };
  };
  auto erase = [](std::string key) {
    return [key](const GenericDict& good) {
      auto bad = good.copy();
      if (bad.erase(key) != 1) {
        throw std::logic_error("no key " + key);
      }
      return bad;
    };
  };
  // `_schedulers[index][key] = value`, with the other entries changed too.
  auto set_child = [](size_t index, std::string key, c10::IValue value) {
    return [=](const GenericDict& good) {
      auto bad = good.copy();
      std::vector<c10::IValue> children;
      for (const auto& child : good.at("_schedulers").toListRef()) {
        auto changed = copy_of(child);
        changed.insert_or_assign("last_epoch", int64_t{99});
        children.push_back(changed);
      }
      auto target = copy_of(children.at(index));
      target.insert_or_assign(key, value);
      children[index] = target;
      bad.insert_or_assign("_schedulers", list_of(children));
      bad.insert_or_assign("_last_lr", list_of({0.5, 0.5}));
      return bad;
    };
  };
  const std::string where = ".load_state_dict: key '";
  return {
      {"step", erase("gamma"), {"StepLR" + where + "gamma'", "missing"}},
      {"step",
       set("gamma", std::string("x")),
       {"StepLR" + where + "gamma'", "expected a float, found str"}},
      {"step",
       set("base_lrs", list_of({0.1, 0.1, 0.1})),
       {"'base_lrs'", "a list of 2 floats (one per param group)", "of 3"}},
      {"cosine",
       set("_last_lr", list_of({0.1, std::string("x")})),
       {"CosineAnnealingLR", "'_last_lr'", "element 1 is a str"}},
      {"multistep",
       set("milestones", list_of({int64_t{30}})),
       {"'milestones'", "a dict int -> int"}},
      {"warm_restarts_2",
       set("T_cur", 1.5),
       {"CosineAnnealingWarmRestarts", "'T_cur'", "float 1.5"}},
      {"lambda_one",
       set("lr_lambdas", list_of({c10::IValue(), c10::IValue(int64_t{1})})),
       {"LambdaLR", "'lr_lambdas'", "Python callable"}},
      {"one_cycle_sgd",
       set("use_beta1", true),
       {"OneCycleLR", "'use_beta1'", "true only for an optimizer with betas"}},
      {"one_cycle_sgd",
       set("_anneal_func_type", std::string("exp")),
       {"'_anneal_func_type'", "'cos' or 'linear'"}},
      {"warmup_cosine",
       set_child(1, "T_max", std::string("x")),
       {"SequentialLR.load_state_dict: _schedulers[1] (CosineAnnealingLR)",
        "'T_max'",
        "expected an int, found str"}},
      {"warmup_cosine",
       set("_schedulers", list_of({c10::IValue()})),
       {"'_schedulers'", "a list of 2 dicts"}},
      {"chained",
       set_child(0, "factor", c10::IValue()),
       {"ChainedScheduler.load_state_dict: _schedulers[0] (ConstantLR)",
        "'factor'",
        "found None"}},
      {"plateau_min_rel",
       set("mode", std::string("foo")),
       {"ReduceLROnPlateau", "'mode'", "'min' or 'max'"}},
      {"plateau_min_rel",
       set("min_lrs", list_of({0.1})),
       {"'min_lrs'", "a list of 2 floats"}},
  };
}

} // namespace

TEST(LRSchedulerState, BadStateIsRejectedAndChangesNothing) {
  for (const auto& bad : bad_states()) {
    SCOPED_TRACE(bad.scenario + ": " + bad.message[0]);
    const auto full = run_cpp(bad.scenario);
    auto s = make_scenario(bad.scenario);
    for (int i = 1; i <= kSaveAt; ++i) {
      s.step(i);
    }
    const auto before = sig(s.scheduler->state_dict());
    const auto bad_state =
        bad.make(c10::impl::toGenericDict(s.scheduler->state_dict()));
    try {
      s.scheduler->load_state_dict(bad_state);
      ADD_FAILURE() << "no error";
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      for (const auto& part : bad.message) {
        EXPECT_NE(what.find(part), std::string::npos)
            << "missing '" << part << "' in: " << what;
      }
    }
    EXPECT_EQ(sig(s.scheduler->state_dict()), before);
    for (int i = kSaveAt + 1; i <= kSteps; ++i) {
      s.step(i);
      EXPECT_EQ(s.values(), full[i]) << "step " << i;
    }
  }
}

TEST(LRSchedulerState, ArchiveWithoutSchedulerStateIsRejected) {
  auto s = make_scenario("step");
  torch::serialize::OutputArchive archive;
  archive.write("something", c10::IValue(int64_t{1}));
  const auto file = temp_dir() / "not_a_scheduler.pt";
  archive.save_to(file.string());
  const auto before = sig(s.scheduler->state_dict());
  expect_error(
      [&] { torch::load(*s.scheduler, file.string()); },
      "StepLR.load: the archive holds no scheduler state");
  EXPECT_EQ(sig(s.scheduler->state_dict()), before);
}

} // namespace lr_scheduler_state_test
