#pragma once

// What both examples share to run a whole training run: gradient clipping,
// the learning-rate schedule, checkpoints and resume, and their flags.

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace examples {

// Number checks whose messages a user reads: "--batch-size: must be a
// positive number, got 0", "--steps: 'abc' is not a number" (CLI11's own say
// "Value 0 not in range 0.000000 to 1797693...").
inline CLI::Validator number_at_least(double low, bool strict) {
  const std::string what = strict ? "a positive number" : "zero or more";
  return CLI::Validator(
      [low, strict, what](std::string& text) -> std::string {
        size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) {
          return "'" + text + "' is not a number";
        }
        if (std::isnan(value) || (strict ? value <= low : value < low)) {
          return "must be " + what + ", got " + text;
        }
        return {};
      },
      strict ? "> 0" : ">= 0");
}
inline const CLI::Validator Positive = number_at_least(0, true);
inline const CLI::Validator NonNegative = number_at_least(0, false);

struct RunOptions {
  double clip_grad_norm = 0; // 0: off
  std::string lr_schedule;
  int64_t warmup_steps = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0; // 0: only at the end
  bool async_checkpoint = false;
  bool resume = false;
  int64_t stop_after = 0; // 0: run to the end
};

/// The groups of every example's --help. CLI11 lists groups in the order
/// their first flag was added, so the examples add their flags in this
/// order: model, precision and speed, data, training loop (add_run_flags
/// adds it and the checkpoints group), output, distributed
/// (add_dist_flags).
inline constexpr const char* kModelGroup = "Model";
inline constexpr const char* kSpeedGroup = "Precision and speed";
inline constexpr const char* kDataGroup = "Data";
inline constexpr const char* kLoopGroup = "Training loop";
inline constexpr const char* kCheckpointGroup = "Checkpoints";
inline constexpr const char* kOutputGroup = "Output";
inline constexpr const char* kDistGroup = "Distributed";

