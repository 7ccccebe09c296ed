// save_checkpoint and load_checkpoint: files and ranks.

#include <lamp/checkpoint.h>

#include <lamp/dist/process_group.h>

#include "archive.h"
#include "files.h"
#include "python_state.h"
#include "save.h"

#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

namespace lamp {
namespace {

using Dict = c10::impl::GenericDict;

// A save asks the disk to start writing every this many bytes.
constexpr uint64_t kFlushEvery = 16 << 20;

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
} // namespace

void detail::write_atomically(const std::string& path, const Dict& dict) {
  const auto folder = detail::parent_of(path);
  const auto tmp = folder + "/." + detail::file_name_of(path) + ".tmp." +
      std::to_string(::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", tmp, ": ", errno_text());
  try {
    // Bytes written, and how many of them the disk was asked to take.
    uint64_t written = 0;
    uint64_t flushing = 0;
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
        written += static_cast<uint64_t>(n);
      }
      // The disk writes what is in the page cache while more is copied in,
      // so that the fsync below waits only for the last stretch. A hint:
      // its failure changes nothing (the fsync still checks everything).
      if (written - flushing >= kFlushEvery) {
#ifdef SYNC_FILE_RANGE_WRITE
        (void)::sync_file_range(
            fd,
            static_cast<off_t>(flushing),
            static_cast<off_t>(written - flushing),
            SYNC_FILE_RANGE_WRITE);
#endif
        flushing = written;
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

bool detail::several(const std::shared_ptr<dist::ProcessGroup>& pg) {
  return pg && pg->world_size() > 1;
}

namespace {

using detail::several;

// IValues through the store (host bytes), in LibTorch's own pickle format.
std::string to_bytes(const c10::IValue& value) {
  const auto bytes = torch::pickle_save(value);
  return std::string(bytes.begin(), bytes.end());
}
c10::IValue from_bytes(const std::string& bytes) {
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

} // namespace

void detail::agree_on(
    const std::shared_ptr<dist::ProcessGroup>& pg,
    const std::string& status) {
  const auto all = pg->allgather(status);
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r].empty(), "rank ", r, ": ", all[r]);
  }
}

namespace {

Dict metadata(int64_t step, int64_t world_size) {
  Dict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", kFormatVersion);
  meta.insert("step", step);
  meta.insert("world_size", world_size);
  return meta;
}

} // namespace

std::string detail::message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

c10::impl::GenericDict detail::detach_from_live_tensors(const Dict& dict) {
  // NOTE: a tensor that state_dict() copied from a device has its storage
  // to itself; one that something else also holds is a live tensor (a CPU
  // parameter, buffer or optimizer state) that the next step changes.
  // A tensor listed twice (a tied weight's two names) is held by the dict
  // twice: only holders beyond those make it shared (counted before any
  // copy of the dict holds it too), and it is copied once, so that the two
  // names still share one storage in the file.
  struct Seen {
    size_t listed = 0;
    long holders = 0; // use_count() at first sight
    at::Tensor copy;
  };
  std::unordered_map<const c10::TensorImpl*, Seen> seen;
  plain_copy(dict, [&](const at::Tensor& t) -> c10::IValue {
    if (t.defined()) {
      auto& s = seen[t.unsafeGetTensorImpl()];
      if (s.listed++ == 0) {
        s.holders = static_cast<long>(t.use_count());
      }
    }
    return c10::IValue(); // this pass only counts
  });
  return plain_copy(
             dict,
             [&](const at::Tensor& t) -> c10::IValue {
               if (!t.defined()) {
                 return t;
               }
               auto& s = seen[t.unsafeGetTensorImpl()];
               const bool shared = s.holders > static_cast<long>(s.listed) ||
                   (t.has_storage() && t.storage().use_count() > 1);
               if (!shared) {
                 return t;
               }
               if (!s.copy.defined()) {
                 s.copy = t.clone();
               }
               return s.copy;
             })
      .toGenericDict();
}

detail::SaveSnapshot detail::take_snapshot(
    const TrainingState& state,
    int64_t step,
    const std::shared_ptr<dist::ProcessGroup>& pg,
    const std::string& context) {
  SaveSnapshot out;
  if (!several(pg)) {
    try {
      auto dict = state.state_dict();
      dict.insert("lamp", metadata(step, 1));
      out.dict = std::move(dict);
    } catch (const std::exception& e) {
      out.error = context + message_of(e);
    }
    return out;
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
  if (pg->rank() == 0) {
    try {
      auto dict = state.state_dict();
      if (state.rng()) {
        dict.insert_or_assign("rng", rngs);
      }
      dict.insert("lamp", metadata(step, pg->world_size()));
      out.dict = std::move(dict);
    } catch (const std::exception& e) {
      out.error = context + message_of(e);
    }
  }
  return out;
}

void save_checkpoint(
    const TrainingState& state,
    const std::string& path,
    int64_t step,
    const std::shared_ptr<dist::ProcessGroup>& pg) {
  const std::string context = "lamp::save_checkpoint: " + path + ": ";
  auto snapshot = detail::take_snapshot(state, step, pg, context);
  std::string status = snapshot.error;
  if (snapshot.dict && status.empty()) {
    try {
      detail::write_atomically(path, *snapshot.dict);
    } catch (const std::exception& e) {
      status = context + detail::message_of(e);
    }
  }
  if (!several(pg)) {
    TORCH_CHECK(status.empty(), status);
    return;
  }
  detail::agree_on(pg, status); // NOTE: also the barrier: rank 0 has written
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
    status = detail::message_of(e);
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
    detail::agree_on(pg, status);
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

} // namespace lamp
