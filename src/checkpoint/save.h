#pragma once

// Internal: the two halves of a checkpoint save, shared by save_checkpoint
// (checkpoint_io.cpp) and CheckpointManager's background saves
// (checkpoint_manager.cpp): the dict to write, taken at a step boundary,
// and the atomic write of it.

#include <lamp/checkpoint.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace lamp::detail {

/// What a save writes, taken from the live state.
struct SaveSnapshot {
  /// The file's dict, on the rank that writes (rank 0); empty on the others.
  std::optional<c10::impl::GenericDict> dict;
  /// Why it could not be taken on this rank ("" if it was): with several
  /// ranks the caller agrees on it (agree_on), so that every rank throws.
  std::string error;
};

/// The dict of a checkpoint of `state` at `step`. With a process group of
/// several ranks every rank must call it (it gathers the ranks' steps and
/// RNG states; ranks that disagree on the step throw on every rank).
/// Messages start with `context`.
SaveSnapshot take_snapshot(
    const TrainingState& state,
    int64_t step,
    const std::shared_ptr<dist::ProcessGroup>& process_group,
    const std::string& context);

/// Whether `process_group` has several ranks.
bool several(const std::shared_ptr<dist::ProcessGroup>& process_group);

/// Every rank posts `status` ("" = fine); throws on every rank the first
/// failure, so that no rank carries on alone or waits for a dead one.
void agree_on(
    const std::shared_ptr<dist::ProcessGroup>& process_group,
    const std::string& status);

/// Writes `dict` to `path` atomically (Note [Atomic checkpoint files]).
void write_atomically(
    const std::string& path,
    const c10::impl::GenericDict& dict);

/// `dict` with a copy of each tensor whose storage something else holds too
/// (a live CPU tensor: `state_dict()` copies only device tensors), so that
/// training can go on while a thread writes the dict.
c10::impl::GenericDict detach_from_live_tensors(
    const c10::impl::GenericDict& dict);

/// The message of `e` without a backtrace.
std::string message_of(const std::exception& e);

} // namespace lamp::detail
