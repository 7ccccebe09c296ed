#pragma once

// Helpers shared by lamp's examples: device and precision flags, `--ddp`,
// timing, peak memory, JSON-lines metrics.

#include <lamp/config.h>
#include <lamp/distributed.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace examples {

/// Exit status of an example asked for a GPU where there is none: 1, an
/// ordinary failure, or CTest's skip code 77 when the environment has
/// LAMP_SKIP_WITHOUT_GPU=1 (the GPU tests set it, so that they are reported
/// as skipped on machines without one).
inline int no_gpu_status() {
  const char* skip = std::getenv("LAMP_SKIP_WITHOUT_GPU");
  return skip != nullptr && std::string(skip) == "1" ? 77 : 1;
}

struct Precision {
  std::string name; // fp32, fp16, bf16 or fp8
  bool amp;
  c10::ScalarType dtype;
  bool fp8 = false; // bf16 autocast + lamp::Fp8AutocastGuard (lamp/fp8.h)
};

/// "1 step", "5 steps": `n` and `noun`, plural unless n is 1.
inline std::string count(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

/// ": a, b, c and 4 more" for the first `n` of `names`; "" for none.
inline std::string first_few(const std::vector<std::string>& names, size_t n) {
  std::string out;
  for (size_t k = 0; k < names.size() && k < n; ++k) {
    out += (k == 0 ? ": " : ", ") + names[k];
  }
  if (names.size() > n) {
    out += " and " + std::to_string(names.size() - n) + " more";
  }
  return out;
}

/// `message` with the library's hints in the examples' words: where it
/// names an API option that an example sets from a flag, the flag.
inline std::string with_flag_hints(std::string message) {
  static const std::pair<std::string, std::string> kHints[] = {
      {"skip_bad_images(true)", "--skip-bad-images"},
  };
  for (const auto& [api, flag] : kHints) {
    for (size_t at = message.find(api); at != std::string::npos;
         at = message.find(api, at + flag.size())) {
      message.replace(at, api.size(), flag);
    }
  }
  return message;
}

/// Thrown by RunCheckpoints::resume (training.h) when the newest
/// checkpoint is the run's last step: nothing is left to train.
/// report_failure prints its message to stdout and returns 0 (no failure,
/// and no table of results that were never measured).
struct RunFinished : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What an example does with an exception that training threw (a bad
/// image, an I/O error, a NCCL error...): "<program>: <message>" on one line
/// of stderr, then exit status 1 (no abort, no backtrace). Checkpoints
/// written before it stay as they were. A finished run found by --resume
/// (RunFinished) is no failure: its line goes to
/// stdout and the status is 0.
inline int report_failure(const char* program, const std::exception& e) {
  if (dynamic_cast<const RunFinished*>(&e) != nullptr) {
    std::cout << program << ": " << e.what() << "\n";
    return 0;
  }
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  std::string message = error ? error->what_without_backtrace() : e.what();
  message = with_flag_hints(std::move(message));
  std::replace(message.begin(), message.end(), '\n', ' ');
  while (!message.empty() && message.back() == ' ') {
    message.pop_back();
  }
  std::cerr << program << ": " << message << "\n";
  return 1;
}

inline Precision precision(const std::string& name) {
  if (name == "fp16") {
    return {name, true, torch::kHalf};
  }
  if (name == "bf16") {
    return {name, true, torch::kBFloat16};
  }
  if (name == "fp8") {
    return {name, true, torch::kBFloat16, true};
  }
  return {"fp32", false, torch::kFloat};
}

/// "auto" is CUDA when there is a device, else the CPU. Empty when CUDA was
/// asked for and there is none.
inline std::optional<torch::Device> pick_device(const std::string& flag) {
  const bool cuda = torch::cuda::is_available();
  if (flag == "cuda" && !cuda) {
    return std::nullopt;
  }
  return torch::Device(
      flag == "cpu" || (flag == "auto" && !cuda) ? torch::kCPU : torch::kCUDA);
}

/// The data-parallel flags every example takes (training.h's
/// add_dist_flags).
struct DistFlags {
  bool ddp = false;
  double timeout_s = 600; // --dist-timeout
};

/// The device of a `--ddp` run: the process group's, `cuda:<local_rank>`
/// over NCCL, or the CPU over Gloo. Empty when `flag` asks for CUDA and
/// there is none.
inline std::optional<torch::Device> ddp_device(
    const lamp::dist::ProcessGroup& pg,
    const std::string& flag) {
  if (flag == "cuda" && !pg.device().is_cuda()) {
    return std::nullopt;
  }
  return pg.device();
}

/// Where an example runs: its process group (null without `--ddp`) and its
/// device, or, when it cannot run, the exit status to return (`exit_status`
/// non-zero, its reason printed as "<program>: ..."): 2 for a launch the
/// flags do not fit (several processes without `--ddp`, a bad launcher
/// environment, peers that never came), `no_gpu_status()` for CUDA asked
/// for (`--device cuda`, `--cuda-graph`) where there is none.
struct RunPlace {
  std::shared_ptr<lamp::dist::ProcessGroup> pg;
  torch::Device device{torch::kCPU};
  int exit_status = 0;
};

inline RunPlace place_run(
    const char* program,
    const DistFlags& dist,
    const std::string& device_flag,
    bool cuda_graph) {
  RunPlace place;
  std::optional<torch::Device> device;
  try {
    if (dist.ddp) {
      // --device cpu: CPU processes over Gloo, also on a host with GPUs;
      // cuda: NCCL; auto: NCCL where there are GPUs, else Gloo.
      place.pg = lamp::dist::init_process_group(
          lamp::dist::ProcessGroupOptions()
              .backend(
                  device_flag == "cpu"        ? "gloo"
                      : device_flag == "cuda" ? "nccl"
                                              : "auto")
              .timeout(std::chrono::milliseconds(
                  static_cast<int64_t>(dist.timeout_s * 1000))));
    } else {
      const auto launch = lamp::dist::launch_config();
      TORCH_CHECK_VALUE(
          launch.world_size == 1,
          lamp::dist::to_string(launch.launcher),
          " started ",
          launch.world_size,
          " processes (this is rank ",
          launch.rank,
          ") but --ddp was not given, so each would train alone on all the "
          "data; pass --ddp to train data-parallel, or start one process");
    }
    device = place.pg ? ddp_device(*place.pg, device_flag)
                      : pick_device(device_flag);
  } catch (const c10::Error& e) {
    std::cerr << program << ": " << e.what_without_backtrace() << "\n";
    place.exit_status = 2;
    return place;
  }
  if (!device) {
    std::cerr << program << ": --device cuda but no CUDA device is available\n";
    place.exit_status = no_gpu_status();
    return place;
  }
  if (cuda_graph && !device->is_cuda()) {
    std::cerr << program << ": --cuda-graph needs a CUDA device\n";
    place.exit_status = no_gpu_status();
    return place;
  }
  place.device = *device;
  return place;
}

/// Rank and world size of a run; a run without `--ddp` (null `pg`) is rank 0
/// of 1.
inline int64_t rank(const std::shared_ptr<lamp::dist::ProcessGroup>& pg) {
  return pg ? pg->rank() : 0;
}
inline int64_t world_size(const std::shared_ptr<lamp::dist::ProcessGroup>& pg) {
  return pg ? pg->world_size() : 1;
}

/// A Chrome trace (chrome://tracing, ui.perfetto.dev) of the CPU ops and
/// CUDA kernels run between `start()` and `stop()`, from LibTorch's Kineto
/// profiler; `stop()` writes it to `path`.
class Trace {
 public:
  explicit Trace(std::string path) : path_(std::move(path)) {}
  void start() {
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> activities{
        impl::ActivityType::CPU, impl::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }
  void stop() {
    torch::autograd::profiler::disableProfiler()->save(path_);
  }

 private:
  std::string path_;
};

// Waits for the work queued on the current stream: a training step (eager,
// DDP, graph replay) ends there.
// NOTE: not cudaDeviceSynchronize, which would also wait for the GPU work
// of lamp::data's loader (its own stream, decoding the next batch with
// --gpu-decode) and so put that work inside every timed step.
inline void synchronize(const torch::Device& device) {
#if LAMP_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  }
#else
  (void)device;
#endif
}

/// Frees cached blocks and restarts peak tracking (CUDA only).
inline void reset_peak_memory(const torch::Device& device) {
#if LAMP_WITH_CUDA
  if (device.is_cuda()) {
    // NOTE: the allocator knows the devices only once CUDA is initialised.
    torch::zeros({1}, torch::TensorOptions(device));
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        device.index() < 0 ? 0 : device.index());
  }
#endif
}

/// Peak bytes allocated by the CUDA caching allocator since the last reset
/// (0 on the CPU), as torch.cuda.max_memory_allocated().
inline int64_t peak_memory_bytes(const torch::Device& device) {
#if LAMP_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        device.index() < 0 ? 0 : device.index());
    return stats.allocated_bytes[0].peak; // StatType::AGGREGATE
  }
#endif
  return 0;
}

inline double median(std::vector<double> values) {
  if (values.empty()) {
    return NAN;
  }
  std::nth_element(
      values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

/// The benchmarks' timing: the median over `repeats` of the wall time of
/// one `run()`, in ms, divided by `per_run` (the calls a run makes); each
/// run timed between two waits for the device's stream.
inline double median_ms(
    const torch::Device& device,
    int64_t repeats,
    int64_t per_run,
    const std::function<void()>& run) {
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    run();
    synchronize(device);
    const auto stop = std::chrono::steady_clock::now();
    ms.push_back(
        std::chrono::duration<double, std::milli>(stop - start).count() /
        static_cast<double>(per_run));
  }
  return median(ms);
}

// Note [timing steps without a sync a step]
// A training loop that waits for the device after every step (to time it)
// idles the GPU while the host queues the next step. For a whole step in a
// CUDA graph that is the graph's launch: ~1 ms of host time for GPT-2's
// ~700 kernels (H100 trace: cudaGraphLaunch 0.91-0.96 ms, the GPU idle
// meanwhile), 3 % of the step. So the loop waits only where it reads the
// device anyway (a logged step, an evaluation, a checkpoint, the end of the
// warm-up, the last step), and StepTimer times the steps between two such
// waits -- a window -- by their mean. The next step's launch then overlaps
// the running one, as in a loop that never times itself.
class StepTimer {
 public:
  explicit StepTimer(const torch::Device& device) : device_(device) {
    restart();
  }
  /// Waits for the device and starts a new window; the steps of the
  /// window so far are not timed (after work that is not a step).
  void restart() {
    synchronize(device_);
    start_ = std::chrono::steady_clock::now();
    steps_ = 0;
  }
  /// Counts a step (queued, maybe still running).
  void step() {
    ++steps_;
  }
  /// Ends the window: waits for the device, returns the mean ms a step of
  /// the window's steps (NAN if none) and how many there were, and starts
  /// the next window.
  std::pair<double, int64_t> lap() {
    synchronize(device_);
    const auto now = std::chrono::steady_clock::now();
    const int64_t n = steps_;
    const double ms = n == 0
        ? NAN
        : std::chrono::duration<double, std::milli>(now - start_).count() / n;
    start_ = now;
    steps_ = 0;
    return {ms, n};
  }

 private:
  torch::Device device_;
  std::chrono::steady_clock::time_point start_;
  int64_t steps_ = 0;
};

/// Writes one JSON object per line (`--metrics FILE.jsonl`); a no-op when
/// constructed with an empty path.
class JsonLines {
 public:
  using Value = std::
      variant<double, int64_t, bool, std::string, std::vector<std::string>>;

  explicit JsonLines(const std::string& path) {
    if (!path.empty()) {
      out_.open(path);
      if (!out_) {
        throw std::runtime_error("cannot write metrics file " + path);
      }
    }
  }

  void write(const std::vector<std::pair<std::string, Value>>& fields) {
    if (!out_.is_open()) {
      return;
    }
    std::ostringstream line;
    line << std::setprecision(9) << "{";
    const char* sep = "";
    for (const auto& [key, value] : fields) {
      line << sep << quote(key) << ": ";
      sep = ", ";
      if (const auto* d = std::get_if<double>(&value)) {
        if (std::isfinite(*d)) {
          line << *d;
        } else {
          line << "null";
        }
      } else if (const auto* i = std::get_if<int64_t>(&value)) {
        line << *i;
      } else if (const auto* b = std::get_if<bool>(&value)) {
        line << (*b ? "true" : "false");
      } else if (
          const auto* list = std::get_if<std::vector<std::string>>(&value)) {
        line << "[";
        for (size_t k = 0; k < list->size(); ++k) {
          line << (k == 0 ? "" : ", ") << quote((*list)[k]);
        }
        line << "]";
      } else {
        line << quote(std::get<std::string>(value));
      }
    }
    out_ << line.str() << "}\n";
    out_.flush();
  }

 private:
  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
      }
      out += c;
    }
    return out + "\"";
  }

  std::ofstream out_;
};

} // namespace examples
