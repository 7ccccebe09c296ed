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

#include <memory>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace lamp::dist {
class ProcessGroup;
} // namespace lamp::dist

namespace lamp {

/// How an FP8 tensor's scale is chosen.
enum class Fp8Scaling {
  /// From the tensor itself, each time it is cast: scale = fp8 max /
  /// amax(tensor), as torchao's tensorwise recipe (no state, no host sync;
  /// one more read of the tensor).
  kCurrent,
  /// From the amaxes of earlier steps, as Transformer Engine's
  /// `DelayedScaling`: each lamp::nn::Linear keeps, for its input, weight
  /// and output gradient, a history of the last `amax_history_len` amaxes
  /// and a scale, in buffers (`fp8_amax_history` [3, len], `fp8_scale`
  /// [3]; state dicts and checkpoints carry them). A cast uses the scale as
  /// it is and records the tensor's amax; each forward call first updates
  /// the scales from the histories (Fp8Recipe's `amax_compute` and
  /// `margin`) and rolls them. All of it on the device, capturable by
  /// GraphedStep. The functional lamp::nn::linear has no buffers: it scales
  /// as kCurrent.
  kDelayed,
};

/// Which amax of a history the delayed scale follows.
enum class Fp8AmaxCompute {
  /// The largest in the history (Transformer Engine's "max").
  kMax,
  /// The newest (Transformer Engine's "most_recent").
  kMostRecent,
};

/// Options of an FP8 scope.
struct LAMP_API Fp8Recipe {
  /// Default Fp8Scaling::kCurrent.
  TORCH_ARG(Fp8Scaling, scaling) = Fp8Scaling::kCurrent;
  /// kDelayed: amaxes kept per tensor (the newest included). Default 1024,
  /// Transformer Engine's.
  TORCH_ARG(int64_t, amax_history_len) = 1024;
  /// kDelayed: scale = fp8 max / amax / 2^margin. Default 0.
  TORCH_ARG(int64_t, margin) = 0;
  /// kDelayed: default Fp8AmaxCompute::kMax.
  TORCH_ARG(Fp8AmaxCompute, amax_compute) = Fp8AmaxCompute::kMax;
  /// kDelayed: the ranks whose amaxes each scale follows (Transformer
  /// Engine's `fp8_group` with `reduce_amax`): before a layer updates its
  /// scales, the newest amaxes are reduced to their maximum over this
  /// group (lamp::dist::ProcessGroup::allreduce, kMax; every layer's
  /// in one small collective a forward pass, as Transformer Engine
  /// batches them, once the layers have been met), so every rank scales
  /// alike from every rank's data. Pass the group of
  /// DistributedDataParallel. Every rank must
  /// then make the same forward calls in the scope (an evaluation or
  /// sampling on one rank only belongs outside it). Default null: each rank
  /// follows its own amaxes.
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, amax_group) = nullptr;
  /// The forward GEMM accumulates in the FP8 tensor cores' own precision
  /// (at::_scaled_mm's `use_fast_accum`), not promoted to fp32 at intervals:
  /// faster, a little less exact. The backward's GEMMs (the gradients) never
  /// do. Default true, the forward-only choice of torchao's float8 training
  /// (`gemm_config_output.use_fast_accum`) and Transformer Engine's recipes
  /// (`fp8_gemm_fprop` without the split accumulator). No effect on the CPU.
  TORCH_ARG(bool, fast_accum_forward) = true;
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
/// - Overflow: under kCurrent a finite tensor never overflows e4m3/e5m2,
///   since its scale comes from its own amax. Under kDelayed the scale
///   comes from earlier steps, and finite values beyond the format's range
///   saturate at its maximum (as Transformer Engine's casts do); the
///   tensor's amax, recorded, lowers the next step's scale. Either way an
///   inf or NaN is not saturated away: it makes the GEMM's output
///   non-finite, so GradScaler (fp16) sees it and skips the step as it
///   would without FP8, and a delayed scale ignores a non-finite amax (it
///   keeps its value). bf16 needs no loss scaling.
/// - Activation checkpointing (lamp::checkpoint): the recompute runs in the
///   FP8 scope the forward call had, and does not update delayed scales
///   again.
/// - Weights: each is cast to FP8 once a scope; later calls in the scope
///   (the next micro-batch, a recompute, a tied layer) reuse the copy while
///   the weight is unchanged (its version: in-place ops, optimizer steps,
///   GraphedStep replays), so a scope around a step's micro-batches casts
///   each weight once a step. The copies are freed when the scope ends.
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
  /// Checks a recipe: a c10::ValueError naming the option when
  /// amax_history_len < 1 or margin < 0. The constructor calls it.
  static void check(const Fp8Recipe& recipe);

 private:
  bool prev_enabled_;
  Fp8Recipe prev_recipe_;
};

/// Registers the delayed-scaling buffers (`fp8_amax_history`, `fp8_scale`)
/// of every lamp::nn::Linear in `model` that lacks them, as their first
/// forward call in a kDelayed scope would: call it before loading a
/// checkpoint of a model trained with delayed FP8 scaling (the load is
/// strict: without the buffers their keys are unexpected). Nothing for
/// kCurrent.
LAMP_API void init_fp8_state(torch::nn::Module& model, const Fp8Recipe& recipe);

/// Delayed scaling: updates now the scales of every lamp::nn::Linear in
/// `model` that has FP8 state, in one launch per 128 layers on a GPU (and,
/// with the recipe's amax_group, one all-reduce of their amaxes), instead
/// of a launch in each layer's forward call; each layer's next forward call
/// then uses them as they are. Call it inside the scope, at the top of a
/// step (after the last backward, before the forward): the scales are then
/// the ones the layers' own calls would have computed, since a layer's
/// amaxes change only in its own calls and its backward (Transformer Engine
/// likewise updates all its layers at once). A layer called twice in a
/// forward updates again at its second call, as without it; a state
/// changed in between (a checkpoint loaded) is updated at its call. Thread:
/// the one that runs the forward. Outside an enabled kDelayed scope it does
/// nothing (each layer updates at its call, as ever). Capturable by
/// GraphedStep.
LAMP_API void update_fp8_scales(torch::nn::Module& model);

} // namespace lamp
