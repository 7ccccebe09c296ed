#pragma once

// The dict type of lamp's Python-style `state_dict()`s.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>

#include <lamp/export.h>

namespace lamp {

/// A Python-style state dict: string keys, values of any `c10::IValue`
/// type (numbers, strings, tensors, lists, nested dicts). What lamp's
/// `state_dict()` methods return, `load_state_dict()` methods take, and
/// checkpoints hold.
using StateDict = c10::Dict<std::string, c10::IValue>;

/// An empty `StateDict` (`c10::Dict<std::string, c10::IValue>` has no
/// default constructor).
LAMP_API StateDict new_state_dict();

/// `dict` (string keys, e.g. read from a file) as a `StateDict`; throws
/// `c10::Error` for a key that is not a string.
LAMP_API StateDict to_state_dict(const c10::impl::GenericDict& dict);

} // namespace lamp
