#pragma once

// Internal: Python's repr() of a float, for error messages that quote
// Python's.

#include <string>

namespace lamp::detail {

/// Python's repr(float): the shortest digits that read back the same,
/// "2.0", "1e-05", "1e+16", "10000.0", "inf", "nan".
std::string python_repr(double x);

} // namespace lamp::detail
