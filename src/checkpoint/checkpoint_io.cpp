// save_checkpoint, load_checkpoint and CheckpointManager: files and ranks.

#include <lamp/checkpoint.h>

#include <lamp/distributed.h>

#include "archive.h"
#include "files.h"
#include "state_dict.h"

#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>

namespace lamp {
namespace {

using Dict = c10::impl::GenericDict;

// Version of the file layout; files of a higher one are refused.
constexpr int64_t kFormatVersion = 1;

std::string errno_text() {
  return std::strerror(errno);
}

// Note [Atomic checkpoint files]
// A save writes `.<name>.tmp.<pid>` in the target's folder (same file
// system, so that the rename is atomic), fsyncs it, renames it over the
// target and fsyncs the folder: after a crash or a SIGKILL at any point the
// target is the old complete file or the new complete one, never a mix. A
// killed save leaves its temporary file behind; it matches no checkpoint
// name, and CheckpointManager::save removes it.
void write_atomically(const std::string& path, const Dict& dict) {
  const auto folder = detail::parent_of(path);
  const auto tmp = folder + "/." + detail::file_name_of(path) + ".tmp." +
      std::to_string(::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", tmp, ": ", errno_text());
  try {
    detail::write_torch_archive(dict, [&](const void* data, size_t size) {
      const auto* p = static_cast<const char*>(data);
      while (size > 0) {
        const ssize_t n = ::write(fd, p, size);
        if (n < 0 && errno == EINTR) {
          continue;
        }
        TORCH_CHECK(n > 0, "writing ", tmp, ": ", errno_text());
        p += n;
        size -= static_cast<size_t>(n);
      }
    });
    TORCH_CHECK(::fsync(fd) == 0, "flushing ", tmp, ": ", errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const auto why = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "writing ", path, ": ", why);
  }
  // NOTE: the rename is durable once the folder's entry is.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

bool several(const std::shared_ptr<dist::ProcessGroup>& pg) {
  return pg && pg->world_size() > 1;
}

// IValues through the store (host bytes), in LibTorch's own pickle format.
std::string to_bytes(const c10::IValue& value) {
  const auto bytes = torch::pickle_save(value);
  return std::string(bytes.begin(), bytes.end());
}
c10::IValue from_bytes(const std::string& bytes) {
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

// Every rank posts `status` ("" = fine); throws on every rank the first
// failure, so that no rank carries on alone or waits for a dead one.
void agree(
    const std::shared_ptr<dist::ProcessGroup>& pg,
    const std::string& status) {
  const auto all = pg->allgather(status);
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r].empty(), "rank ", r, ": ", all[r]);
  }
}

Dict metadata(int64_t step, int64_t world_size) {
  Dict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", kFormatVersion);
  meta.insert("step", step);
  meta.insert("world_size", world_size);
  return meta;
}

std::string message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

} // namespace

void save_checkpoint(
    const TrainingState& state,
    const std::string& path,
    int64_t step,
    const std::shared_ptr<dist::ProcessGroup>& pg) {
  const std::string context = "lamp::save_checkpoint: " + path + ": ";
  if (!several(pg)) {
    try {
      auto dict = state.state_dict();
      dict.insert("lamp", metadata(step, 1));
      write_atomically(path, dict);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, context, e.what_without_backtrace());
    }
    return;
  }
  // Every rank's step and RNG state to every rank (host bytes, store).
  const auto mine = to_bytes(c10::ivalue::Tuple::create(
      {step, state.rng() ? c10::IValue(detail::rng_state()) : c10::IValue()}));
  const auto all = pg->allgather(mine);
  c10::impl::GenericList rngs(c10::AnyType::get());
  for (size_t r = 0; r < all.size(); ++r) {
    const auto entry = from_bytes(all[r]).toTuple();
    TORCH_CHECK(
        entry->elements()[0].toInt() == step,
        context,
        "the ranks disagree on the step: rank 0 saves step ",
        step,
        ", rank ",
        r,
        " step ",
        entry->elements()[0].toInt(),
        "; call save on every rank at the same step");
    rngs.push_back(entry->elements()[1]);
  }
  std::string status;
  if (pg->rank() == 0) {
    try {
      auto dict = state.state_dict();
      if (state.rng()) {
        dict.insert_or_assign("rng", rngs);
      }
      dict.insert("lamp", metadata(step, pg->world_size()));
      write_atomically(path, dict);
    } catch (const std::exception& e) {
      status = context + message(e);
    }
  }
  agree(pg, status); // NOTE: also the barrier: rank 0 has written
}

