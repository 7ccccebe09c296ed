#pragma once

// Where a process stands in a training job (rank, world size, local rank)
// and where the ranks meet: from `ProcessGroupOptions` and the environment
// of the launcher that started it (torchrun, Slurm's srun, Open MPI's or
// MPICH's mpirun).

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <lamp/export.h>

namespace c10d {
class Store;
} // namespace c10d

namespace lamp::dist {

/// How to join the process group. A field left unset comes from the
/// launcher's environment (see `launch_config`); a field set here wins over
/// the environment.
struct LAMP_API ProcessGroupOptions {
  /// This process's rank in [0, world_size). Default: from the launcher
  /// ($RANK under torchrun).
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  /// Number of processes. Default: from the launcher ($WORLD_SIZE under
  /// torchrun), or 1 when no launcher is found (a plain run).
  TORCH_ARG(std::optional<int64_t>, world_size) = std::nullopt;
  /// Rank on this host, which picks the CUDA device. Default: from the
  /// launcher ($LOCAL_RANK under torchrun); never guessed when the ranks may
  /// span several hosts.
  TORCH_ARG(std::optional<int64_t>, local_rank) = std::nullopt;
  /// Host of rank 0's store. Default: $MASTER_ADDR, under Slurm the first
  /// host of the step's node list.
  TORCH_ARG(std::string, master_addr) = "";
  /// Port of rank 0's store. Default: $MASTER_PORT, under Slurm
  /// 10000 + $SLURM_JOB_ID % 50000.
  TORCH_ARG(std::optional<int64_t>, master_port) = std::nullopt;
  /// How long rendezvous, communicator set-up and each collective may take
  /// before they fail. A collective still running after this long aborts
  /// the communicator; the next call on the group then throws on every
  /// rank still alive. Default: 10 minutes.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
  /// Create the communicator (NCCL or Gloo, see `backend`). With false a
  /// group of several processes has only the store: `allgather()` and
  /// `barrier()` work, `allreduce()`/`broadcast()` throw; for coordinating
  /// host-side work. Default: true.
  TORCH_ARG(bool, nccl) = true;
  /// What joins the ranks, as torch.distributed.init_process_group's
  /// `backend`: "nccl" (one CUDA device per process, tensors on it), "gloo"
  /// (tensors on the CPU, collectives over TCP; lamp built with Gloo), or
  /// "auto": NCCL where the host has CUDA devices, Gloo where it has none.
  /// Default: "auto".
  TORCH_ARG(std::string, backend) = "auto";
};

/// The launcher `launch_config` found.
enum class Launcher {
  /// No launcher: a plain run, a world of one process.
  kNone,
  /// Rank and world size given in `ProcessGroupOptions`.
  kOptions,
  /// torchrun (RANK, WORLD_SIZE, ... with TORCHELASTIC_* variables).
  kTorchrun,
  /// RANK and WORLD_SIZE set without torchrun (by hand or another tool).
  kEnv,
  /// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...).
  kSlurm,
  /// Open MPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, ...).
  kOpenMpi,
  /// MPICH / Intel MPI (Hydra) or another PMI launcher (PMI_RANK, PMI_SIZE).
  kPmi,
};

/// "torchrun", "Slurm", ...: the launcher's name as error messages use it.
LAMP_API const char* to_string(Launcher launcher);

/// Where this process stands, after options and environment are merged and
/// checked.
struct LAMP_API LaunchConfig {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int64_t master_port = 0;
  /// torchrun's agent already runs the store (TORCHELASTIC_USE_AGENT_STORE):
  /// every rank, rank 0 included, connects to it as a client.
  bool agent_store = false;
  /// torchrun's restart count, part of the store's key prefix.
  std::string restart_count = "0";
  /// Which launcher started this process.
  Launcher launcher = Launcher::kNone;
};

/// Environment variables by name; a variable that is empty counts as unset.
using Environment = std::map<std::string, std::string>;

/// Merges `options` with the launch environment and checks the result.
///
/// Precedence: a field set in `options`, then torchrun's variables (RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
/// then, only when neither gives a rank or a world size, the first launcher
/// found of Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), PMI (PMI_RANK,
/// PMI_SIZE, MPI_LOCALRANKID: MPICH, Intel MPI) and Slurm (SLURM_PROCID,
/// SLURM_NTASKS, SLURM_LOCALID). Without any launcher the process is a
/// world of one.
///
/// A launcher that says world > 1 never yields a world of one: missing,
/// partial, malformed or conflicting values throw `c10::ValueError` naming
/// the launcher, the variable and how to launch. The local rank is taken
/// from LOCAL_RANK or the launcher, or is the rank when every rank is
/// certainly on this host (LOCAL_WORLD_SIZE equals WORLD_SIZE, a one-node
/// Slurm step, or a loopback MASTER_ADDR); otherwise it is an error.
///
/// Under Slurm the master address defaults to the first host of
/// SLURM_STEP_NODELIST (else SLURM_NODELIST; bracketed ranges such as
/// `gpu[01-04,07]` expand) and the port to 10000 + SLURM_JOB_ID % 50000.
/// Open MPI and PMI give no address: MASTER_ADDR and MASTER_PORT are
/// required there.
LAMP_API LaunchConfig launch_config(const ProcessGroupOptions& options = {});

/// As `launch_config(options)`, reading `environment` instead of the
/// process's environment.
LAMP_API LaunchConfig launch_config(
    const ProcessGroupOptions& options,
    const Environment& environment);

/// The key-value store all ranks share: rank 0 serves a c10d::TCPStore at
/// master_addr:master_port (or torchrun's agent does), the others connect.
/// Blocks until every rank has joined or `timeout` passes (then throws
/// `c10::DistStoreError`). Keys are prefixed as torch.distributed's env://
/// rendezvous does under torchrun. Not needed (and not created) when
/// world_size is 1. Include <torch/csrc/distributed/c10d/Store.hpp> to use
/// the store.
LAMP_API c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout);

} // namespace lamp::dist
