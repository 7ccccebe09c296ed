#include <lamp/fp8.h>

namespace lamp {
namespace {

// The innermost scope of this thread (see Fp8AutocastGuard).
struct Fp8State {
  bool enabled = false;
  Fp8Recipe recipe;
};

Fp8State& state() {
  thread_local Fp8State s;
  return s;
}

} // namespace

Fp8AutocastGuard::Fp8AutocastGuard(Fp8Recipe recipe, bool enabled)
    : prev_enabled_(state().enabled), prev_recipe_(state().recipe) {
  state().enabled = enabled;
  state().recipe = recipe;
}

Fp8AutocastGuard::~Fp8AutocastGuard() {
  state().enabled = prev_enabled_;
  state().recipe = prev_recipe_;
}

bool Fp8AutocastGuard::is_enabled() {
  return state().enabled;
}

Fp8Recipe Fp8AutocastGuard::recipe() {
  return state().recipe;
}

} // namespace lamp
