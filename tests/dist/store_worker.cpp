// One rank of DistRendezvous.TwoProcessesFromSlurmsVariables
// (dist_launch_test.cpp), started with Slurm's variables only: joins a
// store-only process group (no GPU needed), exchanges values and writes
// what it saw to DIR/rank<R>.txt.

#include <lamp/dist/process_group.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--out") {
    std::cerr << "usage: lamp_store_worker --out DIR\n";
    return 2;
  }
  try {
    auto pg = lamp::dist::init_process_group(
        lamp::dist::ProcessGroupOptions().nccl(false).timeout(
            std::chrono::seconds(60)));
    const auto rank = pg->rank();
    const auto& config = pg->launch_config();
    std::ofstream out(
        std::string(argv[2]) + "/rank" + std::to_string(rank) + ".txt");
    out << "launcher " << to_string(config.launcher) << "\n";
    out << "rank " << rank << "\n";
    out << "world " << pg->world_size() << "\n";
    out << "local_rank " << pg->local_rank() << "\n";
    out << "master " << config.master_addr << ":" << config.master_port << "\n";
    std::string joined;
    for (int round = 0; round < 3; ++round) {
      const auto all = pg->allgather("hello-from-" + std::to_string(rank));
      joined.clear();
      for (size_t r = 0; r < all.size(); ++r) {
        joined += (r ? "|" : "") + all[r];
      }
      pg->barrier();
    }
    out << "allgather " << joined << "\n";
    out << "barrier ok\n";
    try {
      pg->allreduce(torch::ones({2}, pg->device()));
      out << "allreduce_error none\n";
    } catch (const c10::DistBackendError&) {
      out << "allreduce_error DistBackendError\n";
    }
    // Note [Store keys]: the keys of the first five operations are gone
    // once both ranks are past the sixth (rank 1 signals after it).
    auto& store = *pg->store();
    if (rank == 1) {
      // NOTE: rank 1's last use of the store, served by rank 0 until then.
      out << "done\n";
      store.set("test/rank1_finished", std::vector<uint8_t>{'1'});
      return 0;
    } else {
      store.wait({"test/rank1_finished"});
      int leftover = 0;
      for (int op = 0; op < 5; ++op) {
        const auto n = std::to_string(op);
        const bool gather = op % 2 == 0;
        const std::string key =
            std::string("lamp/") + (gather ? "allgather/" : "barrier/") + n;
        const std::vector<std::string> keys = gather
            ? std::vector<std::string>{key + "/0", key + "/1"}
            : std::vector<std::string>{key, key + "/done"};
        for (const auto& k : keys) {
          leftover += store.check({k}) ? 1 : 0;
        }
      }
      out << "leftover_keys " << leftover << "\n";
    }
    out << "done\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "lamp_store_worker: " << e.what() << "\n";
    return 1;
  }
}
