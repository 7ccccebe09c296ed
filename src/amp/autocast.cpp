#include <lamp/autocast.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace lamp {
namespace {

std::string supported_device_types() {
  std::ostringstream out;
  const char* sep = "";
  for (auto type : at::autocast::_AUTOCAST_SUPPORTED_DEVICES) {
    out << sep << c10::DeviceTypeName(type, /*lower_case=*/false);
    sep = ", ";
  }
  return out.str();
}

// The guard's dtype: `dtype`, or the device's current autocast dtype.
c10::ScalarType checked_dtype(
    c10::DeviceType device_type,
    std::optional<c10::ScalarType> dtype,
    bool enabled) {
  TORCH_CHECK(
      at::autocast::is_autocast_available(device_type),
      "lamp::AutocastGuard: autocast is not available for device type ",
      c10::DeviceTypeName(device_type, /*lower_case=*/false),
      "; ATen can autocast ",
      supported_device_types(),
      ".");
  const auto result =
      dtype.value_or(at::autocast::get_autocast_dtype(device_type));
  // NOTE: Python warns and disables autocast here; a C++ training loop
  // should fail loudly rather than silently train in another precision.
  TORCH_CHECK(
      !enabled || result == c10::kHalf || result == c10::kBFloat16,
      "lamp::AutocastGuard: ",
      c10::DeviceTypeName(device_type, /*lower_case=*/false),
      " autocast cannot use dtype ",
      result,
      "; it supports ",
      c10::kHalf,
      " and ",
      c10::kBFloat16,
      ". Pass one of those, or enabled=false for a full-precision region.");
  return result;
}

} // namespace

AutocastGuard::AutocastGuard(
    c10::DeviceType device_type,
    std::optional<c10::ScalarType> dtype,
    bool enabled,
    std::optional<bool> cache_enabled)
    : device_type_(device_type),
      dtype_(checked_dtype(device_type, dtype, enabled)),
      enabled_(enabled),
      prev_enabled_(at::autocast::is_autocast_enabled(device_type)),
      prev_dtype_(at::autocast::get_autocast_dtype(device_type)),
      prev_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  if (enabled_ && device_type == c10::DeviceType::CUDA &&
      !at::globalContext().hasCUDA()) {
    TORCH_WARN_ONCE(
        "lamp::AutocastGuard: CUDA autocast was asked for but no CUDA "
        "device is available. Disabling autocast.");
    enabled_ = false;
  }
  const bool cache =
      cache_enabled.value_or(at::autocast::is_autocast_cache_enabled());
  // Same order as torch.autocast.__enter__; nothing below throws.
  at::autocast::set_autocast_enabled(device_type_, enabled_);
  at::autocast::set_autocast_dtype(device_type_, dtype_);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache);
}
AutocastGuard::~AutocastGuard() {
  // Same order as torch.autocast.__exit__.
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

} // namespace lamp
