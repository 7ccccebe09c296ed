#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

#include <lamp/export.h>

namespace lamp {

/// RAII equivalent of Python's `torch.autocast` context manager (torch 2.11,
/// `torch/amp/autocast_mode.py`): while the guard lives, ops on
/// `device_type` that autocast knows run in the lower-precision `dtype`.
///
/// The constructor saves the device's autocast enabled flag and dtype and the
/// cast-cache flag, sets the new ones and increments the autocast nesting
/// level; the destructor decrements it, clears the cast cache when the
/// outermost guard exits, and restores what it saved, also when an exception
/// unwinds through it. Guards nest: an `enabled=false` guard makes an fp32
/// region inside an autocast one, an inner guard may pick another dtype.
///
/// Autocast state is thread-local, as in PyTorch: a guard affects only the
/// thread that made it. A new thread starts with autocast off.
///
/// Differences from Python, on purpose:
/// - A dtype the device cannot autocast to (anything but Half and BFloat16),
///   or a device type ATen has no autocast for, throws `c10::Error` naming
///   the device and the dtypes it supports. Python warns and silently
///   disables autocast; a C++ training loop should not train in fp32 by
///   accident. The dtype is only checked when `enabled` is true, as Python.
/// - Like Python, a CUDA guard on a machine without a CUDA device warns once
///   and disables itself.
///
/// Example:
/// \code
///   torch::Tensor loss;
///   {
///     lamp::AutocastGuard autocast(torch::kCUDA);   // fp16 on CUDA
///     auto logits = model->forward(images);
///     {
///       // An fp32 island inside the autocast region.
///       lamp::AutocastGuard fp32(torch::kCUDA, std::nullopt, false);
///       logits = logits.to(torch::kFloat).log_softmax(1);
///     }
///     loss = torch::nll_loss(logits, labels);
///   }
///   loss.backward();  // backward outside the guard, as in Python
/// \endcode
class LAMP_API AutocastGuard {
 public:
  /// \param device_type the device whose autocast state to set, e.g.
  ///   `torch::kCUDA` or `torch::kCPU`.
  /// \param dtype the lower-precision dtype; default (nullopt): the device's
  ///   current autocast dtype, which is `torch::kHalf` on CUDA and
  ///   `torch::kBFloat16` on CPU unless an enclosing guard changed it.
  /// \param enabled whether autocast is on in this region; default true.
  /// \param cache_enabled whether casts of fp32 leaf weights are cached
  ///   inside the region; default (nullopt): keep the current setting, which
  ///   is true outside any guard (Python's `cache_enabled=None`).
  explicit AutocastGuard(
      c10::DeviceType device_type,
      std::optional<c10::ScalarType> dtype = std::nullopt,
      bool enabled = true,
      std::optional<bool> cache_enabled = std::nullopt);
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&&) = delete;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

  /// The device type this guard sets.
  c10::DeviceType device_type() const {
    return device_type_;
  }
  /// The dtype autocast uses inside this guard.
  c10::ScalarType dtype() const {
    return dtype_;
  }
  /// Whether autocast is on inside this guard (false when asked for, or when
  /// a CUDA guard found no CUDA device).
  bool enabled() const {
    return enabled_;
  }

 private:
  c10::DeviceType device_type_;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  bool enabled_ = false;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Undefined;
  bool prev_cache_enabled_ = true;
};

} // namespace lamp
