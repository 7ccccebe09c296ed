#pragma once

// Internal: Slurm's compressed host lists (SLURM_NODELIST).

#include <cstddef>
#include <string>
#include <vector>

#include <lamp/export.h>

namespace lamp::dist::detail {

/// Expands a Slurm host list such as `gpu[01-04,07],login1` into host names
/// in order (`gpu01 gpu02 gpu03 gpu04 gpu07 login1`), as `scontrol show
/// hostnames` does: comma-separated entries, each a name with any number of
/// bracketed sets of numbers and ranges (`a[1-2]-b[3,5]` is the product;
/// zero padding follows the range's first number). Throws `c10::ValueError`
/// naming `variable` on malformed input or more than `max_hosts` hosts.
LAMP_API std::vector<std::string> expand_slurm_hostlist(
    const std::string& list,
    const std::string& variable = "SLURM_NODELIST",
    size_t max_hosts = 1 << 20);

} // namespace lamp::dist::detail
