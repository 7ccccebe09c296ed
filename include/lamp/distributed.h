#pragma once

// Data-parallel training over NCCL, launched like PyTorch's
// (`torchrun --no-python --nproc_per_node=N ./program`, env:// rendezvous).
//
// NOTE: in progress. This header has the process-group bootstrap (launch
// environment, TCPStore rendezvous); the NCCL communicator, collectives and
// lamp::DistributedDataParallel come next.

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <lamp/export.h>

namespace lamp::dist {

/// How to join the process group. Every field left unset is read from the
/// environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT).
struct LAMP_API ProcessGroupOptions {
  /// This process's rank in [0, world_size). Default: $RANK.
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  /// Number of processes. Default: $WORLD_SIZE, or 1 when neither it nor
  /// $RANK is set (a plain, non-distributed run).
  TORCH_ARG(std::optional<int64_t>, world_size) = std::nullopt;
  /// Rank on this host, which picks the CUDA device. Default: $LOCAL_RANK,
  /// else the rank.
  TORCH_ARG(std::optional<int64_t>, local_rank) = std::nullopt;
  /// Host of rank 0's store. Default: $MASTER_ADDR.
  TORCH_ARG(std::string, master_addr) = "";
  /// Port of rank 0's store. Default: $MASTER_PORT.
  TORCH_ARG(std::optional<int64_t>, master_port) = std::nullopt;
  /// How long rendezvous and collectives may take before they fail.
  /// Default: 10 minutes.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
};

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
};

/// Merges `options` with the launch environment and checks the result.
/// Missing or inconsistent values throw `c10::Error` naming the variable and
/// how to launch, e.g. "WORLD_SIZE is 2 but RANK is not set; launch with
/// `torchrun --no-python --nproc_per_node=2 ./program`".
LAMP_API LaunchConfig launch_config(const ProcessGroupOptions& options = {});

/// The key-value store all ranks share: rank 0 serves a c10d::TCPStore at
/// master_addr:master_port (or torchrun's agent does), the others connect.
/// Blocks until every rank has joined or `timeout` passes (then throws).
/// Keys are prefixed as torch.distributed's env:// rendezvous does under
/// torchrun. Not needed (and not created) when world_size is 1.
LAMP_API c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout);

} // namespace lamp::dist
