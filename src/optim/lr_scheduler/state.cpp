#include "state.h"

#include "../python_repr.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lamp::optim::detail {

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

std::optional<double> as_double(const c10::IValue& value) {
  if (value.isDouble()) {
    return value.toDouble();
  }
  if (value.isInt()) {
    return static_cast<double>(value.toInt());
  }
  return std::nullopt;
}

void StateReader::fail(
    const std::string& key,
    const std::string& expected,
    const std::string& found) const {
  TORCH_CHECK(
      false,
      where_,
      ": key '",
      key,
      "': expected ",
      expected,
      ", found ",
      found,
      ". Nothing was loaded.");
}

bool StateReader::has(const std::string& key) const {
  return state_.contains(c10::IValue(key));
}

const c10::IValue& StateReader::get(const std::string& key) const {
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
  const auto& value = get(key);
  if (!(value.*is)()) {
    fail(key, expected, python_type_name(value));
  }
  return value;
}

template <typename T, typename Convert>
std::vector<T> StateReader::get_list(
    const std::string& key,
    const std::string& expected,
    std::optional<size_t> size,
    Convert convert) const {
  const auto& list = get_if(key, expected, &c10::IValue::isList).toListRef();
  if (size && list.size() != *size) {
    fail(key, expected, "a list of " + std::to_string(list.size()));
  }
  std::vector<T> out;
  out.reserve(list.size());
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

int64_t StateReader::get_int(const std::string& key) const {
  return get_if(key, "an int", &c10::IValue::isInt).toInt();
}

int64_t StateReader::get_integral(const std::string& key) const {
  const auto& value = get(key);
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

double StateReader::get_double(const std::string& key) const {
  const auto& value = get(key);
  auto out = as_double(value);
  if (!out) {
    fail(key, "a float", python_type_name(value));
  }
  return *out;
}

bool StateReader::get_bool(const std::string& key) const {
  return get_if(key, "a bool", &c10::IValue::isBool).toBool();
}

bool StateReader::get_bool_or(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

std::string StateReader::get_string(const std::string& key) const {
  return get_if(key, "a str", &c10::IValue::isString).toStringRef();
}

std::optional<double> StateReader::get_optional_double(
    const std::string& key) const {
  const auto& value = get(key);
  if (value.isNone()) {
    return std::nullopt;
  }
  auto out = as_double(value);
  if (!out) {
    fail(key, "a float or None", python_type_name(value));
  }
  return out;
}

std::vector<double> StateReader::get_double_list(
    const std::string& key,
    std::optional<size_t> size) const {
  return get_list<double>(
      key,
      size ? "a list of " + std::to_string(*size) +
              " floats (one per param group)"
           : std::string("a list of floats"),
      size,
      as_double);
}

std::vector<int64_t> StateReader::get_int_list(const std::string& key) const {
  return get_list<int64_t>(
      key, "a list of ints", std::nullopt, [](const c10::IValue& v) {
        return v.isInt() ? std::optional<int64_t>(v.toInt()) : std::nullopt;
      });
}

std::vector<std::pair<int64_t, int64_t>> StateReader::get_counter(
    const std::string& key) const {
  const std::string expected = "a dict int -> int (milestone -> count)";
  std::vector<std::pair<int64_t, int64_t>> out;
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

} // namespace lamp::optim::detail
