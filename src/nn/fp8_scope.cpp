#include <lamp/fp8.h>

#include <c10/util/Exception.h>

#include "fp8_scope.h"
#include "fp8_weight_cache.h"

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

void Fp8AutocastGuard::check(const Fp8Recipe& recipe) {
  TORCH_CHECK_VALUE(
      recipe.amax_history_len() >= 1,
      "lamp::Fp8Recipe: amax_history_len must be at least 1, got ",
      recipe.amax_history_len());
  TORCH_CHECK_VALUE(
      recipe.margin() >= 0,
      "lamp::Fp8Recipe: margin must be at least 0, got ",
      recipe.margin());
}

Fp8AutocastGuard::Fp8AutocastGuard(Fp8Recipe recipe, bool enabled)
    : prev_enabled_(state().enabled), prev_recipe_(state().recipe) {
  check(recipe);
  state().enabled = enabled;
  state().recipe = recipe;
}

Fp8AutocastGuard::~Fp8AutocastGuard() {
  state().enabled = prev_enabled_;
  state().recipe = prev_recipe_;
  if (!prev_enabled_) {
    // FP8 is off on this thread again: its weights' copies go (Note [FP8
    // weight cache]).
    nn::detail::fp8_clear_weight_cache();
  }
}

namespace nn::detail {

bool& fp8_recomputing() {
  thread_local bool recomputing = false;
  return recomputing;
}

} // namespace nn::detail

bool Fp8AutocastGuard::is_enabled() {
  return state().enabled;
}

Fp8Recipe Fp8AutocastGuard::recipe() {
  return state().recipe;
}

} // namespace lamp
