#include "python_repr.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lamp::detail {

std::string python_repr(double x) {
  if (std::isnan(x)) {
    return "nan";
  }
  if (std::isinf(x)) {
    return x > 0 ? "inf" : "-inf";
  }
  char buffer[32];
  for (int precision = 0; precision < 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision, x);
    if (std::strtod(buffer, nullptr) == x) {
      break;
    }
  }
  // buffer is "[-]d[.ddd]e±XX": split it into sign, digits and the
  // position of the decimal point (value = 0.digits * 10^point).
  std::string text(buffer);
  const auto e = text.find('e');
  const int point = std::atoi(text.c_str() + e + 1) + 1;
  std::string sign = text[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i) {
    if (text[i] != '.') {
      digits += text[i];
    }
  }
  const int n = static_cast<int>(digits.size());
  // NOTE: Python's float_repr_style 'short' switches to an exponent when
  // the point is 4 places left of the digits or 16 right.
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      return sign + "0." + std::string(-point, '0') + digits;
    }
    if (point >= n) {
      return sign + digits + std::string(point - n, '0') + ".0";
    }
    return sign + digits.substr(0, point) + "." + digits.substr(point);
  }
  const int exponent = point - 1;
  std::snprintf(
      buffer,
      sizeof(buffer),
      "e%c%02d",
      exponent < 0 ? '-' : '+',
      std::abs(exponent));
  const auto mantissa =
      n == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
  return sign + mantissa + buffer;
}

} // namespace lamp::detail
