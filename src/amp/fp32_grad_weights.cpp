#include "fp32_grad_weights.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unordered_map>

// Note [fp32 weight gradients]
// Under autocast a linear layer's weight gradient comes out of its GEMM in
// the 16-bit type (the fp32 accumulator rounded), and the cast's backward
// then casts it to fp32 for the parameter: 2 bytes written, 2 read and 4
// written a parameter, one more pass over all the weights every step
// (measured on an H100: 2.0 ms of a checkpointed gpt2-xl step, 0.27 ms
// of a gpt2 step; docs/transformers.md). With
// CastWeightsOptions::fp32_weight_grads the guard records, per thread,
// which fp32 parameter each of its casts is of; lamp's linear layers
// (lamp::nn::linear, lamp::nn::gelu_mlp) that find their weight here take
// the parameter itself as the autograd input whose gradient they return,
// compute with the cast (detached: its node gets no gradient from them)
// and have the GEMM write the fp32 accumulator (4 bytes a parameter, no
// cast). The gradient is the same product without the rounding to 16
// bits in between: more precise, not autocast's bits. Megatron-LM's
// gradient_accumulation_fusion and Transformer Engine's main_grad do the
// same.
//
// NOTE: per thread, because a guard is a scope of the thread that makes
// it: the forward that reads its casts runs there, and a checkpoint's
// recompute (which makes its own guard, in the autograd engine's thread)
// has its own.

namespace lamp::detail {
namespace {

// The cast (held, so that its address is not another tensor's while it is
// a key) and its parameter.
struct Fp32GradEntry {
  at::Tensor cast;
  at::Tensor param;
};

std::unordered_map<const c10::TensorImpl*, Fp32GradEntry>& fp32_grad_registry() {
  thread_local std::unordered_map<const c10::TensorImpl*, Fp32GradEntry> map;
  return map;
}

} // namespace

at::Tensor fp32_grad_param(const at::Tensor& weight) {
  if (!weight.defined()) {
    return {};
  }
  const auto& map = fp32_grad_registry();
  if (map.empty()) {
    return {};
  }
  const auto it = map.find(weight.unsafeGetTensorImpl());
  return it == map.end() ? at::Tensor() : it->second.param;
}

void register_fp32_grad_weights(
    const std::vector<at::Tensor>& casts,
    const std::vector<at::Tensor>& params) {
  TORCH_INTERNAL_ASSERT(casts.size() == params.size());
  auto& map = fp32_grad_registry();
  for (size_t i = 0; i < casts.size(); ++i) {
    map[casts[i].unsafeGetTensorImpl()] = Fp32GradEntry{casts[i], params[i]};
  }
}

void unregister_fp32_grad_weights(const std::vector<at::Tensor>& casts) {
  auto& map = fp32_grad_registry();
  for (const auto& c : casts) {
    map.erase(c.unsafeGetTensorImpl());
  }
}

at::Tensor weight_grad(
    const at::Tensor& grad2d,
    const at::Tensor& input2d,
    bool fp32) {
  if (!fp32) {
    return grad2d.t().mm(input2d);
  }
  const auto t = grad2d.scalar_type();
  // NOTE: not in grad mode (a backward with create_graph): ATen's mm with an
  // out_dtype has no derivative; the operands' fp32 values multiplied are
  // the same product, accumulated in another order.
  if (grad2d.is_cuda() && (t == at::kBFloat16 || t == at::kHalf) &&
      input2d.scalar_type() == t && !at::GradMode::is_enabled()) {
    return at::mm(grad2d.t(), input2d, at::kFloat);
  }
  return grad2d.t().to(at::kFloat).mm(input2d.to(at::kFloat));
}

} // namespace lamp::detail
