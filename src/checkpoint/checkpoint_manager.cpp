// CheckpointManager: a folder of numbered checkpoints, and saves written by
// a background thread (async_save).

#include <lamp/checkpoint.h>

#include <lamp/dist/process_group.h>

#include "files.h"
#include "save.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <thread>

namespace lamp {

// Note [Background checkpoint saves]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With async_save, save() takes the state's dict on the caller's thread
// (state_dict() copies device tensors to host memory; live CPU tensors are
// cloned), which is the only pause of training, and hands it to one
// thread that writes the file and deletes old ones. That thread touches
// nothing but its own copies: the dict, the folder's name and options, and
// its `error` string, which the caller's thread reads only after joining
// it (wait(), the next save(), load_latest(), the destructor). A process
// killed mid-write leaves a temporary file, never a torn checkpoint (Note
// [Atomic checkpoint files]).
struct CheckpointManager::Pending {
  std::thread thread;
  std::string error; // written by the thread, read after join
};

namespace {

std::vector<std::pair<int64_t, std::string>> checkpoints_in(
    const std::string& dir,
    const std::string& prefix) {
  const std::regex name(
      std::regex_replace(
          prefix, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
      R"(-(\d+)\.pt)");
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& file : detail::list_directory(dir)) {
    std::smatch match;
    const auto path = dir + "/" + file;
    if (std::regex_match(file, match, name) && detail::is_regular_file(path)) {
      out.emplace_back(std::stoll(match[1]), path);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Deletes the checkpoints beyond the newest keep_last.
void remove_old(
    const std::string& dir,
    const CheckpointManagerOptions& options) {
  if (options.keep_last() <= 0) {
    return;
  }
  const auto all = checkpoints_in(dir, options.prefix());
  const auto keep = static_cast<size_t>(options.keep_last());
  for (size_t i = 0; i + keep < all.size(); ++i) {
    detail::remove_file(all[i].second);
  }
}

} // namespace

CheckpointManager::CheckpointManager(
    std::string dir,
    CheckpointManagerOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  // NOTE: the checks below may throw: nothing in flight to wait for then.
  TORCH_CHECK_VALUE(
      options_.keep_last() >= 0,
      "lamp::CheckpointManagerOptions::keep_last must be >= 0 (0 keeps "
      "all), got ",
      options_.keep_last());
  TORCH_CHECK_VALUE(
      !options_.prefix().empty() &&
          options_.prefix().find('/') == std::string::npos,
      "lamp::CheckpointManagerOptions::prefix must be a non-empty file name "
      "prefix, got '",
      options_.prefix(),
      "'");
  try {
    detail::make_directories(dir_);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lamp::CheckpointManager: ", e.what_without_backtrace());
  }
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const c10::Error& e) {
    TORCH_WARN(e.what_without_backtrace());
  }
}

std::vector<std::pair<int64_t, std::string>> CheckpointManager::list() const {
  return checkpoints_in(dir_, options_.prefix());
}

std::optional<std::string> CheckpointManager::latest() const {
  const auto all = list();
  if (all.empty()) {
    return std::nullopt;
  }
  return all.back().second;
}

std::string CheckpointManager::save(const TrainingState& state, int64_t step) {
  TORCH_CHECK_VALUE(
      step >= 0, "lamp::CheckpointManager::save: step must be >= 0");
  wait(); // at most one save in flight; throws the last one's error
  char name[32];
  std::snprintf(name, sizeof name, "-%09lld.pt", static_cast<long long>(step));
  const auto path = dir_ + "/" + options_.prefix() + name;
  const auto& pg = options_.process_group();
  const bool writer = !pg || pg->rank() == 0;
  if (writer) {
    // Temporary files of killed saves (Note [Atomic checkpoint files]).
    const auto stale = "." + options_.prefix() + "-";
    for (const auto& file : detail::list_directory(dir_)) {
      if (file.rfind(stale, 0) == 0 &&
          file.find(".pt.tmp.") != std::string::npos) {
        detail::remove_file(dir_ + "/" + file);
      }
    }
  }
  if (!options_.async_save()) {
    save_checkpoint(state, path, step, pg);
    if (writer) {
      remove_old(dir_, options_);
    }
    return path;
  }
  const std::string context = "lamp::save_checkpoint: " + path + ": ";
  auto snapshot = detail::take_snapshot(state, step, pg, context);
  if (detail::several(pg)) {
    detail::agree_on(pg, snapshot.error);
  } else {
    TORCH_CHECK(snapshot.error.empty(), snapshot.error);
  }
  if (!writer) {
    return path;
  }
  auto dict = detail::detach_from_live_tensors(*snapshot.dict);
  pending_ = std::make_unique<Pending>();
  // NOTE: the thread owns copies of what it uses (not `this`): the dict, no
  // longer shared with the live state, and the folder's options.
  pending_->thread = std::thread([dict = std::move(dict),
                                  path,
                                  context,
                                  dir = dir_,
                                  options = options_,
                                  error = &pending_->error] {
    try {
      detail::write_atomically(path, dict);
      remove_old(dir, options);
    } catch (const std::exception& e) {
      *error = context + detail::message_of(e);
    }
  });
  return path;
}

void CheckpointManager::wait() {
  if (!pending_) {
    return;
  }
  pending_->thread.join();
  const auto error = std::move(pending_->error);
  pending_.reset();
  TORCH_CHECK(
      error.empty(),
      "lamp::CheckpointManager: the background save failed (the previous "
      "checkpoints are intact): ",
      error);
}

std::optional<int64_t> CheckpointManager::load_latest(TrainingState& state) {
  wait();
  const auto path = latest();
  const auto& pg = options_.process_group();
  if (detail::several(pg)) {
    // NOTE: before any rank starts loading: one that found nothing must not
    // leave the others waiting in load_checkpoint's collectives.
    const auto name = path ? detail::file_name_of(*path) : "(none)";
    const auto all = pg->allgather(name);
    for (size_t r = 0; r < all.size(); ++r) {
      TORCH_CHECK(
          all[r] == all[0],
          "lamp::CheckpointManager::load_latest: ranks see different newest "
          "checkpoints in ",
          dir_,
          ": rank 0 ",
          all[0],
          ", rank ",
          r,
          " ",
          all[r],
          " (every rank must see the same folder)");
    }
  }
  if (!path) {
    return std::nullopt;
  }
  return load_checkpoint(state, *path, pg);
}

} // namespace lamp
