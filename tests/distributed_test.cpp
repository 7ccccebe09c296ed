#include <lamp/distributed.h>
#include <lamp/grad_scaler.h>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "support.h"

// Set by tests/CMakeLists.txt when lamp has NCCL.
#ifndef LAMP_DDP_WORKER
#define LAMP_DDP_WORKER ""
#endif

namespace {

using lamp::dist::LaunchConfig;
using lamp::dist::ProcessGroupOptions;
using lamp::test::expect_error;

// Sets environment variables for one test and restores them afterwards.
class Env {
 public:
  using Values = std::map<std::string, std::string>;
  explicit Env(const Values& values) {
    for (const char* name :
         {"RANK",
          "WORLD_SIZE",
          "LOCAL_RANK",
          "MASTER_ADDR",
          "MASTER_PORT",
          "TORCHELASTIC_USE_AGENT_STORE",
          "TORCHELASTIC_RESTART_COUNT"}) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(name);
    }
    for (const auto& [name, value] : values) {
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// A TCP port nobody listens on right now.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(DistLaunch, PlainRunIsAWorldOfOne) {
  Env env(Env::Values{});
  const auto config = lamp::dist::launch_config();
  EXPECT_EQ(config.rank, 0);
  EXPECT_EQ(config.world_size, 1);
  EXPECT_EQ(config.local_rank, 0);
}

TEST(DistLaunch, ReadsTorchrunsEnvironment) {
  Env env(
      {{"RANK", "3"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "1"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "29511"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const auto config = lamp::dist::launch_config();
  EXPECT_EQ(config.rank, 3);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.local_rank, 1);
  EXPECT_EQ(config.master_addr, "127.0.0.1");
  EXPECT_EQ(config.master_port, 29511);
  EXPECT_TRUE(config.agent_store);
  EXPECT_EQ(config.restart_count, "2");
}

TEST(DistLaunch, OptionsOverrideTheEnvironment) {
  Env env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  const auto config = lamp::dist::launch_config(ProcessGroupOptions()
                                                    .rank(1)
                                                    .world_size(2)
                                                    .master_addr("localhost")
                                                    .master_port(4000));
  EXPECT_EQ(config.rank, 1);
  EXPECT_EQ(config.local_rank, 1) << "LOCAL_RANK defaults to the rank";
  EXPECT_EQ(config.master_addr, "localhost");
  EXPECT_EQ(config.master_port, 4000);
  EXPECT_FALSE(config.agent_store);
}

TEST(DistLaunch, MissingOrInconsistentVariablesAreNamed) {
  const std::string launch = "torchrun --no-python --nproc_per_node=2";
  {
    Env env(Env::Values{{"WORLD_SIZE", "2"}});
    expect_error([] { lamp::dist::launch_config(); }, "RANK is not set");
    expect_error([] { lamp::dist::launch_config(); }, launch);
  }
  {
    Env env(Env::Values{{"RANK", "1"}});
    expect_error([] { lamp::dist::launch_config(); }, "WORLD_SIZE is not set");
  }
  {
    Env env({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    expect_error(
        [] { lamp::dist::launch_config(); }, "RANK must be in [0, WORLD_SIZE)");
  }
  {
    Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    expect_error([] { lamp::dist::launch_config(); }, "MASTER_ADDR is not set");
  }
  {
    Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
    expect_error([] { lamp::dist::launch_config(); }, "MASTER_PORT is not set");
  }
  {
    Env env(
        {{"RANK", "1"},
         {"WORLD_SIZE", "2"},
         {"MASTER_ADDR", "h"},
         {"MASTER_PORT", "29x"}});
    expect_error(
        [] { lamp::dist::launch_config(); },
        "MASTER_PORT='29x' is not an integer");
  }
  {
    Env env(
        {{"RANK", "1"},
         {"WORLD_SIZE", "2"},
         {"MASTER_ADDR", "h"},
         {"MASTER_PORT", "70000"}});
    expect_error([] { lamp::dist::launch_config(); }, "MASTER_PORT must be in");
  }
}

TEST(DistRendezvous, TwoRanksMeetOnRankZerosStore) {
  Env env(Env::Values{});
  const int port = free_port();
  auto config = [&](int64_t rank) {
    return lamp::dist::launch_config(ProcessGroupOptions()
                                         .rank(rank)
                                         .world_size(2)
                                         .master_addr("127.0.0.1")
                                         .master_port(port));
  };
  std::string seen_by_1, seen_by_0;
  std::thread rank1([&] {
    auto store = lamp::dist::rendezvous(config(1), std::chrono::seconds(30));
    store->set("from1", std::vector<uint8_t>{'b'});
    const auto value = store->get("from0");
    seen_by_1.assign(value.begin(), value.end());
  });
  auto store = lamp::dist::rendezvous(config(0), std::chrono::seconds(30));
  store->set("from0", std::vector<uint8_t>{'a'});
  const auto value = store->get("from1");
  seen_by_0.assign(value.begin(), value.end());
  rank1.join();
  EXPECT_EQ(seen_by_0, "b");
  EXPECT_EQ(seen_by_1, "a");
}

TEST(DistRendezvous, UnderTorchrunEveryRankIsAClientOfTheAgentsStore) {
  const int port = free_port();
  // What torchrun's agent runs.
  c10d::TCPStoreOptions agent_options;
  agent_options.port = port;
  agent_options.isServer = true;
  agent_options.waitWorkers = false;
  c10d::TCPStore agent("127.0.0.1", agent_options);

  Env env(
      {{"RANK", "0"},
       {"WORLD_SIZE", "2"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", std::to_string(port)},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "1"}});
  auto store = lamp::dist::rendezvous(
      lamp::dist::launch_config(), std::chrono::seconds(30));
  store->set("key", std::vector<uint8_t>{'v'});
  EXPECT_EQ(agent.get("/worker/attempt_1/key"), std::vector<uint8_t>{'v'});
}

TEST(DistRendezvous, AMissingRankTimesOutInsteadOfHanging) {
  Env env(Env::Values{});
  const auto config = lamp::dist::launch_config(ProcessGroupOptions()
                                                    .rank(1)
                                                    .world_size(2)
                                                    .master_addr("127.0.0.1")
                                                    .master_port(free_port()));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      lamp::dist::rendezvous(config, std::chrono::seconds(2)), c10::Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

} // namespace

// ---------------------------------------------------------------------------
// A world of one process: no store, no NCCL; everything is a no-op.

TEST(DistWorldOfOne, CollectivesReturnTheirInput) {
  Env env(Env::Values{});
  auto pg = lamp::dist::init_process_group();
  EXPECT_EQ(pg->world_size(), 1);
  EXPECT_EQ(pg->rank(), 0);
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
  expect_error([&] { pg->broadcast({t}, 1); }, "root must be in [0, 1), got 1");
  expect_error([&] { pg->allreduce(torch::Tensor()); }, "undefined tensor");
  expect_error(
      [&] {
        pg->allreduce(torch::ones({4, 4}, pg->device()).t().narrow(0, 0, 2));
      },
      "must be dense");
}

TEST(DistWorldOfOne, DataParallelChangesNothing) {
  Env env(Env::Values{});
  auto pg = lamp::dist::init_process_group();
  torch::manual_seed(0);
  torch::nn::Linear model(8, 4);
  model->to(pg->device());
  const auto before = model->weight.detach().clone();
  lamp::DistributedDataParallel ddp(model.ptr(), pg);
  EXPECT_TRUE(ddp.bucket_indices().empty());
  EXPECT_TRUE(model->weight.equal(before));
  auto x = torch::randn({16, 8}, pg->device());
  model->forward(x).sum().backward();
  const auto grad = model->weight.grad().clone();
  model->zero_grad();
  {
    auto no_sync = ddp.no_sync();
    expect_error([&] { auto again = ddp.no_sync(); }, "does not nest");
    model->forward(x).sum().backward();
  }
  EXPECT_TRUE(model->weight.grad().equal(grad));
  ddp.sync_buffers();
}

TEST(DistWorldOfOne, ScalerWithAProcessGroupStepsAsWithout) {
  Env env(Env::Values{});
  auto pg = lamp::dist::init_process_group();
  lamp::GradScaler scaler(lamp::GradScalerOptions().process_group(pg));
  auto w = torch::ones({3}, torch::dtype(torch::kFloat).requires_grad(true));
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  scaler.scale((w * 2).sum()).backward();
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(w.allclose(torch::full({3}, 0.8)));
}

TEST(DistDataParallel, RejectsBadOptions) {
  Env env(Env::Values{});
  auto pg = lamp::dist::init_process_group();
  torch::nn::Linear model(2, 2);
  expect_error(
      [&] {
        lamp::DistributedDataParallel(
            model.ptr(), pg, lamp::DDPOptions().bucket_cap_mb(0));
      },
      "bucket_cap_mb and first_bucket_cap_mb must be > 0");
  expect_error(
      [&] {
        lamp::DistributedDataParallel(
            model.ptr(), pg, lamp::DDPOptions().comm_dtype(torch::kInt));
      },
      "comm_dtype must be a floating-point dtype");
  expect_error(
      [&] { lamp::DistributedDataParallel(model.ptr(), nullptr); },
      "the process group is null");
}

// ---------------------------------------------------------------------------
// Two GPUs: each test starts two ranks of lamp_ddp_worker with torchrun
// (exactly as a user launches a lamp program) and checks what they wrote.

class DdpMultiGpu : public testing::Test {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 2) {
      GTEST_SKIP() << "needs 2 CUDA devices; found "
                   << torch::cuda::device_count();
    }
    LAMP_SKIP_WITHOUT_PYTHON_ORACLE(); // torchrun comes with Python torch
    if (std::string(LAMP_DDP_WORKER).empty()) {
      GTEST_SKIP() << "lamp was built without NCCL";
    }
    char dir[] = "/tmp/lamp_ddp_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    out_ = dir;
  }

  // Runs the worker on 2 ranks; returns torchrun's exit status.
  int launch(const std::string& args) {
    // NVLink multicast stays off on shared hosts.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
    setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
    const std::string command = std::string("\"") + LAMP_TEST_PYTHON +
        "\" -m torch.distributed.run --standalone --nproc_per_node=2 "
        "--no-python \"" LAMP_DDP_WORKER "\" --out " +
        out_ + " " + args + " > " + out_ + "/log 2>&1";
    const int status = std::system(command.c_str());
    if (status != 0) {
      std::ifstream log(out_ + "/log");
      std::stringstream text;
      text << log.rdbuf();
      ADD_FAILURE() << command << "\nexited with " << status << ":\n"
                    << text.str();
    }
    return status;
  }

  std::vector<std::vector<std::string>> lines(int rank) {
    std::ifstream in(out_ + "/rank" + std::to_string(rank) + ".txt");
    std::stringstream text;
    text << in.rdbuf();
    return lamp::test::split_lines(text.str());
  }

  // Rows "<prefix> step scale found_inf loss" of a rank's output.
  std::vector<std::vector<double>> history(
      int rank,
      const std::string& prefix) {
    std::vector<std::vector<double>> rows;
    for (const auto& line : lines(rank)) {
      if (line[0] == prefix) {
        rows.push_back(
            {std::stod(line[2]), std::stod(line[3]), std::stod(line[4])});
      }
    }
    return rows;
  }

  std::vector<torch::Tensor> tensors(const std::string& name) {
    std::vector<torch::Tensor> ts;
    torch::load(ts, out_ + "/" + name);
    return ts;
  }

  std::string value(int rank, const std::string& key) {
    for (const auto& line : lines(rank)) {
      if (line[0] == key) {
        std::string rest;
        for (size_t i = 1; i < line.size(); ++i) {
          rest += (i > 1 ? " " : "") + line[i];
        }
        return rest;
      }
    }
    return "<missing " + key + ">";
  }

  // Both ranks end bitwise equal, with the same scale history, and (unless
  // `local`) close to single-process training on the whole batch.
  void expect_data_parallel_training(double tolerance, bool local = false) {
    const auto p0 = tensors("rank0.pt");
    const auto p1 = tensors("rank1.pt");
    ASSERT_EQ(p0.size(), p1.size());
    for (size_t i = 0; i < p0.size(); ++i) {
      EXPECT_TRUE(p0[i].equal(p1[i])) << "parameter #" << i;
    }
    const auto h0 = history(0, "ddp");
    const auto h1 = history(1, "ddp");
    ASSERT_FALSE(h0.empty());
    for (size_t s = 0; s < h0.size(); ++s) {
      EXPECT_EQ(h0[s][0], h1[s][0]) << "scale after step " << s;
      EXPECT_EQ(h0[s][1], h1[s][1]) << "found_inf at step " << s;
    }
    EXPECT_LT(h0.back()[2], h0.front()[2]) << "the loss went down";
    if (local) {
      return;
    }
    const auto ref = tensors("reference.pt");
    const auto hr = history(0, "reference");
    ASSERT_EQ(hr.size(), h0.size());
    for (size_t s = 0; s < h0.size(); ++s) {
      EXPECT_EQ(h0[s][0], hr[s][0]) << "scale after step " << s;
      EXPECT_EQ(h0[s][1], hr[s][1]) << "found_inf at step " << s;
    }
    ASSERT_EQ(ref.size(), p0.size());
    for (size_t i = 0; i < p0.size(); ++i) {
      const double diff = (p0[i] - ref[i]).abs().max().item<double>();
      const double size = ref[i].abs().max().item<double>();
      EXPECT_LE(diff, tolerance * size)
          << "parameter #" << i << ": DDP vs single process";
    }
  }

  std::string out_;
};

TEST_F(DdpMultiGpu, CollectivesOnTwoRanks) {
  ASSERT_EQ(launch("--scenario collectives"), 0);
  for (int rank : {0, 1}) {
    int checks = 0;
    for (const auto& line : lines(rank)) {
      if (line[0] == "check") {
        ++checks;
        EXPECT_EQ(line[2], "ok") << "rank " << rank << ": " << line[1];
      }
    }
    EXPECT_EQ(checks, 16) << "rank " << rank;
    EXPECT_EQ(value(rank, "done"), "");
  }
}

// NOTE: tolerances are relative to the largest parameter. In fp32 the only
// difference from one process is the order of additions; with fp16
// autocast, cuBLAS rounds a half batch differently from a whole one (about
// 1e-3 relative on the gradients).
constexpr double kFp32Tolerance = 1e-5;
constexpr double kAmpTolerance = 5e-3;

TEST_F(DdpMultiGpu, Fp32TrainingMatchesOneProcessOnTheWholeBatch) {
  ASSERT_EQ(launch("--fp32"), 0);
  expect_data_parallel_training(kFp32Tolerance);
}

TEST_F(DdpMultiGpu, AmpTrainingMatchesOneProcessOnTheWholeBatch) {
  ASSERT_EQ(launch(""), 0);
  EXPECT_EQ(value(0, "buckets"), "1");
  expect_data_parallel_training(kAmpTolerance);
}

TEST_F(DdpMultiGpu, ManyTinyBuckets) {
  ASSERT_EQ(launch("--bucket-cap-mb 0.00001 --first-bucket-cap-mb 0.00001"), 0);
  EXPECT_EQ(value(0, "buckets"), "6") << "one bucket per parameter";
  expect_data_parallel_training(kAmpTolerance);
}

TEST_F(DdpMultiGpu, NoSyncGradientAccumulation) {
  ASSERT_EQ(launch("--no-sync"), 0);
  expect_data_parallel_training(kAmpTolerance);
}

TEST_F(DdpMultiGpu, UnusedParameters) {
  ASSERT_EQ(launch("--unused"), 0);
  expect_data_parallel_training(kAmpTolerance);
  // `never` (parameters #6, #7) got no gradient on any rank: untouched.
  const auto p0 = tensors("rank0.pt");
  const auto ref = tensors("reference.pt");
  EXPECT_TRUE(p0[6].equal(ref[6]));
  EXPECT_TRUE(p0[7].equal(ref[7]));
}

TEST_F(DdpMultiGpu, Fp16Compression) {
  ASSERT_EQ(launch("--comm-dtype fp16"), 0);
  expect_data_parallel_training(2 * kAmpTolerance);
}

TEST_F(DdpMultiGpu, GradientAsBucketView) {
  ASSERT_EQ(
      launch("--grad-view --bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01"), 0);
  expect_data_parallel_training(kAmpTolerance);
}

TEST_F(DdpMultiGpu, CudaGraphedStepsWithTheAllreduceInTheGraph) {
  // Both ranks and the single-process reference step through
  // lamp::GraphedStep: NCCL's allreduce is captured with the rest.
  ASSERT_EQ(launch("--cuda-graph --inject-rank 1 --inject-step 5"), 0);
  expect_data_parallel_training(kAmpTolerance);
  EXPECT_EQ(history(0, "ddp")[5][1], 1.0) << "rank 1's inf reached rank 0";
}

TEST_F(DdpMultiGpu, InfOnOneRankSkipsTheStepOnBoth) {
  ASSERT_EQ(launch("--inject-rank 1 --inject-step 5"), 0);
  expect_data_parallel_training(kAmpTolerance);
  const auto h0 = history(0, "ddp");
  EXPECT_EQ(h0[5][1], 1.0) << "rank 0's own data was finite";
  EXPECT_EQ(h0[5][0], h0[4][0] / 2) << "the scale backed off";
}

TEST_F(DdpMultiGpu, LocalStepsAgreeThroughTheScalersProcessGroup) {
  ASSERT_EQ(launch("--local-sgd --inject-rank 1 --inject-step 5"), 0);
  const auto h0 = history(0, "ddp");
  const auto h1 = history(1, "ddp");
  ASSERT_EQ(h0.size(), h1.size());
  for (size_t s = 0; s < h0.size(); ++s) {
    EXPECT_EQ(h0[s][0], h1[s][0]) << "scale after step " << s;
    EXPECT_EQ(h0[s][1], s == 5 ? 1.0 : 0.0) << "rank 0 at step " << s;
  }
  // Without averaging the replicas drift apart.
  const auto p0 = tensors("rank0.pt");
  const auto p1 = tensors("rank1.pt");
  EXPECT_FALSE(p0[0].equal(p1[0]));
}

TEST_F(DdpMultiGpu, BuffersFollowRankZero) {
  ASSERT_EQ(launch("--batch-norm"), 0);
  const auto b0 = tensors("rank0_buffers.pt");
  const auto b1 = tensors("rank1_buffers.pt");
  ASSERT_EQ(b0.size(), 3u); // running_mean, running_var, num_batches_tracked
  for (size_t i = 0; i < b0.size(); ++i) {
    EXPECT_TRUE(b0[i].equal(b1[i])) << "buffer #" << i;
  }
  EXPECT_GT(b0[0].abs().max().item<double>(), 0.0) << "statistics were kept";
  const auto p0 = tensors("rank0.pt");
  const auto p1 = tensors("rank1.pt");
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_TRUE(p0[i].equal(p1[i])) << "parameter #" << i;
  }
}

TEST_F(DdpMultiGpu, MismatchedModelsFailOnEveryRank) {
  ASSERT_EQ(launch("--scenario mismatch"), 0);
  for (int rank : {0, 1}) {
    const auto error = value(rank, "error");
    EXPECT_NE(error.find("the ranks' modules differ"), std::string::npos)
        << error;
    EXPECT_NE(
        error.find("rank 1 has parameter 'fc1.weight' Float[65, 32]"),
        std::string::npos)
        << error;
    EXPECT_LT(std::stod(value(rank, "seconds")), 30.0);
  }
}

TEST_F(DdpMultiGpu, ARankThatExitsMakesTheOtherFailWithinTheTimeout) {
  ASSERT_EQ(launch("--scenario exit --timeout-s 5"), 0);
  EXPECT_EQ(value(1, "exiting"), "");
  const auto error = value(0, "error");
  EXPECT_NE(error.find("communicator was aborted"), std::string::npos) << error;
  const double seconds = std::stod(value(0, "seconds"));
  EXPECT_GE(seconds, 4.0) << error;
  EXPECT_LT(seconds, 30.0) << error;
}
