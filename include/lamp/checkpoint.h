#pragma once

// Whole-run checkpoints: model, optimizers, loss scaler, schedulers,
// counters, RNG states and user values in one file that Python's
// `torch.load(path, weights_only=True)` opens, written atomically, resumed
// bit for bit.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lamp/export.h>
#include <lamp/state_dict.h>

namespace lamp {
namespace dist {
class ProcessGroup;
} // namespace dist

/// Named references to everything a training run needs to resume: what
/// `save_checkpoint` writes and `load_checkpoint` restores. It holds
/// references, not copies: the objects must outlive it.
///
/// The file is one dict (a Python `dict` after `torch.load`) with a key
/// per `add()`:
/// - a module → its `state_dict()` as Python names it (`"conv1.weight"`,
///   `"bn1.running_mean"`, ...; loads into the PyTorch twin with
///   `strict=True`);
/// - an optimizer → Python's `optimizer.state_dict()` layout for
///   torch::optim Adam, AdamW, SGD and lamp's FusedAdam, FusedAdamW,
///   FusedSGD (loads into `torch.optim.Adam(...)` etc.); any other
///   optimizer is stored in LibTorch's archive format under
///   `"lamp_libtorch_archive"` (readable only by lamp);
/// - anything with `state_dict()`/`load_state_dict()` of a
///   `lamp::StateDict` (`lamp::GradScaler` — loads
///   into `torch.amp.GradScaler` —, lamp's LR schedulers, your own types)
///   → that dict;
/// - an `int64_t`, `double`, `bool`, `std::string` or tensor variable →
///   its value (counters, the data position, an EMA tensor...);
/// plus `"rng"`: a list with one entry per rank, `{"cpu": ByteTensor,
/// "cuda": [ByteTensor per device]}` as `torch.get_rng_state()` and
/// `torch.cuda.get_rng_state_all()` (see `rng()`), and `"lamp"`: the
/// format version, step and world size. Tensors are written from the CPU,
/// whatever device holds them, so any machine can read the file.
///
/// Loading checks the whole file against the live objects before changing
/// any of them: a missing or unexpected key, a tensor of another shape or
/// dtype, a mistyped value or a file from a newer lamp throws `c10::Error`
/// naming the file and the first offending key, and the run is left as it
/// was. Tensors are copied into the live ones in place (the memory CUDA
/// graphs captured stays valid) and on their device, whatever device wrote
/// the file.
///
/// Example:
/// \code
///   int64_t step = 0;
///   lamp::TrainingState state;
///   state.add("model", *model)
///       .add("optimizer", optimizer)
///       .add("scaler", scaler)
///       .add("scheduler", scheduler)
///       .add("step", step);
///   lamp::CheckpointManager checkpoints("ckpt");
///   checkpoints.load_latest(state); // no-op on a fresh start
///   for (; step < total_steps; ++step) {
///     train_step();
///     if ((step + 1) % 1000 == 0) checkpoints.save(state, step + 1);
///   }
/// \endcode
class LAMP_API TrainingState {
 public:
  TrainingState();
  ~TrainingState();
  TrainingState(TrainingState&&) noexcept;
  TrainingState& operator=(TrainingState&&) noexcept;
  TrainingState(const TrainingState&) = delete;
  TrainingState& operator=(const TrainingState&) = delete;

  /// A module's parameters and buffers.
  TrainingState& add(std::string key, torch::nn::Module& module);
  /// An optimizer's hyperparameters and state.
  TrainingState& add(std::string key, torch::optim::Optimizer& optimizer);
  /// A counter, flag, name or tensor the run needs to resume.
  TrainingState& add(std::string key, int64_t& value);
  TrainingState& add(std::string key, double& value);
  TrainingState& add(std::string key, bool& value);
  TrainingState& add(std::string key, std::string& value);
  TrainingState& add(std::string key, torch::Tensor& value);
  /// Anything with `lamp::StateDict state_dict()` and
  /// `load_state_dict(const lamp::StateDict&)`: `lamp::GradScaler`, LR
  /// schedulers, your own types. If its `load_state_dict` throws, what the load
  /// already restored is put back.
  template <
      typename T,
      typename = std::void_t<
          decltype(std::declval<const T&>().state_dict()),
          decltype(std::declval<T&>().load_state_dict(
              std::declval<const T&>().state_dict()))>>
  TrainingState& add(std::string key, T& object) {
    return add_stateful(
        std::move(key),
        [&object] { return c10::IValue(object.state_dict()); },
        [&object](const c10::impl::GenericDict& dict) {
          object.load_state_dict(to_state_dict(dict));
        });
  }

  /// Whether checkpoints hold the CPU and CUDA random number generators'
  /// states (restored on load, so that random ops continue as if never
  /// interrupted). Default: true.
  TrainingState& rng(bool enabled);
  bool rng() const;

