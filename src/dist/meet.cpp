#include "meet.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace lamp::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kCount = "lamp/meet/count";

std::string rank_key(int64_t generation, int64_t rank) {
  return "lamp/meet/" + std::to_string(generation) + "/" + std::to_string(rank);
}

std::string done_key(int64_t generation) {
  return "lamp/meet/" + std::to_string(generation) + "/done";
}

// The ranks of `generation` that have not arrived, as "1, 3" (at most ten).
std::string missing_ranks(
    c10d::Store& store,
    int64_t generation,
    int64_t world_size,
    int64_t* count) {
  std::string list;
  *count = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!store.check({rank_key(generation, r)})) {
      if (++*count <= 10) {
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
    }
  }
  return *count > 10 ? list + ", ..." : list;
}

} // namespace

void meet(
    c10d::Store& store,
    const LaunchConfig& config,
    std::chrono::milliseconds timeout,
    const std::string& where) {
  const int64_t n = config.world_size;
  const auto start = Clock::now();
  // NOTE: a counter over the store's life, not a fresh key: under torchrun
  // every process group of a process meets on the agent's one store, so the
  // g-th group's ranks take counts g*n+1 .. (g+1)*n.
  const int64_t arrival = store.add(kCount, 1);
  const int64_t generation = (arrival - 1) / n;
  store.set(rank_key(generation, config.rank), std::vector<uint8_t>{'1'});
  if (arrival == (generation + 1) * n) {
    store.set(done_key(generation), std::vector<uint8_t>{'1'});
  }
  auto wait_for = [&](std::chrono::milliseconds how_long) {
    try {
      store.wait({done_key(generation)}, how_long);
      return true;
    } catch (const c10::Error&) {
      return false; // the store's timeout; the caller decides
    }
  };
  const auto patience =
      std::min<std::chrono::milliseconds>(kMeetPatience, timeout);
  if (wait_for(patience)) {
    return;
  }
  auto left = timeout -
      std::chrono::duration_cast<std::chrono::milliseconds>(
                  Clock::now() - start);
  int64_t count = 0;
  auto missing = missing_ranks(store, generation, n, &count);
  // NOTE: not when the timeout is up already: the error says it all.
  if (count > 0 && left.count() > 0) {
    TORCH_WARN(
        "lamp::dist: rank ",
        config.rank,
        " is waiting for ",
        count,
        " of ",
        n,
        " ranks (",
        missing,
        ") at ",
        where,
        "; it waits up to ",
        timeout.count() / 1000.0,
        " s in all (ProcessGroupOptions::timeout, the examples' "
        "--dist-timeout)");
  }
  if (left.count() > 0 && wait_for(left)) {
    return;
  }
  missing = missing_ranks(store, generation, n, &count);
  did_not_meet(
      config,
      where,
      timeout,
      std::to_string(count) + " of " + std::to_string(n) +
          " ranks never came (" + missing + ")");
}

void did_not_meet(
    const LaunchConfig& config,
    const std::string& where,
    std::chrono::milliseconds timeout,
    const std::string& what) {
  TORCH_CHECK_WITH(
      DistStoreError,
      false,
      "lamp::dist::rendezvous: the ranks did not meet at ",
      where,
      " within ",
      timeout.count(),
      " ms: ",
      what,
      config.launcher == Launcher::kSlurm
          ? ". Under Slurm: was every task started with srun (a program run "
            "directly in the batch script is one task of SLURM_NTASKS)?"
          : ". Did every rank start, with the same MASTER_ADDR and "
            "MASTER_PORT?");
  // NOTE: a throw, not TORCH_INTERNAL_ASSERT(false): unoptimised, GCC does
  // not see that the assert never returns (-Wreturn-type).
  throw std::logic_error("lamp::dist::did_not_meet: unreachable");
}

} // namespace lamp::dist::detail
