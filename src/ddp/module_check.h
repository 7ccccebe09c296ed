#pragma once

// Internal: DistributedDataParallel's construction-time checks that every
// rank wraps the same module, placed on its device.

#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp::dist {
class ProcessGroup;
} // namespace lamp::dist

namespace lamp::detail {

/// Throws unless every tensor is a dense tensor on `device`, naming the
/// first that is not (`kind`: "parameter" or "buffer").
void check_on_device(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& tensors,
    const char* kind,
    c10::Device device);

/// One line per tensor, what every rank must agree on: kind, name, dtype,
/// sizes and strides.
std::vector<std::string> describe_tensors(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& tensors,
    const char* kind);

/// Throws on every rank, naming the first difference, unless all ranks
/// describe the same module (one allgather through the store).
void check_same_module(
    const std::vector<std::string>& mine,
    dist::ProcessGroup& pg);

} // namespace lamp::detail
