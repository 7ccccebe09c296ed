// The registry of Note [Watching collectives]: which process groups
// enqueued collectives during which CUDA graph capture.

#include "backend.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace lamp::dist::detail {
namespace {

struct Registry {
  std::mutex mutex; // guards `captures`
  std::map<unsigned long long, std::vector<std::weak_ptr<Backend>>> captures;
};

Registry& registry() {
  static auto* instance = new Registry(); // NOTE: never destroyed
  return *instance;
}

} // namespace

void note_captured_collective(
    unsigned long long capture_id,
    const std::weak_ptr<Backend>& backend) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& noted = r.captures[capture_id];
  const bool known =
      std::any_of(noted.begin(), noted.end(), [&](const auto& other) {
        return !other.owner_before(backend) && !backend.owner_before(other);
      });
  if (!known) {
    noted.push_back(backend);
  }
}

std::vector<std::weak_ptr<Backend>> take_captured_collectives(
    unsigned long long capture_id) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.captures.find(capture_id);
  if (it == r.captures.end()) {
    return {};
  }
  auto noted = std::move(it->second);
  r.captures.erase(it);
  return noted;
}

} // namespace lamp::dist::detail
