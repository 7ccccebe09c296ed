#include <lamp/distributed.h>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "support.h"

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
