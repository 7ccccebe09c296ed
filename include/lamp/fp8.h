#pragma once

// FP8 GEMMs for lamp's Linear layers on Hopper (and on the CPU, for tests):
// a thread-local scope, as Transformer Engine's fp8_autocast, inside which
// lamp::nn::linear / lamp::nn::Linear run their forward GEMM and both
// backward GEMMs through at::_scaled_mm in FP8: e4m3 activations and
// weights, e5m2 output gradients, a scale per tensor. Python's twins:
// torchao's float8 training (tensorwise scaling), Transformer Engine's
// fp8_autocast.

#include <torch/arg.h>

#include <lamp/export.h>

namespace lamp {

/// How an FP8 tensor's scale is chosen.
enum class Fp8Scaling {
  /// From the tensor itself, each time it is cast: scale = fp8 max /
  /// amax(tensor), as torchao's tensorwise recipe (no state, no host sync;
  /// one more read of the tensor).
  kCurrent,
};

/// Options of an FP8 scope.
struct LAMP_API Fp8Recipe {
  /// Default Fp8Scaling::kCurrent.
  TORCH_ARG(Fp8Scaling, scaling) = Fp8Scaling::kCurrent;
};

/// Within its scope (this thread, until destroyed), lamp's Linear layers
/// run their GEMMs in FP8 (see the file comment); everything else keeps
/// the precision it had. Use it inside an AutocastGuard (bf16 on a GPU):
/// the GEMMs' outputs are in autocast's dtype (else the input's), and the
/// master weights stay as they are (fp32). Gradients of the bias and every
/// other operation stay in high precision.
///
/// - Shapes: on a GPU both the input's features and the output's must be
///   multiples of 16 (cuBLASLt's FP8 GEMMs); other layers, and inputs that
///   are not floating point, run as without the scope.
/// - Overflow: a finite tensor never overflows e4m3/e5m2, since its scale
///   comes from its own amax (values are saturated at the format's maximum
///   before the cast). A tensor with an inf or NaN gets a zero scale and
///   makes the GEMM's output non-finite, so GradScaler (fp16) sees it and
///   skips the step as it would without FP8. bf16 needs no loss scaling.
/// - Not copyable; state is thread-local: the scope of the thread that runs
///   the forward pass decides (backward follows it).
///
/// Example:
/// \code
///   lamp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
///   lamp::Fp8AutocastGuard fp8; // current (tensorwise) scaling
///   auto loss = model->forward(x);
/// \endcode
class LAMP_API Fp8AutocastGuard {
 public:
  explicit Fp8AutocastGuard(Fp8Recipe recipe = {}, bool enabled = true);
  ~Fp8AutocastGuard();
  Fp8AutocastGuard(const Fp8AutocastGuard&) = delete;
  Fp8AutocastGuard& operator=(const Fp8AutocastGuard&) = delete;
  Fp8AutocastGuard(Fp8AutocastGuard&&) = delete;
  Fp8AutocastGuard& operator=(Fp8AutocastGuard&&) = delete;

  /// True inside an enabled scope on this thread.
  static bool is_enabled();
  /// The recipe of the innermost scope (default options outside one).
  static Fp8Recipe recipe();

 private:
  bool prev_enabled_;
  Fp8Recipe prev_recipe_;
};

} // namespace lamp
