#pragma once

// Reading and writing the schedulers' state dicts (Python's key -> value
// dicts as IValues). Internal to lamp.

#include <lamp/lr_scheduler/base.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lamp::optim::detail {

/// Python's math.pi, for the cosine schedules (decay.cpp, cyclic.cpp).
inline constexpr double kPi = 3.141592653589793;

/// A Python list of floats (a generic list, as Python's unpickles).
c10::IValue double_list(const std::vector<double>& values);
/// A Python list of ints.
c10::IValue int_list(const std::vector<int64_t>& values);
/// Python's type name of `value` (int, float, bool, str, list, dict, None).
std::string python_type_name(const c10::IValue& value);

/// Reads the values of a state dict, checking each key's presence and type.
/// Every failure throws a `c10::Error` that starts with `where` and names the
/// key, the expected and the found type.
class StateReader {
 public:
  StateReader(const c10::impl::GenericDict& state, std::string where)
      : state_(state), where_(std::move(where)) {}

  /// The value of `key`; throws when missing.
  const c10::IValue& get(const std::string& key) const;
  /// Whether `key` is present.
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  /// An int, or a float that holds an integer.
  int64_t get_integral(const std::string& key) const;
  /// A float or an int.
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  /// `fallback` when missing.
  bool get_bool_or(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  /// A float, an int or None.
  std::optional<double> get_optional_double(const std::string& key) const;
  /// A list of floats/ints; of `size` elements when given (one per param
  /// group).
  std::vector<double> get_double_list(
      const std::string& key,
      std::optional<size_t> size) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  /// A list of dicts; of `size` elements when given.
  std::vector<c10::impl::GenericDict> get_dict_list(
      const std::string& key,
      std::optional<size_t> size) const;

  /// Throws: `key` holds `found`, not `expected`.
  [[noreturn]] void fail(
      const std::string& key,
      const std::string& expected,
      const std::string& found) const;
  const std::string& where() const {
    return where_;
  }

 private:
  // The value of `key`, which must satisfy `is` (else: not `expected`).
  const c10::IValue& get_if(
      const std::string& key,
      const std::string& expected,
      bool (c10::IValue::*is)() const) const;
  // The elements of the list at `key` through `convert` (nullopt: not
  // `expected`); of `size` elements when given.
  template <typename T, typename Convert>
  std::vector<T> get_list(
      const std::string& key,
      const std::string& expected,
      std::optional<size_t> size,
      Convert convert) const;

  const c10::impl::GenericDict& state_;
  std::string where_;
};

/// A float or an int as a double; nullopt for other types.
std::optional<double> as_double(const c10::IValue& value);

} // namespace lamp::optim::detail
