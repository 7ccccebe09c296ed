// lamp::dist::ProcessGroup without GPUs: a world of one, a store-only group
// of two ranks in one process, and the types of its errors.

#include <lamp/config.h>
#include <lamp/dist/process_group.h>
#include <lamp/grad_scaler.h>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace dist_process_group_test {

namespace {

using lamp::dist::ProcessGroup;
using lamp::dist::ProcessGroupOptions;
using lamp::test::expect_error;
using lamp::test::expect_error_of;
using lamp::test::free_port;
using lamp::test::ScopedEnv;

TEST(DistWorldOfOne, CollectivesReturnTheirInput) {
  ScopedEnv env;
  auto pg = lamp::dist::init_process_group();
  EXPECT_EQ(pg->world_size(), 1);
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->launch_config().launcher, lamp::dist::Launcher::kNone);
  EXPECT_FALSE(pg->store());
  EXPECT_EQ(pg->nccl_comm(), nullptr);
  auto t = torch::arange(4, torch::dtype(torch::kFloat).device(pg->device()));
  for (auto op :
       {lamp::dist::ReduceOp::kSum,
        lamp::dist::ReduceOp::kAvg,
        lamp::dist::ReduceOp::kMax}) {
    pg->allreduce(t, op);
  }
  pg->broadcast({t}, 0);
  EXPECT_TRUE(t.cpu().equal(torch::arange(4, torch::kFloat)));
  EXPECT_EQ(pg->allgather("x"), std::vector<std::string>{"x"});
  pg->barrier();
  pg->check();
  expect_error_of<c10::ValueError>(
      [&] { pg->broadcast({t}, 1); }, "root must be in [0, 1), got 1");
  expect_error_of<c10::ValueError>(
      [&] { pg->allreduce(torch::Tensor()); }, "undefined tensor");
  expect_error_of<c10::ValueError>(
      [&] {
        pg->allreduce(
            torch::ones({2}, pg->device()).to(torch::kBool),
            lamp::dist::ReduceOp::kSum);
      },
      "bool tensors support ReduceOp::kMax only");
  expect_error(
      [&] {
        pg->allreduce(torch::ones({4, 4}, pg->device()).t().narrow(0, 0, 2));
      },
      "must be dense");
}

TEST(DistWorldOfOne, AStreamOfAnotherDeviceIsRejected) {
  ScopedEnv env;
  auto pg = lamp::dist::init_process_group();
  // NOTE: made without touching CUDA; only its device is looked at.
  const auto other = pg->device().is_cuda()
      ? c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU))
      : c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCUDA, 0), 0);
  auto t = torch::ones({2}, pg->device());
  expect_error_of<c10::ValueError>(
      [&] { pg->allreduce(t, lamp::dist::ReduceOp::kSum, other); },
      "allreduce: the stream is on " + other.device().str());
  expect_error_of<c10::ValueError>(
      [&] { pg->broadcast({t}, 0, other); }, "pass a CUDA stream of");
}

TEST(DistWorldOfOne, ScalerWithAProcessGroupStepsAsWithout) {
  ScopedEnv env;
  auto pg = lamp::dist::init_process_group();
  lamp::GradScaler scaler(lamp::GradScalerOptions().process_group(pg));
  auto w = torch::ones({3}, torch::dtype(torch::kFloat).requires_grad(true));
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  scaler.scale((w * 2).sum()).backward();
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(w.allclose(torch::full({3}, 0.8)));
}

TEST(DistErrors, BadOptionsAreValueErrors) {
  ScopedEnv env;
  expect_error_of<c10::ValueError>(
      [] {
        ProcessGroup(ProcessGroupOptions().timeout(std::chrono::seconds(0)));
      },
      "timeout must be > 0");
  expect_error_of<c10::ValueError>(
      [] { ProcessGroup(ProcessGroupOptions().rank(0).world_size(0)); },
      "world_size must be >= 1");
}

