#include <lamp/distributed.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <string>

namespace lamp::dist {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

std::string launch_hint(int64_t world_size) {
  return "launch with `torchrun --no-python --nproc_per_node=" +
      std::to_string(world_size > 1 ? world_size : 2) +
      " ./program` (single host), or set RANK, WORLD_SIZE, LOCAL_RANK, "
      "MASTER_ADDR and MASTER_PORT for every process";
}

// `option` if set, else the integer in environment variable `name`.
std::optional<int64_t> integer(
    const std::optional<int64_t>& option,
    const char* name) {
  if (option) {
    return option;
  }
  const auto text = env(name);
  if (!text) {
    return std::nullopt;
  }
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(
      used == text->size(),
      "lamp::dist: environment variable ",
      name,
      "='",
      *text,
      "' is not an integer.");
  return value;
}

} // namespace

LaunchConfig launch_config(const ProcessGroupOptions& options) {
  LaunchConfig config;
  const auto rank = integer(options.rank(), "RANK");
  const auto world_size = integer(options.world_size(), "WORLD_SIZE");
  if (!rank && !world_size) {
    return config; // a plain run: one process, no rendezvous
  }
  const int64_t size = world_size.value_or(0);
  TORCH_CHECK(
      world_size,
      "lamp::dist: RANK is ",
      *rank,
      " but WORLD_SIZE is not set; ",
      launch_hint(0),
      ".");
  TORCH_CHECK(
      size >= 1, "lamp::dist: WORLD_SIZE must be >= 1, got ", size, ".");
  TORCH_CHECK(
      rank,
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but RANK is not set; ",
      launch_hint(size),
      ".");
  TORCH_CHECK(
      0 <= *rank && *rank < size,
      "lamp::dist: RANK is ",
      *rank,
      " but WORLD_SIZE is ",
      size,
      "; RANK must be in [0, WORLD_SIZE).");
  config.rank = *rank;
  config.world_size = size;
  config.local_rank =
      integer(options.local_rank(), "LOCAL_RANK").value_or(config.rank);
  TORCH_CHECK(
      0 <= config.local_rank && config.local_rank <= config.rank,
      "lamp::dist: LOCAL_RANK is ",
      config.local_rank,
      " but RANK is ",
      config.rank,
      "; LOCAL_RANK must be in [0, RANK].");
  if (size == 1) {
    return config;
  }
  config.master_addr = options.master_addr().empty()
      ? env("MASTER_ADDR").value_or("")
      : options.master_addr();
  TORCH_CHECK(
      !config.master_addr.empty(),
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but MASTER_ADDR is not set; ",
      launch_hint(size),
      ".");
  const auto port = integer(options.master_port(), "MASTER_PORT");
  TORCH_CHECK(
      port,
      "lamp::dist: WORLD_SIZE is ",
      size,
      " but MASTER_PORT is not set; ",
      launch_hint(size),
      ".");
  TORCH_CHECK(
      0 < *port && *port < 65536,
      "lamp::dist: MASTER_PORT must be in [1, 65535], got ",
      *port,
      ".");
  config.master_port = *port;
  config.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
  config.restart_count = env("TORCHELASTIC_RESTART_COUNT").value_or("0");
  return config;
}

c10::intrusive_ptr<c10d::Store> rendezvous(
    const LaunchConfig& config,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK(
      config.world_size > 1,
      "lamp::dist::rendezvous: a world of one process needs no store.");
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(config.master_port);
  options.numWorkers = config.world_size;
  options.timeout = timeout;
  // NOTE: as torch.distributed's env:// rendezvous: under torchrun the
  // agent already serves the store and every worker is a client of it,
  // under a per-restart prefix; otherwise rank 0 serves it.
  if (config.agent_store) {
    options.isServer = false;
    options.waitWorkers = false;
    auto store =
        c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + config.restart_count, store);
  }
  options.isServer = config.rank == 0;
  options.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
}

} // namespace lamp::dist
