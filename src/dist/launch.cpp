#include <lamp/dist/launch.h>

#include "launchers.h"
#include "meet.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// Note [Launch environment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// `launch_config` answers four questions: rank, world size, local rank (the
// GPU) and where rank 0's store listens. Sources, first wins:
//
//   1. ProcessGroupOptions, field by field, then torchrun's variables
//      (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//      MASTER_PORT): torchrun, `srun torchrun`, hand-set variables.
//   2. Only when (1) names neither rank nor world size: the first launcher
//      whose variables are present, Open MPI, then PMI (MPICH, Intel MPI),
//      then Slurm. MPI comes first because `mpirun` inside a Slurm
//      allocation inherits the batch step's SLURM_* (SLURM_PROCID=0 in every
//      process), while `srun --mpi=...` sets both consistently.
//   3. Nothing: a plain run, a world of one.
//
// A source that says world > 1 never degrades to a world of one: a partial
// set (a rank without a size, or a size > 1 without a rank), a malformed or
// out-of-range value, or two MPI flavours that disagree is a ValueError
// naming the launcher and the variable. (SLURM_PROCID=0 alone is not a
// launch: batch scripts carry it.)
//
// The local rank comes from LOCAL_RANK, else from the launcher (or, under
// (1), from a launcher whose rank and world size are the same, i.e. the
// variables were re-exported from it), else it is the rank when every rank
// is certainly on this host (LOCAL_WORLD_SIZE == WORLD_SIZE, a one-node
// Slurm step, a one-host MPI job, a loopback MASTER_ADDR). Otherwise it is
// unknowable and an error: rank % GPUs is wrong on the second node of an
// uneven or cyclic placement.
//
// With world > 1 the store address is MASTER_ADDR/MASTER_PORT; Slurm alone
// can default them (the first host of the step's node list, on which task 0
// runs with Slurm's default block distribution, and port 10000 +
// SLURM_JOB_ID % 50000, as several launchers derive it; two steps of one
// job running at once need distinct MASTER_PORTs).

namespace lamp::dist {
namespace {

using detail::Claim;
using detail::how_to_launch;
using detail::read_launcher;
using detail::Variables;

} // namespace

const std::vector<std::string>& detail::launcher_variables() {
  static const std::vector<std::string> names{
      "RANK",
      "WORLD_SIZE",
      "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",
      "MASTER_ADDR",
      "MASTER_PORT",
      "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHELASTIC_RESTART_COUNT",
      "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE",
      "PMI_RANK",
      "PMI_SIZE",
      "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS",
      "SLURM_PROCID",
      "SLURM_NTASKS",
      "SLURM_NPROCS",
      "SLURM_LOCALID",
      "SLURM_STEP_NODELIST",
      "SLURM_NODELIST",
      "SLURM_JOB_NODELIST",
      "SLURM_STEP_NUM_NODES",
      "SLURM_NNODES",
      "SLURM_JOB_NUM_NODES",
      "SLURM_JOB_ID",
      "SLURM_JOBID"};
  return names;
}

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "ip6-localhost" ||
      host.rfind("127.", 0) == 0;
}

} // namespace

const char* to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "no launcher";
    case Launcher::kOptions:
      return "ProcessGroupOptions";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kEnv:
      return "RANK/WORLD_SIZE";
    case Launcher::kSlurm:
      return "Slurm";
    case Launcher::kOpenMpi:
      return "Open MPI";
    case Launcher::kPmi:
      return "PMI (MPICH/Intel MPI)";
  }
  return "?";
}

LaunchConfig launch_config(const ProcessGroupOptions& options) {
  Environment env;
  for (const std::string& name : detail::launcher_variables()) {
    if (const char* value = std::getenv(name.c_str())) {
      env[name] = value;
    }
  }
  return launch_config(options, env);
}

