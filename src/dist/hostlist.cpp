#include "hostlist.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cstdint>

namespace lamp::dist::detail {
namespace {

[[noreturn]] void fail(
    const std::string& list,
    const std::string& variable,
    const std::string& why) {
  C10_THROW_ERROR(
      ValueError,
      c10::str(
          "lamp::dist: ",
          variable,
          "='",
          list,
          "' is not a Slurm host list: ",
          why,
          ". Expected e.g. 'gpu[01-04,07],login1'; or set MASTER_ADDR."));
}

// One bracketed set, e.g. "01-04,07": its members in order.
std::vector<std::string> expand_set(
    const std::string& set,
    const std::string& list,
    const std::string& variable,
    size_t max_hosts) {
  auto bad = [&](const std::string& why) { fail(list, variable, why); };
  auto is_number = [](const std::string& text) {
    if (text.empty() || text.size() > 18) {
      return false;
    }
    for (const char c : text) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        return false;
      }
    }
    return true;
  };
  std::vector<std::string> members;
  size_t begin = 0;
  while (begin <= set.size()) {
    const size_t comma = std::min(set.find(',', begin), set.size());
    const std::string item = set.substr(begin, comma - begin);
    begin = comma + 1;
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi =
        dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!is_number(lo) || !is_number(hi)) {
      bad("'[" + set + "]' holds '" + item + "', not a number or range");
    }
    const int64_t first = std::stoll(lo);
    const int64_t last = std::stoll(hi);
    if (last < first) {
      bad("the range '" + item + "' runs backwards");
    }
    if (static_cast<uint64_t>(last - first) >= max_hosts) {
      bad("the range '" + item + "' has too many hosts");
    }
    for (int64_t n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) {
        digits.insert(0, lo.size() - digits.size(), '0');
      }
      members.push_back(std::move(digits));
    }
  }
  return members;
}

} // namespace

std::vector<std::string> expand_slurm_hostlist(
    const std::string& list,
    const std::string& variable,
    size_t max_hosts) {
  auto bad = [&](const std::string& why) { fail(list, variable, why); };
  std::vector<std::string> hosts;
  size_t i = 0;
  while (i < list.size()) {
    // One entry: text and bracketed sets up to a comma outside brackets.
    std::vector<std::string> names{""};
    bool empty = true;
    for (; i < list.size() && list[i] != ','; empty = false) {
      if (list[i] == ']') {
        bad("a ']' without its '['");
      }
      if (list[i] != '[') {
        const size_t end = list.find_first_of("[],", i);
        const std::string text = list.substr(i, end - i);
        for (auto& name : names) {
          name += text;
        }
        i = end == std::string::npos ? list.size() : end;
        continue;
      }
      const size_t close = list.find(']', i);
      if (close == std::string::npos) {
        bad("a '[' without its ']'");
      }
      const std::string set = list.substr(i + 1, close - i - 1);
      if (set.find('[') != std::string::npos) {
        bad("nested '['");
      }
      const auto members = expand_set(set, list, variable, max_hosts);
      if (names.size() * members.size() > max_hosts) {
        bad("more than " + std::to_string(max_hosts) + " hosts");
      }
      std::vector<std::string> product;
      product.reserve(names.size() * members.size());
      for (const auto& name : names) {
        for (const auto& member : members) {
          product.push_back(name + member);
        }
      }
      names = std::move(product);
      i = close + 1;
    }
    if (empty) {
      bad("an empty entry");
    }
    if (hosts.size() + names.size() > max_hosts) {
      bad("more than " + std::to_string(max_hosts) + " hosts");
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
    if (i < list.size()) {
      ++i; // the comma
      if (i == list.size()) {
        bad("an empty entry");
      }
    }
  }
  if (hosts.empty()) {
    bad("no host");
  }
  return hosts;
}

} // namespace lamp::dist::detail
