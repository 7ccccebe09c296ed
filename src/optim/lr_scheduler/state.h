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
#include <utility>
#include <variant>
#include <vector>

namespace lamp::optim {

namespace detail {
class StateReader;
} // namespace detail

/// One key of a scheduler's state dict and the member that holds it (see
/// `state_fields()`). A `std::vector<double>` holds one value per param
/// group; pairs are a dict int -> int (Python's Counter of milestones).
/// A key of another shape has its own `save` and `check` instead.
struct LRScheduler::StateField {
  using Member = std::variant<
      int64_t*,
      double*,
      bool*,
      std::string*,
      std::optional<double>*,
      std::vector<double>*,
      std::vector<int64_t>*,
      std::vector<std::pair<int64_t, int64_t>>*>;
  /// The value of a key with its own functions; nullopt: no such key.
  using Save = std::function<std::optional<c10::IValue>()>;
  /// Reads and checks such a key; returns what applies it (cannot throw).
  using Check =
      std::function<std::function<void()>(const detail::StateReader&)>;

  template <typename T>
  StateField(const char* key, T* member) : key(key), member(member) {}
  StateField(const char* key, Save save, Check check)
      : key(key), save(std::move(save)), check(std::move(check)) {}
  /// An int that may also be loaded from a float holding an integer.
  StateField& integral();
  /// A bool that is false when missing (Python's class default).
  StateField& or_false();
  /// Also requires an int >= `min`; `description` says so in messages.
  StateField& at_least(int64_t min, std::string description);
  /// Also requires a str equal to `a` or `b`.
  StateField& one_of(const std::string& a, const std::string& b);
  /// Also requires a list of `size` ints; `description` says so.
  StateField& of_size(size_t size, std::string description);

  const char* key;
  Member member;
  Save save;
  Check check;
  bool is_integral = false;
  bool is_or_false = false;
  /// The extra requirement on the stored value once its type is checked.
  std::function<bool(const c10::IValue&)> valid;
  std::string expected;
};

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
/// A value that failed a field's `valid`, for a message's "found".
std::string describe(const c10::IValue& value);

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
  /// The value of `key` as a `T` of `StateField::Member`; ints are accepted
  /// for floats.
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
} // namespace lamp::optim
