#include "state.h"

#include "../python_repr.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <type_traits>

namespace lamp::optim {

namespace {

// A float or an int as a double; nullopt for other types.
std::optional<double> as_double(const c10::IValue& value) {
  if (value.isDouble()) {
    return value.toDouble();
  }
  return value.isInt() ? std::optional<double>(value.toInt()) : std::nullopt;
}

} // namespace

LRScheduler::StateField& LRScheduler::StateField::at_least(
    int64_t min,
    std::string description) {
  valid = [min](const c10::IValue& v) -> std::optional<std::string> {
    // An int, or a float that get_integral accepted.
    const auto value =
        v.isInt() ? v.toInt() : static_cast<int64_t>(v.toDouble());
    return value >= min ? std::nullopt : std::optional(std::to_string(value));
  };
  expected = std::move(description);
  return *this;
}

LRScheduler::StateField& LRScheduler::StateField::one_of(
    const std::string& a,
    const std::string& b) {
  valid = [a, b](const c10::IValue& v) -> std::optional<std::string> {
    const auto& value = v.toStringRef();
    return value == a || value == b ? std::nullopt
                                    : std::optional("'" + value + "'");
  };
  expected = "'" + a + "' or '" + b + "'";
  return *this;
}

LRScheduler::StateField& LRScheduler::StateField::of_size(
    size_t size,
    std::string description) {
  valid = [size](const c10::IValue& v) -> std::optional<std::string> {
    const size_t found = v.toListRef().size();
    return found == size ? std::nullopt
                         : std::optional("a list of " + std::to_string(found));
  };
  expected = std::move(description);
  return *this;
}

namespace detail {

std::string python_type_name(const c10::IValue& value) {
  static const std::pair<bool (c10::IValue::*)() const, const char*> kNames[] =
      {{&c10::IValue::isNone, "None"},
       {&c10::IValue::isInt, "int"},
       {&c10::IValue::isDouble, "float"},
       {&c10::IValue::isBool, "bool"},
       {&c10::IValue::isString, "str"},
       {&c10::IValue::isList, "list"},
       {&c10::IValue::isGenericDict, "dict"},
       {&c10::IValue::isTuple, "tuple"},
       {&c10::IValue::isTensor, "Tensor"}};
  for (const auto& [is, name] : kNames) {
    if ((value.*is)()) {
      return name;
    }
  }
  return value.tagKind();
}

void StateReader::fail(
    const std::string& key,
    const std::string& expected,
    const std::string& found) const {
  TORCH_CHECK(
      false,
      where_ + ": key '" + key + "': expected " + expected + ", found " +
          found + ". Nothing was loaded.");
}

const c10::IValue& StateReader::at(const std::string& key) const {
  auto it = state_.find(c10::IValue(key));
  if (it == state_.end()) {
    fail(key, "a value", "no such key (missing)");
  }
  return it->value();
}

const c10::IValue& StateReader::get_if(
    const std::string& key,
    const std::string& expected,
    bool (c10::IValue::*is)() const) const {
  const auto& value = at(key);
  if (!(value.*is)()) {
    fail(key, expected, python_type_name(value));
  }
  return value;
}

c10::ArrayRef<c10::IValue> StateReader::get_list(
    const std::string& key,
    const std::string& expected,
    std::optional<size_t> size) const {
  const auto list = get_if(key, expected, &c10::IValue::isList).toListRef();
  if (size && list.size() != *size) {
    fail(key, expected, "a list of " + std::to_string(list.size()));
  }
  return list;
}

template <typename T, typename Convert>
std::vector<T> StateReader::get_list(
    const std::string& key,
    const std::string& expected,
    std::optional<size_t> size,
    Convert convert) const {
  const auto list = get_list(key, expected, size);
  std::vector<T> out;
  for (size_t i = 0; i < list.size(); ++i) {
    std::optional<T> v = convert(list[i]);
    if (!v) {
      fail(
          key,
          expected,
          "a list whose element " + std::to_string(i) + " is a " +
              python_type_name(list[i]));
    }
    out.push_back(std::move(*v));
  }
  return out;
}

template <typename T>
T StateReader::get(const std::string& key) const {
  if constexpr (std::is_same_v<T, int64_t>) {
    return get_if(key, "an int", &c10::IValue::isInt).toInt();
  } else if constexpr (std::is_same_v<T, bool>) {
    return get_if(key, "a bool", &c10::IValue::isBool).toBool();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return get_if(key, "a str", &c10::IValue::isString).toStringRef();
  } else if constexpr (std::is_same_v<T, double>) {
    const auto value = as_double(at(key));
    if (!value) {
      fail(key, "a float", python_type_name(at(key)));
    }
    return *value;
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    const auto value = as_double(at(key));
    if (!value && !at(key).isNone()) {
      fail(key, "a float or None", python_type_name(at(key)));
    }
    return value;
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    return get_list<double>(
        key,
        "a list of " + std::to_string(groups_) +
            " floats (one per param group)",
        groups_,
        as_double);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return get_list<int64_t>(
        key, "a list of ints", std::nullopt, [](const c10::IValue& v) {
          return v.isInt() ? std::optional<int64_t>(v.toInt()) : std::nullopt;
        });
  } else {
    const std::string expected = "a dict int -> int (milestone -> count)";
    T out;
    for (const auto& entry :
         get_if(key, expected, &c10::IValue::isGenericDict).toGenericDict()) {
      if (!entry.key().isInt() || !entry.value().isInt()) {
        fail(
            key,
            expected,
            "an entry " + python_type_name(entry.key()) + " -> " +
                python_type_name(entry.value()));
      }
      out.emplace_back(entry.key().toInt(), entry.value().toInt());
    }
    return out;
  }
}

template int64_t StateReader::get(const std::string&) const;
template double StateReader::get(const std::string&) const;
template bool StateReader::get(const std::string&) const;
template std::string StateReader::get(const std::string&) const;
template std::optional<double> StateReader::get(const std::string&) const;
template std::vector<double> StateReader::get(const std::string&) const;
template std::vector<int64_t> StateReader::get(const std::string&) const;
template std::vector<std::pair<int64_t, int64_t>> StateReader::get(
    const std::string&) const;

int64_t StateReader::get_integral(const std::string& key) const {
  const auto& value = at(key);
  if (value.isInt()) {
    return value.toInt();
  }
  if (value.isDouble() && std::trunc(value.toDouble()) == value.toDouble() &&
      std::abs(value.toDouble()) < 9e15) {
    return static_cast<int64_t>(value.toDouble());
  }
  fail(
      key,
      "an int",
      value.isDouble() ? "float " + lamp::detail::python_repr(value.toDouble())
                       : python_type_name(value));
}

std::vector<c10::impl::GenericDict> StateReader::get_dict_list(
    const std::string& key,
    std::optional<size_t> size) const {
  return get_list<c10::impl::GenericDict>(
      key,
      size ? "a list of " + std::to_string(*size) + " dicts"
           : std::string("a list of dicts"),
      size,
      [](const c10::IValue& v) {
        return v.isGenericDict()
            ? std::optional<c10::impl::GenericDict>(v.toGenericDict())
            : std::nullopt;
      });
}

} // namespace detail
} // namespace lamp::optim