LaunchConfig launch_config(
    const ProcessGroupOptions& options,
    const Environment& environment) {
  const Variables v(environment);
  // Source 1: options, then torchrun's variables.
  Claim claim;
  claim.rank = options.rank() ? options.rank() : v.integer("RANK");
  claim.world_size =
      options.world_size() ? options.world_size() : v.integer("WORLD_SIZE");
  claim.rank_name = options.rank() ? "ProcessGroupOptions::rank" : "RANK";
  claim.world_size_name =
      options.world_size() ? "ProcessGroupOptions::world_size" : "WORLD_SIZE";
  const bool torchrun = v.text("TORCHELASTIC_RUN_ID") ||
      v.text("TORCHELASTIC_USE_AGENT_STORE") ||
      v.text("TORCHELASTIC_RESTART_COUNT");
  if (claim.rank || claim.world_size) {
    claim.launcher = options.rank() && options.world_size() ? Launcher::kOptions
        : torchrun ? Launcher::kTorchrun
                   : Launcher::kEnv;
    TORCH_CHECK_VALUE(
        claim.world_size,
        "lamp::dist: ",
        claim.rank_name,
        " is ",
        *claim.rank,
        " but WORLD_SIZE is not set; ",
        how_to_launch(claim.launcher, 0),
        ".");
    TORCH_CHECK_VALUE(
        claim.rank,
        "lamp::dist: ",
        claim.world_size_name,
        " is ",
        *claim.world_size,
        " but RANK is not set; ",
        how_to_launch(claim.launcher, *claim.world_size),
        ".");
    claim.local_world_size = v.integer("LOCAL_WORLD_SIZE");
    claim.one_host = claim.local_world_size == claim.world_size;
    // Variables re-exported from a launcher (RANK=$SLURM_PROCID ...): its
    // local rank belongs to the same process. The launcher's own variables
    // are only a hint here; a malformed set is the launcher's problem.
    Claim launcher;
    try {
      launcher = read_launcher(v);
    } catch (const c10::ValueError&) { // NOLINT(bugprone-empty-catch)
    }
    if (launcher.rank == claim.rank &&
        launcher.world_size == claim.world_size) {
      claim.local_rank = launcher.local_rank;
      claim.local_rank_name = launcher.local_rank_name;
      claim.one_host = claim.one_host || launcher.one_host;
    }
  } else {
    claim = read_launcher(v);
  }
  if (options.local_rank()) {
    claim.local_rank = options.local_rank();
    claim.local_rank_name = "ProcessGroupOptions::local_rank";
  } else if (const auto local = v.integer("LOCAL_RANK")) {
    claim.local_rank = local;
    claim.local_rank_name = "LOCAL_RANK";
  }
  LaunchConfig config;
  config.launcher = claim.launcher;
  if (!claim.world_size) {
    TORCH_CHECK_VALUE(
        !claim.local_rank || *claim.local_rank == 0,
        "lamp::dist: ",
        claim.local_rank_name,
        " is ",
        claim.local_rank.value_or(0),
        " but neither RANK/WORLD_SIZE nor a launcher (Slurm, Open MPI, PMI) "
        "says how many processes there are; ",
        how_to_launch(Launcher::kTorchrun, 0),
        ".");
    return config; // a plain run: one process, no rendezvous
  }
  const int64_t size = *claim.world_size;
  const int64_t rank = *claim.rank;
  const char* by = to_string(claim.launcher);
  TORCH_CHECK_VALUE(
      size >= 1,
      "lamp::dist: ",
      claim.world_size_name,
      " must be >= 1, got ",
      size,
      " (launcher: ",
      by,
      ").");
  TORCH_CHECK_VALUE(
      0 <= rank && rank < size,
      "lamp::dist: ",
      claim.rank_name,
      " is ",
      rank,
      " but ",
      claim.world_size_name,
      " is ",
      size,
      "; RANK must be in [0, WORLD_SIZE) (launcher: ",
      by,
      ").");
  TORCH_CHECK_VALUE(
      !claim.local_world_size ||
          (1 <= *claim.local_world_size && *claim.local_world_size <= size),
      "lamp::dist: LOCAL_WORLD_SIZE is ",
      claim.local_world_size.value_or(0),
      " but ",
      claim.world_size_name,
      " is ",
      size,
      "; it must be in [1, WORLD_SIZE].");
  config.rank = rank;
  config.world_size = size;
  if (size > 1) {
    config.master_addr = options.master_addr();
    if (config.master_addr.empty()) {
      config.master_addr = v.text("MASTER_ADDR").value_or(claim.master_addr);
    }
    // What a missing rendezvous variable's error says: the launcher, the
    // variable (and, under Slurm, what would have stood in for it), how to
    // launch.
    auto unset = [&](const char* variable, const char* slurm_source) {
      return c10::str(
          "lamp::dist: launched by ",
          by,
          " (",
          claim.world_size_name,
          "=",
          size,
          ") but ",
          variable,
          " is not set",
          claim.launcher == Launcher::kSlurm ? slurm_source : "",
          "; ",
          how_to_launch(claim.launcher, size),
          ".");
    };
    TORCH_CHECK_VALUE(
        !config.master_addr.empty(),
        unset("MASTER_ADDR", " and no SLURM_NODELIST is"));
    auto port = options.master_port() ? options.master_port()
                                      : v.integer("MASTER_PORT");
    std::string port_from = options.master_port()
        ? "ProcessGroupOptions::master_port"
        : "MASTER_PORT";
    if (!port && claim.master_port) {
      port = claim.master_port;
      port_from = claim.master_port_from;
    }
    TORCH_CHECK_VALUE(port, unset("MASTER_PORT", " and no SLURM_JOB_ID is"));
    TORCH_CHECK_VALUE(
        0 < *port && *port < 65536,
        "lamp::dist: MASTER_PORT must be in [1, 65535], got ",
        *port,
        " (from ",
        port_from,
        ").");
    config.master_port = *port;
    claim.one_host = claim.one_host || is_loopback(config.master_addr);
  }
  // See Note [Launch environment]: the local rank is never guessed.
  if (claim.local_rank) {
    config.local_rank = *claim.local_rank;
  } else {
    TORCH_CHECK_VALUE(
        size == 1 || claim.one_host,
        "lamp::dist: launched by ",
        by,
        " as rank ",
        rank,
        " of ",
        size,
        " but the local rank (which picks the GPU) is not set and the ranks "
        "may run on several hosts; set LOCAL_RANK (torchrun does)",
        claim.launcher == Launcher::kSlurm ? " or start the tasks with srun, "
                                             "which sets SLURM_LOCALID"
                                           : "",
        ", or ProcessGroupOptions::local_rank.");
    config.local_rank = size == 1 ? 0 : rank;
  }
  const auto local = config.local_rank;
  TORCH_CHECK_VALUE(
      0 <= local && local <= rank,
      "lamp::dist: ",
      claim.local_rank_name,
      " is ",
      local,
      " but ",
      claim.rank_name,
      " is ",
      rank,
      "; the local rank must be in [0, rank] (launcher: ",
      by,
      ").");
  TORCH_CHECK_VALUE(
      !claim.local_world_size || local < *claim.local_world_size,
      "lamp::dist: ",
      claim.local_rank_name,
      " is ",
      local,
      " but the local world size is ",
      claim.local_world_size.value_or(0),
      " (launcher: ",
      by,
      ").");
  if (claim.launcher == Launcher::kTorchrun ||
      claim.launcher == Launcher::kEnv) {
    config.agent_store = v.text("TORCHELASTIC_USE_AGENT_STORE") == "True";
    config.restart_count = v.text("TORCHELASTIC_RESTART_COUNT").value_or("0");
  }
  return config;
}

