#pragma once

// Reading and writing the schedulers' state dicts (Python's key -> value
// dicts as IValues), and the formulas several schedulers share. Internal to
// lamp.

#include <lamp/lr_scheduler/base.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace lamp::optim {

namespace detail {

/// Python's math.pi, for the cosine schedules (decay.cpp, cyclic.cpp).
inline constexpr double kPi = 3.141592653589793;

/// Each of `lrs` times `factor` (Python's `[lr * factor for lr in lrs]`).
inline std::vector<double> times(std::vector<double> lrs, double factor) {
  for (auto& lr : lrs) {
    lr = lr * factor;
  }
  return lrs;
}

/// Python's cosine annealing from each base lr to `eta_min` at `cur` of `T`,
/// in Python's order of operations.
inline std::vector<double> cosine_anneal(
    std::vector<double> base_lrs,
    double eta_min,
    double cur,
    double T) {
  for (auto& lr : base_lrs) {
    lr = eta_min + (lr - eta_min) * (1 + std::cos(kPi * cur / T)) / 2;
  }
  return base_lrs;
}

/// Python's check of a positive int argument (`name` as in the message).
inline void check_positive(const char* name, int64_t value) {
  TORCH_CHECK_VALUE(
      value > 0, "Expected positive integer ", name, ", but got ", value);
}

/// A value of a state dict as Python holds it: None for nullopt, lists as
/// generic lists (as Python's unpickle), a Counter as a dict int -> int.
template <typename T>
c10::IValue to_ivalue(const T& value) {
  return value;
}
inline c10::IValue to_ivalue(const std::optional<double>& value) {
  return value ? c10::IValue(*value) : c10::IValue();
}
template <typename T>
c10::IValue to_ivalue(const std::vector<T>& values) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& v : values) {
    list.push_back(v);
  }
  return list;
}
inline c10::IValue to_ivalue(
    const std::vector<std::pair<int64_t, int64_t>>& counter) {
  c10::Dict<int64_t, int64_t> dict;
  for (const auto& [key, count] : counter) {
    dict.insert(key, count);
  }
  return dict;
}

/// Python's type name of `value` (int, float, bool, str, list, dict, None).
std::string python_type_name(const c10::IValue& value);

/// Reads the values of a state dict, checking each key's presence and type.
/// Every failure throws a `c10::Error` that starts with `where` and names the
/// key, the expected and the found type.
class StateReader {
 public:
  /// `groups`: the length of a list of floats (one per param group).
  StateReader(
      const c10::impl::GenericDict& state,
      std::string where,
      size_t groups = 0)
      : state_(state), where_(std::move(where)), groups_(groups) {}

  /// The value of `key`; throws when missing.
  const c10::IValue& at(const std::string& key) const;
  bool has(const std::string& key) const {
    return state_.contains(c10::IValue(key));
  }
  /// The value of `key` as a `T`: int64_t, double (also from an int), bool,
  /// std::string, std::optional<double>, std::vector<double> (one per group),
  /// std::vector<int64_t> or a Counter as pairs.
  template <typename T>
  T get(const std::string& key) const;
  /// An int, or a float that holds an integer.
  int64_t get_integral(const std::string& key) const;
  /// The list at `key`, of `size` elements when given (else: not
  /// `expected`).
  c10::ArrayRef<c10::IValue> get_list(
      const std::string& key,
      const std::string& expected,
      std::optional<size_t> size) const;
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
  size_t groups_;
};

} // namespace detail

/// One key of a scheduler's state dict (see `state_fields()`): how to save
/// it and how to check and load it. Most keys are a member of a type that
/// `StateReader::get` reads (a `std::vector<double>` holds one value per
/// param group; pairs are a dict int -> int, Python's Counter of
/// milestones); a key of another shape comes with its own functions.
struct LRScheduler::StateField {
  /// The value to save; nullopt: no such key.
  using Save = std::function<std::optional<c10::IValue>()>;
  /// Reads and checks the key; returns what applies it (cannot throw).
  using Check =
      std::function<std::function<void()>(const detail::StateReader&)>;
  /// What a member's key also accepts: kIntegral, a float that holds an
  /// integer (for an int); kOrFalse, no key (a bool, Python's class
  /// default).
  enum Accept { kExact, kIntegral, kOrFalse };

  template <typename T>
  StateField(const char* key, T* member, Accept accept = kExact)
      : key(key),
        save([member] { return std::optional(detail::to_ivalue(*member)); }),
        check([key, member, accept](const detail::StateReader& reader) {
          T value{}; // a kOrFalse key that is missing: false
          if constexpr (std::is_same_v<T, int64_t>) {
            value = accept == kIntegral ? reader.get_integral(key)
                                        : reader.get<T>(key);
          } else if (accept != kOrFalse || reader.has(key)) {
            value = reader.get<T>(key);
          }
          return std::function<void()>([member, value] { *member = value; });
        }) {}
  StateField(const char* key, Save save, Check check)
      : key(key), save(std::move(save)), check(std::move(check)) {}
  /// Also requires an int >= `min`; `description` says so in messages.
  StateField& at_least(int64_t min, std::string description);
  /// Also requires a str equal to `a` or `b`.
  StateField& one_of(const std::string& a, const std::string& b);
  /// Also requires a list of `size` ints; `description` says so.
  StateField& of_size(size_t size, std::string description);

  const char* key;
  Save save;
  Check check;
  /// The extra requirement on the stored value once its type is checked:
  /// what breaks it, as a message's "found"; nullopt: none.
  std::function<std::optional<std::string>(const c10::IValue&)> valid;
  std::string expected;
};

} // namespace lamp::optim
