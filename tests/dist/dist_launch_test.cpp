// lamp::dist's launch side: the environment of each launcher, Slurm host
// lists, and the rendezvous on a TCPStore (in one process and across two
// processes started with Slurm's variables).

#include <lamp/dist/launch.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/hostlist.h"
#include "support.h"

// Set by tests/CMakeLists.txt.
#ifndef LAMP_STORE_WORKER
#define LAMP_STORE_WORKER ""
#endif

extern char** environ;

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace dist_launch_test {

namespace {

using lamp::dist::Environment;
using lamp::dist::LaunchConfig;
using lamp::dist::Launcher;
using lamp::dist::ProcessGroupOptions;
using lamp::test::expect_error_of;
using lamp::test::free_port;
using lamp::test::ScopedEnv;

struct Valid {
  const char* name;
  Environment env;
  Launcher launcher;
  int64_t rank, world_size, local_rank;
  std::string master_addr = "";
  int64_t master_port = 0;
};

TEST(LaunchEnvironment, EachLauncherAndPrecedence) {
  const std::vector<Valid> cases{
      {"plain run", {}, Launcher::kNone, 0, 1, 0},
      {"LOCAL_RANK=0 alone", {{"LOCAL_RANK", "0"}}, Launcher::kNone, 0, 1, 0},
      {"torchrun",
       {{"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "1"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29511"},
        {"TORCHELASTIC_RUN_ID", "job"}},
       Launcher::kTorchrun,
       3,
       4,
       1,
       "10.0.0.1",
       29511},
      {"hand-set variables",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "1"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1234"}},
       Launcher::kEnv,
       1,
       2,
       1,
       "h",
       1234},
      {"one host by LOCAL_WORLD_SIZE",
       {{"RANK", "2"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "node1"},
        {"MASTER_PORT", "1"}},
       Launcher::kEnv,
       2,
       4,
       2,
       "node1",
       1},
      {"one host by a loopback MASTER_ADDR",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "1"}},
       Launcher::kEnv,
       1,
       2,
       1,
       "127.0.0.1",
       1},
      {"RANK re-exported from Slurm takes SLURM_LOCALID",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"SLURM_PROCID", "5"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_LOCALID", "1"},
        {"MASTER_ADDR", "a"},
        {"MASTER_PORT", "7"}},
       Launcher::kEnv,
       5,
       8,
       1,
       "a",
       7},
      {"srun torchrun: torchrun's variables win",
       {{"RANK", "5"},
        {"WORLD_SIZE", "16"},
        {"LOCAL_RANK", "5"},
        {"MASTER_ADDR", "n1"},
        {"MASTER_PORT", "29500"},
        {"TORCHELASTIC_RUN_ID", "j"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODELIST", "n[1-2]"}},
       Launcher::kTorchrun,
       5,
       16,
       5,
       "n1",
       29500},
      {"Slurm: bracketed step node list, port from the job id",
       {{"SLURM_PROCID", "5"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_STEP_NODELIST", "gpu[01-04,07]"},
        {"SLURM_NODELIST", "other[1-9]"},
        {"SLURM_JOB_ID", "123456"}},
       Launcher::kSlurm,
       5,
       8,
       1,
       "gpu01",
       10000 + 123456 % 50000},
      {"Slurm: several groups in SLURM_NODELIST",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "3"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODELIST", "a[1-2],b3"},
        {"SLURM_JOBID", "7"}},
       Launcher::kSlurm,
       0,
       3,
       0,
       "a1",
       10007},
      {"Slurm: MASTER_ADDR and MASTER_PORT win",
       {{"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODELIST", "a[1-2]"},
        {"SLURM_JOB_ID", "7"},
        {"MASTER_ADDR", "b"},
        {"MASTER_PORT", "4242"}},
       Launcher::kSlurm,
       1,
       2,
       1,
       "b",
       4242},
      {"Slurm: one node, no SLURM_LOCALID",
       {{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_NNODES", "1"},
        {"SLURM_NODELIST", "n9"},
        {"SLURM_JOB_ID", "1"}},
       Launcher::kSlurm,
       3,
       4,
       3,
       "n9",
       10001},
      {"Slurm: one task",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}},
       Launcher::kSlurm,
       0,
       1,
       0},
      {"a batch script: SLURM_PROCID=0 without a task count",
       {{"SLURM_PROCID", "0"},
        {"SLURM_JOB_ID", "99"},
        {"SLURM_NODELIST", "n1"}},
       Launcher::kNone,
       0,
       1,
       0},
      {"Open MPI",
       {{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"MASTER_ADDR", "h0"},
        {"MASTER_PORT", "29500"}},
       Launcher::kOpenMpi,
       3,
       4,
       1,
       "h0",
       29500},
      {"mpirun inside a Slurm allocation: MPI wins over the batch step's",
       {{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"MASTER_ADDR", "h0"},
        {"MASTER_PORT", "29500"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODELIST", "x[1-2]"}},
       Launcher::kOpenMpi,
       3,
       4,
       1,
       "h0",
       29500},
      {"PMI (MPICH, Intel MPI)",
       {{"PMI_RANK", "2"},
        {"PMI_SIZE", "4"},
        {"MPI_LOCALRANKID", "0"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "5"}},
       Launcher::kPmi,
       2,
       4,
       0,
       "h",
       5},
      {"PMI on one host: MPI_LOCALNRANKS == PMI_SIZE",
       {{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"MPI_LOCALNRANKS", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "5"}},
       Launcher::kPmi,
       1,
       2,
       1,
       "h",
       5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    LaunchConfig config;
    try {
      config = lamp::dist::launch_config({}, c.env);
    } catch (const c10::Error& e) {
      ADD_FAILURE() << e.what_without_backtrace();
      continue;
    }
    EXPECT_EQ(config.launcher, c.launcher) << to_string(config.launcher);
    EXPECT_EQ(config.rank, c.rank);
    EXPECT_EQ(config.world_size, c.world_size);
    EXPECT_EQ(config.local_rank, c.local_rank);
    EXPECT_EQ(config.master_addr, c.master_addr);
    EXPECT_EQ(config.master_port, c.master_port);
  }
}

TEST(LaunchEnvironment, PartialMalformedAndConflictingSetsNameTheProblem) {
  const std::vector<std::pair<Environment, std::vector<std::string>>> cases{
      {{{"WORLD_SIZE", "2"}},
       {"RANK is not set", "torchrun --no-python --nproc_per_node=2"}},
      {{{"RANK", "1"}}, {"WORLD_SIZE is not set"}},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}},
       {"RANK must be in [0, WORLD_SIZE)"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}},
       {"MASTER_ADDR is not set"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
       {"MASTER_PORT is not set"}},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "29x"}},
       {"MASTER_PORT='29x' is not an integer"}},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "70000"}},
       {"MASTER_PORT must be in"}},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "node1"},
        {"MASTER_PORT", "1"}},
       {"the local rank (which picks the GPU) is not set", "LOCAL_RANK"}},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       {"LOCAL_RANK is 2 but RANK is 1"}},
      {{{"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "2"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       {"LOCAL_RANK is 2 but the local world size is 2"}},
      {{{"LOCAL_RANK", "3"}},
       {"LOCAL_RANK is 3 but neither RANK/WORLD_SIZE nor a launcher"}},
      {{{"SLURM_NTASKS", "8"}},
       {"launched by Slurm? SLURM_NTASKS is 8 but SLURM_PROCID is not set",
        "srun"}},
      {{{"SLURM_PROCID", "3"}},
       {"SLURM_PROCID is 3 but SLURM_NTASKS is not set"}},
      {{{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "8"}},
       {"SLURM_PROCID is 9 but SLURM_NTASKS is 8"}},
      {{{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "8"}},
       {"SLURM_PROCID='x1' is not an integer"}},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_NPROCS", "4"}},
       {"SLURM_NTASKS=8 and SLURM_NPROCS=4 disagree"}},
      {{{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_NODELIST", "g[1-2]"},
        {"SLURM_JOB_ID", "5"}},
       {"as rank 3 of 8 but the local rank", "SLURM_LOCALID"}},
      {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"}},
       {"launched by Slurm (SLURM_NTASKS=8) but MASTER_ADDR is not set and "
        "no SLURM_NODELIST is"}},
      {{{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_LOCALID", "3"},
        {"SLURM_NODELIST", "g[1-2]"}},
       {"MASTER_PORT is not set and no SLURM_JOB_ID is"}},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODELIST", "gpu[01-04"}},
       {"SLURM_NODELIST='gpu[01-04' is not a Slurm host list"}},
      {{{"OMPI_COMM_WORLD_SIZE", "4"}},
       {"OMPI_COMM_WORLD_SIZE is 4 but OMPI_COMM_WORLD_RANK is not set"}},
      {{{"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
       {"launched by Open MPI (OMPI_COMM_WORLD_SIZE=4) but MASTER_ADDR is not "
        "set",
        "mpirun -np 4 -x MASTER_ADDR="}},
      {{{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"MPI_LOCALRANKID", "1"},
        {"MASTER_ADDR", "h"}},
       {"launched by PMI (MPICH/Intel MPI) (PMI_SIZE=2) but MASTER_PORT is not "
        "set"}},
      {{{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "4"}},
       {"conflicting launchers"}},
  };
  for (const auto& [env, messages] : cases) {
    std::string trace;
    for (const auto& [name, value] : env) {
      trace += name + "=" + value + " ";
    }
    SCOPED_TRACE(trace);
    for (const auto& message : messages) {
      expect_error_of<c10::ValueError>(
          [&] { lamp::dist::launch_config({}, env); }, message);
    }
  }
}

TEST(LaunchEnvironment, ALauncherWorldOfSeveralNeverBecomesAWorldOfOne) {
  // Every partial set that says "several processes": an error, never a
  // plain run.
  for (const auto& env : std::vector<Environment>{
           {{"WORLD_SIZE", "8"}},
           {{"RANK", "3"}},
           {{"SLURM_NTASKS", "8"}},
           {{"SLURM_PROCID", "7"}},
           {{"OMPI_COMM_WORLD_SIZE", "8"}},
           {{"OMPI_COMM_WORLD_RANK", "7"}},
           {{"PMI_SIZE", "8"}},
           {{"PMI_RANK", "7"}}}) {
    SCOPED_TRACE(env.begin()->first);
    try {
      const auto config = lamp::dist::launch_config({}, env);
      ADD_FAILURE() << "a world of " << config.world_size;
    } catch (const c10::ValueError&) {
    }
  }
}

TEST(LaunchEnvironment, OptionsOverrideTheEnvironment) {
  const Environment env{
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}};
  const auto config = lamp::dist::launch_config(
      ProcessGroupOptions()
          .rank(1)
          .world_size(2)
          .master_addr("localhost")
          .master_port(4000),
      env);
  EXPECT_EQ(config.launcher, Launcher::kOptions);
  EXPECT_EQ(config.rank, 1);
  EXPECT_EQ(config.local_rank, 1) << "localhost: every rank on this host";
  EXPECT_EQ(config.master_addr, "localhost");
  EXPECT_EQ(config.master_port, 4000);
  EXPECT_FALSE(config.agent_store);
  EXPECT_EQ(
      lamp::dist::launch_config(
          ProcessGroupOptions()
              .rank(1)
              .world_size(2)
              .local_rank(0)
              .master_addr("n")
              .master_port(1),
          {})
          .local_rank,
      0);
}

TEST(LaunchEnvironment, ReadsTheProcessEnvironment) {
  {
    ScopedEnv env(
        {{"RANK", "3"},
         {"WORLD_SIZE", "4"},
         {"LOCAL_RANK", "1"},
         {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", "29511"},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
         {"TORCHELASTIC_RESTART_COUNT", "2"}});
    const auto config = lamp::dist::launch_config();
    EXPECT_EQ(config.launcher, Launcher::kTorchrun);
    EXPECT_EQ(config.rank, 3);
    EXPECT_EQ(config.world_size, 4);
    EXPECT_EQ(config.local_rank, 1);
    EXPECT_EQ(config.master_addr, "127.0.0.1");
    EXPECT_EQ(config.master_port, 29511);
    EXPECT_TRUE(config.agent_store);
    EXPECT_EQ(config.restart_count, "2");
  }
  {
    ScopedEnv env(
        {{"SLURM_PROCID", "1"},
         {"SLURM_NTASKS", "2"},
         {"SLURM_LOCALID", "1"},
         {"SLURM_NODELIST", "node[7-8]"},
         {"SLURM_JOB_ID", "42"}});
    const auto config = lamp::dist::launch_config();
    EXPECT_EQ(config.launcher, Launcher::kSlurm);
    EXPECT_EQ(config.rank, 1);
    EXPECT_EQ(config.world_size, 2);
    EXPECT_EQ(config.master_addr, "node7");
    EXPECT_EQ(config.master_port, 10042);
  }
  ScopedEnv env;
  EXPECT_EQ(lamp::dist::launch_config().launcher, Launcher::kNone);
}

TEST(LaunchEnvironment, LauncherNames) {
  EXPECT_STREQ(to_string(Launcher::kSlurm), "Slurm");
  EXPECT_STREQ(to_string(Launcher::kOpenMpi), "Open MPI");
  EXPECT_STREQ(to_string(Launcher::kTorchrun), "torchrun");
}

TEST(LaunchHostlist, ExpandsLikeScontrolShowHostnames) {
  using lamp::dist::detail::expand_slurm_hostlist;
  using Hosts = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node1"), Hosts{"node1"});
  EXPECT_EQ(
      expand_slurm_hostlist("gpu[01-04,07]"),
      (Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"}));
  EXPECT_EQ(expand_slurm_hostlist("a[1-2],b3"), (Hosts{"a1", "a2", "b3"}));
  EXPECT_EQ(expand_slurm_hostlist("a,b"), (Hosts{"a", "b"}));
  EXPECT_EQ(expand_slurm_hostlist("x[8-10]"), (Hosts{"x8", "x9", "x10"}));
  EXPECT_EQ(
      expand_slurm_hostlist("x[098-101]"),
      (Hosts{"x098", "x099", "x100", "x101"}));
  EXPECT_EQ(
      expand_slurm_hostlist("r[1-2]-n[08-09].cluster"),
      (Hosts{
          "r1-n08.cluster",
          "r1-n09.cluster",
          "r2-n08.cluster",
          "r2-n09.cluster"}));
  EXPECT_EQ(
      expand_slurm_hostlist("login,gpu[1,3-4],cpu[10-11]"),
      (Hosts{"login", "gpu1", "gpu3", "gpu4", "cpu10", "cpu11"}));
  for (const std::string bad :
       {"",
        "gpu[01-04",
        "gpu]",
        "a,,b",
        "a,",
        ",a",
        "a[3-1]",
        "a[x]",
        "a[]",
        "a[1-]",
        "a[[1]]"}) {
    SCOPED_TRACE(bad);
    expect_error_of<c10::ValueError>(
        [&] { expand_slurm_hostlist(bad); }, "is not a Slurm host list");
  }
  expect_error_of<c10::ValueError>(
      [&] { expand_slurm_hostlist("n[1-100000]", "SLURM_NODELIST", 1000); },
      "too many hosts");
}

TEST(DistRendezvous, TwoRanksMeetOnRankZerosStore) {
  const int port = free_port();
  auto config = [&](int64_t rank) {
    return lamp::dist::launch_config(
        ProcessGroupOptions()
            .rank(rank)
            .world_size(2)
            .master_addr("127.0.0.1")
            .master_port(port),
        {});
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

  // Both ranks: rendezvous returns once they have met.
  auto config_of = [&](int rank) {
    return lamp::dist::launch_config(
        ProcessGroupOptions(),
        {{"RANK", std::to_string(rank)},
         {"WORLD_SIZE", "2"},
         {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", std::to_string(port)},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
         {"TORCHELASTIC_RESTART_COUNT", "1"}});
  };
  std::thread other(
      [&] { lamp::dist::rendezvous(config_of(1), std::chrono::seconds(30)); });
  auto store = lamp::dist::rendezvous(config_of(0), std::chrono::seconds(30));
  other.join();
  store->set("key", std::vector<uint8_t>{'v'});
  EXPECT_EQ(agent.get("/worker/attempt_1/key"), std::vector<uint8_t>{'v'});
}

// A rank kept waiting says once, after a few seconds, whom it waits for,
// where, and how long it will wait; the late rank then joins.
TEST(DistRendezvous, AWaitingRankSaysWhomItWaitsFor) {
  struct Collect : c10::WarningHandler {
    void process(const c10::Warning& w) override {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(w.msg());
    }
    std::mutex mutex;
    std::vector<std::string> messages;
  } collect;
  c10::WarningUtils::WarningHandlerGuard guard(&collect);
  const int port = free_port();
  auto config_of = [&](int64_t rank) {
    return lamp::dist::launch_config(
        ProcessGroupOptions()
            .rank(rank)
            .world_size(2)
            .master_addr("127.0.0.1")
            .master_port(port),
        {});
  };
  // NOTE: the warning handler is thread-local; rank 0 runs on this thread.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::seconds(7));
    lamp::dist::rendezvous(config_of(1), std::chrono::seconds(30));
  });
  EXPECT_NO_THROW(
      lamp::dist::rendezvous(config_of(0), std::chrono::seconds(30)));
  late.join();
  ASSERT_EQ(collect.messages.size(), 1u);
  const auto& m = collect.messages[0];
  EXPECT_NE(
      m.find(
          "rank 0 is waiting for 1 of 2 ranks (1) at 127.0.0.1:" +
          std::to_string(port)),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("waits up to 30 s"), std::string::npos) << m;
}

TEST(DistRendezvous, AMissingRankIsADistStoreErrorNotAHang) {
  for (int64_t rank : {0, 1}) {
    SCOPED_TRACE(rank);
    const auto config = lamp::dist::launch_config(
        ProcessGroupOptions()
            .rank(rank)
            .world_size(2)
            .master_addr("127.0.0.1")
            .master_port(free_port()),
        {});
    const auto start = std::chrono::steady_clock::now();
    expect_error_of<c10::DistStoreError>(
        [&] { lamp::dist::rendezvous(config, std::chrono::seconds(2)); },
        "the ranks did not meet at 127.0.0.1:");
    EXPECT_LT(
        std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  }
}

// Two processes of tests/store_worker.cpp, started as srun would start
// them (SLURM_* only), meet on a TCPStore and exchange values.
TEST(DistRendezvous, TwoProcessesFromSlurmsVariables) {
  ASSERT_FALSE(std::string(LAMP_STORE_WORKER).empty());
  char dir[] = "/tmp/lamp_store_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string out = dir;
  lamp::test::remove_when_tests_end(out);
  // The port: derived from the job id as lamp does (10000 + id % 50000)
  // when the free port allows, else MASTER_PORT.
  const int port = free_port();
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const auto name = entry.substr(0, entry.find('='));
    const auto& skip = lamp::test::launcher_variables();
    if (std::find(skip.begin(), skip.end(), name) == skip.end()) {
      base.push_back(entry);
    }
  }
  base.push_back("SLURM_NTASKS=2");
  base.push_back("SLURM_STEP_NODELIST=127.0.0.[1-2]");
  if (10000 <= port && port < 60000) {
    base.push_back("SLURM_JOB_ID=" + std::to_string(port - 10000 + 50000));
  } else {
    base.push_back("SLURM_JOB_ID=1");
    base.push_back("MASTER_PORT=" + std::to_string(port));
  }
  std::vector<pid_t> pids;
  for (int rank : {0, 1}) {
    auto env = base;
    env.push_back("SLURM_PROCID=" + std::to_string(rank));
    env.push_back("SLURM_LOCALID=" + std::to_string(rank));
    std::vector<char*> envp;
    for (auto& entry : env) {
      envp.push_back(entry.data());
    }
    envp.push_back(nullptr);
    std::string program = LAMP_STORE_WORKER;
    std::string flag = "--out";
    std::string folder = out;
    std::vector<char*> argv{
        program.data(), flag.data(), folder.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(
        posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()),
        0);
    pids.push_back(pid);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (auto pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "worker " << pid << " did not finish";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker status " << status;
  }
  for (int rank : {0, 1}) {
    std::ifstream in(out + "/rank" + std::to_string(rank) + ".txt");
    std::stringstream text;
    text << in.rdbuf();
    const auto lines = lamp::test::split_lines(text.str());
    std::map<std::string, std::string> seen;
    for (const auto& line : lines) {
      std::string rest;
      for (size_t i = 1; i < line.size(); ++i) {
        rest += (i > 1 ? " " : "") + line[i];
      }
      seen[line[0]] = rest;
    }
    SCOPED_TRACE("rank " + std::to_string(rank) + ":\n" + text.str());
    EXPECT_EQ(seen["launcher"], "Slurm");
    EXPECT_EQ(seen["rank"], std::to_string(rank));
    EXPECT_EQ(seen["world"], "2");
    EXPECT_EQ(seen["local_rank"], std::to_string(rank));
    EXPECT_EQ(seen["master"], "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(seen["allgather"], "hello-from-0|hello-from-1");
    EXPECT_EQ(seen["barrier"], "ok");
    EXPECT_EQ(seen["allreduce_error"], "DistBackendError");
    EXPECT_EQ(seen["done"], "");
    if (rank == 0) {
      EXPECT_EQ(seen["leftover_keys"], "0") << "store keys were deleted";
    }
  }
}

} // namespace

} // namespace dist_launch_test