  /// The dict that a checkpoint file holds (tensors copied to the CPU,
  /// host syncs), with this process's RNG state as the only `"rng"` entry.
  c10::impl::GenericDict state_dict() const;
  /// Checks `dict` against every registered object, then restores them;
  /// `rank` picks the `"rng"` entry. Throws `c10::Error` naming the first
  /// offending key and changes nothing when the check fails. Keys the
  /// state does not know are ignored.
  void load_state_dict(const c10::impl::GenericDict& dict, int64_t rank = 0);

  /// The registered keys, in order.
  std::vector<std::string> keys() const;

 private:
  TrainingState& add_stateful(
      std::string key,
      std::function<c10::IValue()> save,
      std::function<void(const c10::impl::GenericDict&)> load);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes `state` to `path` atomically: into a temporary file in the same
/// folder, flushed to disk (fsync), then renamed over `path`, so a process
/// killed during the save leaves `path` as it was. With a process group of
/// several ranks every rank must call it with the same `step`: the ranks
/// check that they agree on it, rank 0 gathers their RNG states and alone
/// writes, and no rank returns before the file is complete (an error on
/// rank 0 is thrown on every rank). `step` is recorded in the file.
LAMP_API void save_checkpoint(
    const TrainingState& state,
    const std::string& path,
    int64_t step = 0,
    const std::shared_ptr<dist::ProcessGroup>& process_group = nullptr);

/// Restores `state` from `path` (lamp's or Python's `torch.save` of a dict
/// in the layout described at `TrainingState`); returns the step recorded
/// in the file (0 for files lamp did not write). Every rank reads the file;
/// with a process group the ranks then check that they loaded the same
/// step. A missing, truncated or corrupt file, a checkpoint of another
/// model or from a newer lamp throws `c10::Error` naming the file and the
/// first offending key, and changes nothing.
LAMP_API int64_t load_checkpoint(
    TrainingState& state,
    const std::string& path,
    const std::shared_ptr<dist::ProcessGroup>& process_group = nullptr);

/// Options of `CheckpointManager`.
struct LAMP_API CheckpointManagerOptions {
  /// How many checkpoints to keep; older ones are deleted after each save.
  /// 0 keeps all. Default: 3.
  TORCH_ARG(int64_t, keep_last) = 3;
  /// File names are `<prefix>-<step, 9 digits>.pt`. Default: "checkpoint".
  TORCH_ARG(std::string, prefix) = "checkpoint";
  /// The job's ranks (see `save_checkpoint`). Default: none (one process).
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, process_group) = nullptr;
  /// Save without stopping training (as Python's
  /// `torch.distributed.checkpoint.async_save`): `save()` copies the state
  /// to host memory and returns; a background thread writes the file
  /// (atomically, as ever) and deletes the old ones. At most one save is in
  /// flight: `save()` first waits for the previous one. A background save's
  /// error is thrown by the next `save()`, `wait()` or `load_latest()`; the
  /// destructor waits for it and warns. With a process group every rank
  /// takes part in the copy and rank 0 alone writes; the other ranks do not
  /// wait for the file. Default: false.
  TORCH_ARG(bool, async_save) = false;
};

/// A folder of numbered checkpoints: `save(state, step)` writes
/// `<dir>/checkpoint-000001000.pt` atomically and keeps the newest
/// `keep_last`; `load_latest(state)` resumes from the newest one. One
/// writer per folder (rank 0 under DDP): temporary files of saves that were
/// killed are removed by the next save.
///
/// Example:
/// \code
///   lamp::CheckpointManager checkpoints(
///       "ckpt", lamp::CheckpointManagerOptions().keep_last(2));
///   if (auto step = checkpoints.load_latest(state)) {
///     std::cout << "resumed at step " << *step << "\n";
///   }
///   checkpoints.save(state, 1000);
/// \endcode
class LAMP_API CheckpointManager {
 public:
  /// Creates `dir` (and its parents) if missing.
  explicit CheckpointManager(
      std::string dir,
      CheckpointManagerOptions options = {});
  /// Waits for a save in flight (async_save); warns if it failed.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Writes the checkpoint of `step` and deletes the oldest beyond
  /// `keep_last`; returns its path. With async_save it returns once the
  /// state is copied, before the file is written.
  std::string save(const TrainingState& state, int64_t step);
  /// Waits until the save in flight (async_save) has written its file;
  /// throws its error, if any. Returns at once when none is in flight.
  void wait();
  /// Restores the newest checkpoint; returns its step, or nullopt (and
  /// changes nothing) when the folder holds none.
  std::optional<int64_t> load_latest(TrainingState& state);
  /// The newest checkpoint's path, if any.
  std::optional<std::string> latest() const;
  /// (step, path) of every checkpoint in the folder, oldest first.
  std::vector<std::pair<int64_t, std::string>> list() const;
  const std::string& dir() const {
    return dir_;
  }

 private:
  struct Pending;
  std::string dir_;
  CheckpointManagerOptions options_;
  std::unique_ptr<Pending> pending_; // the background save, if any
};

} // namespace lamp