int64_t load_checkpoint(
    TrainingState& state,
    const std::string& path,
    const std::shared_ptr<dist::ProcessGroup>& pg) {
  const std::string context = "lamp::load_checkpoint: " + path + ": ";
  int64_t step = 0;
  std::string status;
  try {
    TORCH_CHECK(
        detail::is_regular_file(path), "no such file (or not a regular file)");
    const auto value = detail::read_torch_archive(path);
    TORCH_CHECK(
        value.isGenericDict(),
        "not a checkpoint: holds a ",
        value.tagKind(),
        ", not a dict");
    const auto dict = value.toGenericDict();
    if (dict.contains("lamp")) {
      const auto& meta = dict.at("lamp");
      TORCH_CHECK(
          meta.isGenericDict() &&
              meta.toGenericDict().contains("format_version") &&
              meta.toGenericDict().at("format_version").isInt(),
          "key 'lamp' should hold the format version");
      const auto m = meta.toGenericDict();
      const auto version = m.at("format_version").toInt();
      TORCH_CHECK(
          version <= kFormatVersion,
          "written by a newer lamp (checkpoint format ",
          version,
          "; this lamp reads up to ",
          kFormatVersion,
          "): upgrade lamp");
      if (m.contains("step") && m.at("step").isInt()) {
        step = m.at("step").toInt();
      }
    }
    state.load_state_dict(dict, pg ? pg->rank() : 0);
  } catch (const std::exception& e) {
    status = message(e);
    // NOTE: messages from the file reader already name the file.
    if (status.rfind(path, 0) != 0) {
      status = context + status;
    } else {
      status = "lamp::load_checkpoint: " + status;
    }
    if (!several(pg)) {
      TORCH_CHECK(false, status);
    }
  }
  if (several(pg)) {
    agree(pg, status);
    const auto steps = pg->allgather(std::to_string(step));
    for (size_t r = 0; r < steps.size(); ++r) {
      TORCH_CHECK(
          steps[r] == steps[0],
          context,
          "the ranks loaded different checkpoints: rank 0 step ",
          steps[0],
          ", rank ",
          r,
          " step ",
          steps[r],
          " (is the folder shared by all ranks?)");
    }
  }
  return step;
}

CheckpointManager::CheckpointManager(
    std::string dir,
    CheckpointManagerOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
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

std::vector<std::pair<int64_t, std::string>> CheckpointManager::list() const {
  const std::regex name(
      std::regex_replace(
          options_.prefix(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
      R"(-(\d+)\.pt)");
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& file : detail::list_directory(dir_)) {
    std::smatch match;
    const auto path = dir_ + "/" + file;
    if (std::regex_match(file, match, name) && detail::is_regular_file(path)) {
      out.emplace_back(std::stoll(match[1]), path);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
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
  save_checkpoint(state, path, step, pg);
  if (writer && options_.keep_last() > 0) {
    auto all = list();
    const auto keep = static_cast<size_t>(options_.keep_last());
    for (size_t i = 0; i + keep < all.size(); ++i) {
      detail::remove_file(all[i].second);
    }
  }
  return path;
}

std::optional<int64_t> CheckpointManager::load_latest(TrainingState& state) {
  const auto path = latest();
  const auto& pg = options_.process_group();
  if (several(pg)) {
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
