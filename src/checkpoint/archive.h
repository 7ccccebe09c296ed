#pragma once

// Internal: checkpoint files in the format of Python's `torch.save` (a zip
// archive holding `data.pkl` and one record per tensor storage), written so
// that `torch.load(path, weights_only=True)` accepts them and read without
// executing anything.

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <functional>
#include <string>

namespace lamp::detail {

/// Writes `value` (nested dicts with string or int keys, lists, tuples,
/// None, bools, ints, doubles, strings, tensors) as a torch.save archive
/// through `write`, which must write all bytes it is given or throw.
/// Typed lists and dicts are written as plain Python lists and dicts:
/// LibTorch's own pickler tags them with `torch.jit._pickle` globals that
/// Python's weights-only loader refuses. Tensors keep their device.
/// `force_zip64` writes zip64 fields everywhere (tests: as a file over
/// 4 GiB has them).
void write_torch_archive(
    const c10::IValue& value,
    const std::function<void(const void*, size_t)>& write,
    bool force_zip64 = false);

/// `value` with every list and dict rebuilt as a plain one of Any (what
/// write_torch_archive writes) and every tensor replaced by `tensor(t)`
/// (kept when `tensor` is empty).
c10::IValue plain_copy(
    const c10::IValue& value,
    const std::function<c10::IValue(const at::Tensor&)>& tensor);

/// Reads a `torch.save` archive (Python's, or `write_torch_archive`'s) from
/// `path`. Understands the subset of pickle that Python's weights-only
/// loader accepts for state dicts: dicts (also `collections.OrderedDict`,
/// whose `_metadata` is dropped), lists, tuples, None, bools, ints,
/// floats, strings, tensors and parameters. Tensors are loaded on the CPU
/// whatever device wrote them. Anything else, a truncated or corrupt file,
/// or a file that is no torch.save archive throws `c10::Error` naming
/// `path` and what was wrong.
c10::IValue read_torch_archive(const std::string& path);

} // namespace lamp::detail
