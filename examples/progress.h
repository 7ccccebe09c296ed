#pragma once

// A progress line for long runs: step, steps/s, ETA, loss, scale and the
// example's throughput (images/s, tokens/s). On a
// terminal it redraws one line about twice a second; otherwise (a log file,
// CI) it prints a plain line every `every` steps.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace examples {

class Progress {
 public:
  /// `total`: the last step of the whole run; `first`: the step this
  /// process starts after (nonzero when resumed). Prints nothing when
  /// `enabled` is false (ranks other than 0).
  Progress(
      std::string label,
      int64_t total,
      int64_t first,
      int64_t every,
      bool enabled)
      : label_(std::move(label)),
        total_(total),
        every_(every),
        enabled_(enabled),
        terminal_(isatty(fileno(stdout)) != 0),
        last_step_(first),
        last_time_(Clock::now()) {}

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() {
    finish();
  }

  /// After step `step` (1-based). `loss_and_scale` reads them from the
  /// device (a host sync), so it is called only when a line is printed;
  /// `extra` (optional) gets the steps/s since the last line and returns
  /// more to print at its end (throughput in the example's units).
  void update(
      int64_t step,
      const std::function<std::pair<double, double>()>& loss_and_scale,
      const std::function<std::string(double)>& extra = nullptr) {
    if (!enabled_) {
      return;
    }
    const auto now = Clock::now();
    const double seconds =
        std::chrono::duration<double>(now - last_time_).count();
    const bool due = terminal_ ? seconds >= 0.5 || step == total_
                               : step % every_ == 0 || step == total_;
    if (!due) {
      return;
    }
    const auto [loss, scale] = loss_and_scale();
    const double rate = seconds > 0 ? (step - last_step_) / seconds : 0;
    const double eta = rate > 0 ? (total_ - step) / rate : 0;
    const int64_t eta_s = static_cast<int64_t>(eta + 0.5);
    std::printf(
        "%s[%s] step %lld/%lld  %.1f steps/s  ETA %lldm%02llds  loss %.4f  scale %g%s%s",
        terminal_ ? "\r\033[K" : "",
        label_.c_str(),
        static_cast<long long>(step),
        static_cast<long long>(total_),
        rate,
        static_cast<long long>(eta_s / 60),
        static_cast<long long>(eta_s % 60),
        loss,
        scale,
        extra ? extra(rate).c_str() : "",
        terminal_ ? "" : "\n");
    std::fflush(stdout);
    drawn_ = terminal_;
    last_step_ = step;
    last_time_ = Clock::now(); // NOTE: after the sync above
  }

  /// Ends a redrawn line, so that what follows starts on its own.
  void finish() {
    if (drawn_) {
      std::printf("\n");
      std::fflush(stdout);
      drawn_ = false;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_;
  int64_t every_;
  bool enabled_;
  bool terminal_;
  bool drawn_ = false;
  int64_t last_step_;
  Clock::time_point last_time_;
};

/// A Progress::update `extra` that prints the throughput: "  N images/s"
/// for `per_step` items (of `unit`) a step.
inline std::function<std::string(double)> per_second(
    double per_step,
    std::string unit) {
  return [per_step, unit = std::move(unit)](double steps_per_s) {
    char line[64];
    std::snprintf(line, sizeof line, "  %.0f ", steps_per_s * per_step);
    return line + unit + "/s";
  };
}

} // namespace examples