/// --precision (one of `choices`, described by `help`) and --device (auto,
/// cpu or cuda), in the help's "Precision and speed" group.
inline void add_precision_flags(
    CLI::App& app,
    std::string& precision,
    std::string& device,
    const std::vector<std::string>& choices,
    const std::string& help) {
  app.add_option("--precision", precision, help)
      ->check(CLI::IsMember(choices))
      ->group(kSpeedGroup);
  app.add_option("--device", device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str()
      ->group(kSpeedGroup);
}

/// The runs that --precision asks for: `precision`, or fp32, fp16 and bf16
/// for "all". Empty, after a line on stderr, when "all" meets
/// --checkpoint-dir (a checkpoint is one run): the example exits 2.
inline std::vector<std::string> precision_runs(
    const char* program,
    const std::string& precision,
    const RunOptions& run) {
  if (precision != "all") {
    return {precision};
  }
  if (!run.checkpoint_dir.empty()) {
    std::cerr << program
              << ": --checkpoint-dir takes one --precision (a checkpoint is "
                 "one run)\n";
    return {};
  }
  return {"fp32", "fp16", "bf16"};
}

/// --log-every (`help` says what it paces) and --metrics, in the help's
/// "Output" group.
inline void add_log_flags(
    CLI::App& app,
    int64_t& log_every,
    std::string& metrics,
    const std::string& help) {
  app.add_option("--log-every", log_every, help)
      ->check(Positive)
      ->capture_default_str()
      ->group(kOutputGroup);
  app.add_option("--metrics", metrics, "write JSON lines to this file")
      ->group(kOutputGroup);
}

/// --ddp and --dist-timeout, in the help's "Distributed" group.
inline void add_dist_flags(CLI::App& app, DistFlags& f) {
  app.add_flag(
         "--ddp",
         f.ddp,
         "data-parallel over the processes torchrun, srun or mpirun started: "
         "one GPU each over NCCL, or CPU processes over Gloo (--device cpu, "
         "or no GPU); --batch-size is per process")
      ->group(kDistGroup);
  app.add_option(
         "--dist-timeout",
         f.timeout_s,
         "seconds to wait for the other processes (rendezvous) and for any "
         "collective before failing")
      ->check(Positive)
      ->capture_default_str()
      ->group(kDistGroup);
}

inline void add_run_flags(CLI::App& app, RunOptions& o) {
  app.add_option(
         "--clip-grad-norm",
         o.clip_grad_norm,
         "clip the gradients' total 2-norm to this after unscaling "
         "(lamp::clip_grad_norm_; 0 = off)")
      ->check(NonNegative)
      ->capture_default_str()
      ->group(kLoopGroup);
  app.add_option(
         "--lr-schedule",
         o.lr_schedule,
         "learning rate per step: constant, linear (decay to 0), cosine "
         "(to 0) or onecycle")
      ->check(CLI::IsMember({"constant", "linear", "cosine", "onecycle"}))
      ->capture_default_str()
      ->group(kLoopGroup);
  app.add_option(
         "--warmup-steps",
         o.warmup_steps,
         "linear learning-rate warm-up before the schedule (onecycle: its "
         "rising phase)")
      ->check(NonNegative)
      ->capture_default_str()
      ->group(kLoopGroup);
  auto* dir = app.add_option(
      "--checkpoint-dir",
      o.checkpoint_dir,
      "write checkpoints (model, optimizer, scaler, schedule, step, RNG) "
      "to this folder, the newest 3 kept");
  dir->group(kCheckpointGroup);
  app.add_option(
         "--checkpoint-every",
         o.checkpoint_every,
         "steps between checkpoints (0: only at the end)")
      ->check(NonNegative)
      ->capture_default_str()
      ->group(kCheckpointGroup);
  app.add_flag(
         "--async-checkpoint",
         o.async_checkpoint,
         "write checkpoints in a background thread: training pauses only while "
         "the state is copied to host memory")
      ->group(kCheckpointGroup);
  app.add_flag(
         "--resume",
         o.resume,
         "continue from the newest checkpoint in --checkpoint-dir (from the "
         "start if there is none); the run ends where the uninterrupted run "
         "ends")
      ->needs(dir) // else it would be ignored without a word
      ->group(kCheckpointGroup);
  app.add_option(
         "--stop-after",
         o.stop_after,
         "stop this process after this many steps, as if killed (to try "
         "--resume)")
      ->check(NonNegative)
      ->group(kCheckpointGroup);
}

/// The per-step learning-rate schedule of `o` over `total` steps, or null
/// for a constant rate without warm-up. `graphed`: OneCycleLR then keeps
/// beta1 fixed (a captured step bakes it in).
inline std::shared_ptr<lamp::optim::LRScheduler> make_schedule(
    torch::optim::Optimizer& optimizer,
    const RunOptions& o,
    int64_t total,
    bool graphed) {
  namespace lo = lamp::optim;
  const double lr = optimizer.param_groups()[0].options().get_lr();
  if (o.lr_schedule == "onecycle") {
    auto options = lo::OneCycleLROptions(lr).total_steps(total);
    if (o.warmup_steps > 0) {
      options.pct_start(double(o.warmup_steps) / total);
    }
    options.cycle_momentum(!graphed);
    return std::make_shared<lo::OneCycleLR>(optimizer, options);
  }
  const int64_t warmup = std::min(o.warmup_steps, total);
  const int64_t rest = std::max<int64_t>(total - warmup, 1);
  std::shared_ptr<lo::LRScheduler> main;
  if (o.lr_schedule == "linear") {
    main = std::make_shared<lo::LinearLR>(optimizer, 1.0, 0.0, rest);
  } else if (o.lr_schedule == "cosine") {
    main = std::make_shared<lo::CosineAnnealingLR>(optimizer, rest);
  } else if (warmup > 0) {
    main = std::make_shared<lo::ConstantLR>(optimizer, 1.0, 0);
  }
  if (warmup == 0) {
    return main;
  }
  auto ramp =
      std::make_shared<lo::LinearLR>(optimizer, 1.0 / warmup, 1.0, warmup);
  return std::make_shared<lo::SequentialLR>(
      optimizer,
      std::vector<std::shared_ptr<lo::LRScheduler>>{ramp, main},
      std::vector<int64_t>{warmup});
}

/// What a run's checkpoints hold: the model, the optimizer, the loss scaler,
/// the step (which fixes the data position of the examples) and the
/// schedule, if any. An example adds what else it needs.
inline lamp::TrainingState run_state(
    torch::nn::Module& model,
    torch::optim::Optimizer& optimizer,
    lamp::GradScaler& scaler,
    int64_t& step,
    const std::shared_ptr<lamp::optim::LRScheduler>& schedule) {
  lamp::TrainingState state;
  state.add("model", model)
      .add("optimizer", optimizer)
      .add("scaler", scaler)
      .add("step", step);
  if (schedule) {
    state.add("scheduler", *schedule);
  }
  return state;
}

/// The end of every example's training step, after the scaled backward:
/// clip (--clip-grad-norm), then the scaler's step and update. The clip's
/// scaling is done by a fused optimizer's step
/// (GradScaler::clip_grad_norm_and_step).
inline void step_optimizer(
    lamp::GradScaler& scaler,
    torch::optim::Optimizer& optimizer,
    double max_norm) {
  if (max_norm > 0) {
    scaler.clip_grad_norm_and_step(optimizer, max_norm);
  } else {
    scaler.step(optimizer);
  }
  scaler.update();
}

/// --cuda-graph: the training step as lamp::GraphedStep (warm-up, one
/// capture, then replays; the learning-rate schedule reaches the graph),
/// `example_inputs` fixing the static inputs; else nothing, and the caller
/// runs `step` itself.
inline std::optional<lamp::GraphedStep> graphed_step(
    bool cuda_graph,
    lamp::GraphedStep::Function step,
    const std::vector<torch::Tensor>& example_inputs,
    torch::optim::Optimizer& optimizer) {
  if (!cuda_graph) {
    return std::nullopt;
  }
  return lamp::GraphedStep(std::move(step), example_inputs, {&optimizer});
}

/// Counts the steps the loss scaler skipped (inf/NaN gradients) on the
/// device: no host sync, and no allocation after the first step, until
/// count(). Steps this process ran (a resumed run's earlier steps are not
/// counted).
class SkippedSteps {
 public:
  /// After a step that ran scaler.update() (eagerly or in a graph replay).
  void add(const lamp::GradScaler& scaler) {
    const auto& found = scaler.get_found_inf_async();
    if (!found.defined()) {
      return; // a disabled scaler skips nothing
    }
    if (!count_.defined()) {
      count_ = torch::zeros({}, found.options());
      skipped_ = torch::empty({}, found.options());
    }
    at::gt_out(skipped_, found, 0);
    count_.add_(skipped_);
  }
  int64_t count() const {
    return count_.defined() ? static_cast<int64_t>(count_.item<double>()) : 0;
  }
  /// ", the loss scaler skipped N of M steps (inf/NaN gradients)" when N >
  /// 0, else "".
  std::string says(int64_t steps) const {
    const int64_t n = count();
    return n == 0 ? std::string()
                  : "the loss scaler skipped " + std::to_string(n) + " of " +
            std::to_string(steps) + (steps == 1 ? " step" : " steps") +
            " (inf/NaN gradients; the scale backs off each time)";
  }

 private:
  torch::Tensor count_, skipped_;
};

/// What every example's summary record starts with: what ran.
struct RunSummary {
  std::string model;
  std::string precision;
  torch::Device device;
  int64_t world_size = 1;
  int64_t batch_size = 0; // a process's batch
};

/// The end of a run in every example: on rank 0 (`print`) the line saying
/// how many of `steps` the loss scaler skipped, if any, after `prefix`; then
/// the summary record: kind, `run`, the example's own `fields`, final_loss,
/// final_scale and skipped_steps.
inline void write_summary(
    JsonLines& metrics,
    const RunSummary& run,
    const std::vector<std::pair<std::string, JsonLines::Value>>& fields,
    double final_loss,
    const lamp::GradScaler& scaler,
    const SkippedSteps& skipped,
    int64_t steps,
    bool print,
    const std::string& prefix) {
  if (print && skipped.count() > 0) {
    std::printf("%s%s\n", prefix.c_str(), skipped.says(steps).c_str());
  }
  std::vector<std::pair<std::string, JsonLines::Value>> record{
      {"kind", std::string("summary")},
      {"model", run.model},
      {"precision", run.precision},
      {"device", run.device.str()},
      {"world_size", run.world_size},
      {"batch_size", run.batch_size}};
  record.insert(record.end(), fields.begin(), fields.end());
  record.emplace_back("final_loss", final_loss);
  record.emplace_back("final_scale", scaler.get_scale());
  record.emplace_back("skipped_steps", skipped.count());
  metrics.write(record);
}

/// --checkpoint-dir, --checkpoint-every, --resume and --stop-after.
class RunCheckpoints {
 public:
  RunCheckpoints(
      const RunOptions& o,
      std::shared_ptr<lamp::dist::ProcessGroup> pg,
      std::string program)
      : options_(o),
        program_(std::move(program)),
        print_(!pg || pg->rank() == 0),
        terminal_(isatty(fileno(stdout)) != 0) {
    if (!o.checkpoint_dir.empty()) {
      manager_.emplace(
          o.checkpoint_dir,
          lamp::CheckpointManagerOptions()
              .process_group(std::move(pg))
              .async_save(o.async_checkpoint));
      // NOTE: before the first step, not after all of them.
      const auto probe = manager_->dir() + "/.write-test";
      std::FILE* f = std::fopen(probe.c_str(), "w");
      const int error = errno;
      TORCH_CHECK(
          f != nullptr,
          "--checkpoint-dir ",
          manager_->dir(),
          " is not writable (",
          std::strerror(error),
          "); pass a folder this process can write to");
      std::fclose(f);
      std::remove(probe.c_str());
    }
  }

  /// The step to start after: the newest checkpoint's with --resume, else
  /// 0; RunFinished if that checkpoint is the last of `total` steps.
  /// `print`: this rank says what it did.
  int64_t resume(lamp::TrainingState& state, bool print, int64_t total) {
    if (!manager_ || !options_.resume) {
      return 0;
    }
    const auto step = manager_->load_latest(state);
    if (step && *step >= total) {
      throw RunFinished(
          "the run in " + manager_->dir() + " already finished (" +
          *manager_->latest() + " is step " + std::to_string(*step) + " of " +
          std::to_string(total) +
          "): nothing to train; to train further, raise the step count, or "
          "start a new run in another --checkpoint-dir");
    }
    if (print) {
      if (step) {
        std::printf(
            "%s: resumed from %s at step %lld\n",
            program_.c_str(),
            manager_->latest()->c_str(),
            static_cast<long long>(*step));
      } else {
        std::printf(
            "%s: no checkpoint in %s yet: starting from step 0\n",
            program_.c_str(),
            manager_->dir().c_str());
      }
    }
    return step.value_or(0);
  }

  /// After step `step` of `total` (1-based), `done` of them by this
  /// process: saves when due. Returns false when --stop-after says stop;
  /// then, and after the last step, the checkpoint is on disk (a background
  /// save's error is thrown here).
  bool after_step(
      lamp::TrainingState& state,
      int64_t step,
      int64_t total,
      int64_t done) {
    if (manager_ &&
        ((options_.checkpoint_every > 0 &&
          step % options_.checkpoint_every == 0) ||
         step == total)) {
      const auto start = std::chrono::steady_clock::now();
      const auto path = manager_->save(state, step);
      const std::chrono::duration<double> took =
          std::chrono::steady_clock::now() - start;
      if (print_ && options_.async_checkpoint) {
        say("checkpoint of step " + std::to_string(step) +
            " being written to " + path + " (in the background)");
      } else if (print_) {
        char size[32];
        std::snprintf(
            size,
            sizeof size,
            "%.1f MB, %.2f s",
            std::filesystem::file_size(path) / 1e6,
            took.count());
        say("checkpoint saved: " + path + " (" + size + ")");
      }
    }
    const bool go_on = options_.stop_after == 0 || done < options_.stop_after;
    if (manager_ && (!go_on || step == total)) {
      manager_->wait();
    }
    return go_on;
  }

 private:
  // A line of its own, also when a progress line is being redrawn.
  void say(const std::string& text) const {
    std::printf(
        "%s%s: %s\n",
        terminal_ ? "\r\033[K" : "",
        program_.c_str(),
        text.c_str());
    std::fflush(stdout);
  }

  RunOptions options_;
  std::string program_;
  bool print_; // rank 0
  bool terminal_; // stdout is a terminal
  std::optional<lamp::CheckpointManager> manager_;
};

} // namespace examples
