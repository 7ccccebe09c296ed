#pragma once

// Internal: what each launcher's environment says about this process (see
// Note [Launch environment] in launch.cpp).

#include <lamp/dist/launch.h>
#include <lamp/export.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lamp::dist::detail {

/// Every environment variable `launch_config` reads (torchrun, Slurm, Open
/// MPI, PMI): `launch_config(options)` copies these from the process
/// environment; tests clear them to run in a known environment.
LAMP_API const std::vector<std::string>& launcher_variables();

/// Lookups in an Environment; an empty variable counts as unset, a
/// malformed integer is a c10::ValueError naming it.
class Variables {
 public:
  explicit Variables(const Environment& env) : env_(env) {}

  std::optional<std::string> text(const std::string& name) const {
    const auto it = env_.find(name);
    if (it == env_.end() || it->second.empty()) {
      return std::nullopt;
    }
    return it->second;
  }

  std::optional<int64_t> integer(const std::string& name) const {
    const auto value = text(name);
    if (!value) {
      return std::nullopt;
    }
    size_t used = 0;
    int64_t number = 0;
    try {
      number = std::stoll(*value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK_VALUE(
        used == value->size(),
        "lamp::dist: environment variable ",
        name,
        "='",
        *value,
        "' is not an integer.");
    return number;
  }

  // The first of `names` that is set, and its name.
  std::pair<std::optional<int64_t>, std::string> first_integer(
      std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (auto value = integer(name)) {
        return {value, name};
      }
    }
    return {std::nullopt, *names.begin()};
  }

 private:
  const Environment& env_;
};

/// What one source (options and torchrun's variables, or one launcher)
/// says about this process.
struct Claim {
  Launcher launcher = Launcher::kNone;
  std::optional<int64_t> rank, world_size, local_rank, local_world_size;
  std::string rank_name, world_size_name, local_rank_name;
  bool one_host = false; // every rank certainly runs on this host
  std::string master_addr; // a default (Slurm)
  std::optional<int64_t> master_port;
  std::string master_port_from;
};

/// How to launch with `launcher` (for messages); `world_size` > 1 fills in
/// the process count.
std::string how_to_launch(Launcher launcher, int64_t world_size);

/// The first launcher present, Open MPI, PMI, then Slurm, or an empty Claim.
/// Partial or conflicting sets throw c10::ValueError.
Claim read_launcher(const Variables& v);

} // namespace lamp::dist::detail
