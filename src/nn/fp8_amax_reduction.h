#pragma once

// Internal: delayed FP8 scaling's amax reduction over the ranks
// (Fp8Recipe::amax_group), one all-reduce for every layer of a forward
// pass. See Note [FP8 amax reduction] in fp8_amax_reduction.cpp.

#include <lamp/dist/process_group.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace lamp::nn::detail {

/// Before a delayed layer's scale update: its newest amaxes (`history`'s
/// column 0) reduced to their maximum over `group`, in place; done for
/// every layer this thread has updated with `group` at once, on the first
/// update of a forward pass, and skipped for the others' updates that pass.
void fp8_reduce_amaxes(const at::Tensor& history, dist::ProcessGroup& group);

/// One all-reduce (max) over `group` of the newest amaxes (column 0) of
/// `histories`, all on one device, in place; every rank passes the same
/// layers in the same order.
void fp8_reduce_newest_amaxes(
    const std::vector<at::Tensor>& histories,
    dist::ProcessGroup& group);

} // namespace lamp::nn::detail
