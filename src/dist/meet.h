#pragma once

// Internal: the ranks' meeting on their store at rendezvous, which says who
// it is waiting for.

#include <lamp/dist/launch.h>

#include <chrono>
#include <string>

namespace lamp::dist::detail {

/// After this long without every rank, a rank says once whom it waits for.
constexpr std::chrono::seconds kMeetPatience{5};

/// Returns once every rank of `config` has called it on `store` (every rank
/// calls it once per process group, in the same order). A rank that has
/// waited `kMeetPatience` warns once (TORCH_WARN) which ranks are missing,
/// at `where`, and for how long it will wait; past `timeout` it throws
/// c10::DistStoreError naming them.
void meet(
    c10d::Store& store,
    const LaunchConfig& config,
    std::chrono::milliseconds timeout,
    const std::string& where);

/// Throws the c10::DistStoreError of ranks that did not meet at `where`
/// within `timeout`: `what` went wrong, and a hint for the launcher.
[[noreturn]] void did_not_meet(
    const LaunchConfig& config,
    const std::string& where,
    std::chrono::milliseconds timeout,
    const std::string& what);

} // namespace lamp::dist::detail