c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(
      config.world_size > 1,
      "lamp::dist::rendezvous: a world of one process needs no store.");
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(config.master_port);
  options.numWorkers = config.world_size;
  options.timeout = timeout;
  const std::string where = config.master_addr + ":" +
      std::to_string(config.master_port) +
      " (launcher: " + to_string(config.launcher) + ", rank " +
      std::to_string(config.rank) + " of " + std::to_string(config.world_size) +
      ")";
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // NOTE: as torch.distributed's env:// rendezvous: under torchrun the
    // agent already serves the store and every worker is a client of it,
    // under a per-restart prefix; otherwise rank 0 serves it. Then the
    // ranks meet on it (detail::meet), which says whom it waits for.
    const auto start = std::chrono::steady_clock::now();
    options.isServer = !config.agent_store && config.rank == 0;
    options.waitWorkers = false;
    options.multiTenant = !config.agent_store;
    // NOTE: a client tries for kMeetPatience first, then says once that the
    // store is not there yet, then tries for the rest of the timeout.
    options.timeout = options.isServer
        ? timeout
        : std::min<std::chrono::milliseconds>(detail::kMeetPatience, timeout);
    c10::intrusive_ptr<c10d::TCPStore> tcp;
    try {
      tcp = c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
    } catch (const std::exception&) {
      const auto left = timeout -
          std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start);
      if (options.isServer || left.count() <= 0) {
        throw;
      }
      TORCH_WARN(
          "lamp::dist: rank ",
          config.rank,
          " is waiting for the store at ",
          where,
          " (served by ",
          config.agent_store ? "torchrun's agent" : "rank 0",
          "); it waits up to ",
          timeout.count() / 1000.0,
          " s in all");
      options.timeout = left;
      tcp = c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
    }
    tcp->setTimeout(timeout);
    store = tcp;
    if (config.agent_store) {
      store = c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + config.restart_count, tcp);
    }
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    detail::did_not_meet(
        config,
        where,
        timeout,
        error ? error->what_without_backtrace() : e.what());
  }
  detail::meet(*store, config, timeout, where);
  return store;
}

} // namespace lamp::dist