// Both ranks of a store-only group, each on its own thread of this process.
std::vector<std::shared_ptr<ProcessGroup>> two_ranks(
    std::chrono::milliseconds timeout,
    const std::function<void(ProcessGroup&)>& each = nullptr) {
  const int port = free_port();
  std::vector<std::shared_ptr<ProcessGroup>> pgs(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int64_t rank : {0, 1}) {
    threads.emplace_back([&, rank] {
      try {
        pgs[rank] = lamp::dist::init_process_group(ProcessGroupOptions()
                                                       .rank(rank)
                                                       .world_size(2)
                                                       .master_addr("127.0.0.1")
                                                       .master_port(port)
                                                       .timeout(timeout)
                                                       .nccl(false));
        if (each) {
          each(*pgs[rank]);
        }
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return pgs;
}

TEST(DistStoreGroup, AllgatherAndBarrierAcrossTwoRanks) {
  ScopedEnv env;
  std::vector<std::vector<std::string>> seen(2);
  const auto pgs = two_ranks(std::chrono::seconds(30), [&](ProcessGroup& pg) {
    for (int round = 0; round < 3; ++round) {
      seen[pg.rank()] = pg.allgather(
          "r" + std::to_string(pg.rank()) + "/" + std::to_string(round));
      pg.barrier();
    }
  });
  ASSERT_TRUE(pgs[0] && pgs[1]);
  for (int rank : {0, 1}) {
    EXPECT_EQ(seen[rank], (std::vector<std::string>{"r0/2", "r1/2"}));
    EXPECT_EQ(
        pgs[rank]->launch_config().launcher, lamp::dist::Launcher::kOptions);
    EXPECT_EQ(pgs[rank]->local_rank(), rank) << "127.0.0.1: one host";
    EXPECT_EQ(pgs[rank]->nccl_comm(), nullptr);
    EXPECT_NO_THROW(pgs[rank]->check());
  }
  // Note [Store keys]: both ranks are past all six operations; the keys of
  // all but the last are gone.
  auto& store = *pgs[0]->store();
  for (int op = 0; op < 6; ++op) {
    const auto n = std::to_string(op);
    for (
        const auto& key : op % 2 == 0
            ? std::vector<
                  std::
                      string>{"lamp/allgather/" + n + "/0", "lamp/allgather/" + n + "/1"}
            : std::vector<std::string>{
                  "lamp/barrier/" + n, "lamp/barrier/" + n + "/done"}) {
      EXPECT_EQ(store.check({key}), op == 5) << key;
    }
  }
  // Without a communicator: store operations only.
  auto t = torch::ones({2}, pgs[0]->device());
  expect_error_of<c10::DistBackendError>(
      [&] { pgs[0]->allreduce(t); }, "has no communicator");
  expect_error_of<c10::DistBackendError>(
      [&] { pgs[0]->broadcast({t}); }, "only allgather() and barrier() work");
}

TEST(DistStoreGroup, ARankThatNeverComesIsADistStoreError) {
  ScopedEnv env;
  const auto start = std::chrono::steady_clock::now();
  expect_error_of<c10::DistStoreError>(
      [] {
        ProcessGroup(ProcessGroupOptions()
                         .rank(1)
                         .world_size(2)
                         .master_addr("127.0.0.1")
                         .master_port(free_port())
                         .timeout(std::chrono::seconds(2))
                         .nccl(false));
      },
      "the ranks did not meet");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(DistStoreGroup, ABarrierThatOneRankSkipsTimesOut) {
  ScopedEnv env;
  std::string error;
  double seconds = 0;
  two_ranks(std::chrono::seconds(2), [&](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      const auto start = std::chrono::steady_clock::now();
      try {
        pg.barrier();
      } catch (const c10::DistStoreError& e) {
        error = e.what_without_backtrace();
      }
      seconds = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - start)
                    .count();
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(4));
    }
  });
  EXPECT_NE(error.find("rank 0: barrier (lamp/barrier/0)"), std::string::npos)
      << error;
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 30);
}

TEST(DistStoreGroup, WithoutGpusAnNcclGroupIsADistBackendError) {
  if (torch::cuda::device_count() > 0) {
    GTEST_SKIP() << "this host has CUDA devices";
  }
  ScopedEnv env;
  expect_error_of<c10::DistBackendError>(
      [] {
        ProcessGroup(ProcessGroupOptions()
                         .rank(0)
                         .world_size(2)
                         .master_addr("127.0.0.1")
                         .master_port(free_port())
                         .backend("nccl"));
      },
      LAMP_WITH_NCCL ? "for NCCL but no CUDA device was found"
                     : "built without NCCL");
}

} // namespace

} // namespace dist_process_group_test
