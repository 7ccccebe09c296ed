#include <lamp/nn/linear_cross_entropy.h>

#include <lamp/config.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/_foreach_mul.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

#include "tied_grad.h"

#if LAMP_WITH_CUDA
#include "cross_entropy_cuda.h"
#endif

// Note [Cross-entropy without the logits]
// For a row x with logits z = W x and target t, the loss is
// lse(z) - z[t] and its gradient dz = softmax(z) - one_hot(t), so
// dx = W^T dz and dW += dz x^T. All of it is known once z is: forward
// computes a chunk's z, turns it into dz in place (with the rows' losses),
// and multiplies dz into dx (kept, in the GEMM dtype) and dW (kept, fp32),
// then drops it. Backward scales both by the loss's gradient (divided by
// the number of counted targets for the mean). dz is stored unscaled: with
// fp16 and a loss scale, Python's dz = (p - onehot) * scale / N keeps small
// probabilities a scale of 65,536 away from fp16's underflow; unscaled p -
// onehot keeps them further still, and the scale is applied in fp32 after
// the GEMMs.

namespace lamp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// NOTE: the most logits a chunk holds. Each chunk also reads and writes the
// fp32 weight gradient once (GPT-2: 2 x 154 MB): at 256 MiB, seven chunks
// of GPT-2's head took 0.6 ms more than one GEMM of all rows on an H100.
constexpr int64_t kChunkBytes = int64_t{1} << 30;

// The softmax cross-entropy of one chunk of logits, in place (see the
// Note): ATen's ops where lamp's kernel does not apply.
void softmax_xent_grad_(
    at::Tensor& logits,
    const at::Tensor& target,
    int64_t ignore_index,
    at::Tensor& loss) {
#if LAMP_WITH_CUDA
  if (detail::cuda_softmax_xent_grad_(logits, target, ignore_index, loss)) {
    return;
  }
#endif
  const int64_t classes = logits.size(1);
  const auto valid = target != ignore_index;
  TORCH_CHECK_INDEX(
      (~valid | ((target >= 0) & (target < classes))).all().item<bool>(),
      "lamp::nn::linear_cross_entropy: a target is outside [0, ",
      classes,
      ") and is not ignore_index");
  const auto safe = at::where(valid, target, 0).unsqueeze(1);
  const auto z = logits.to(at::kFloat);
  const auto lse = at::logsumexp(z, 1, /*keepdim=*/true);
  loss.copy_((lse - z.gather(1, safe)).squeeze(1) * valid);
  auto grad = (z - lse).exp_();
  grad.scatter_add_(1, safe, -valid.to(at::kFloat).unsqueeze(1));
  logits.copy_(grad.mul_(valid.unsqueeze(1)));
}

// `grad * scale` for a 0-d fp32 `scale` on grad's device, out of place (the
// saved gradients stay as they are for a second backward with
// retain_graph). NOTE: to `*` a 0-d CUDA tensor is a broadcast operand (an
// element a thread, GPT-2's 154 MB head gradient in 0.17 ms on an H100);
// the foreach kernel reads it as a scalar and moves 16 bytes at a time.
// The same fp32 products.
at::Tensor grad_times_scale(const at::Tensor& grad, const at::Tensor& scale) {
  return at::_foreach_mul({grad}, scale)[0];
}

class LinearCrossEntropyFunction
    : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // `input` (N, C) in the GEMM dtype; `weight` (V, C) the caller's, cast
  // here (see the NOTE in linear_cross_entropy); `input_dtype` is the
  // caller's input's, for its gradient. See the Note.
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& master_weight,
      const at::Tensor& target,
      int64_t ignore_index,
      bool mean,
      int64_t chunk_size,
      bool want_grads,
      at::ScalarType input_dtype,
      c10::intrusive_ptr<detail::TiedGradSlot> tied) {
    ctx->set_materialize_grads(false);
    const at::Tensor weight = master_weight.to(input.scalar_type());
    const int64_t rows = input.size(0);
    const int64_t classes = weight.size(0);
    const auto f32 = input.options().dtype(at::kFloat);
    auto losses = at::empty({rows}, f32);
    at::Tensor dx, dw;
    if (want_grads) {
      dx = at::empty_like(input);
      // NOTE: the first chunk's GEMM writes it (beta 0); zero rows, zeros.
      dw = rows > 0 ? at::empty(weight.sizes(), f32)
                    : at::zeros(weight.sizes(), f32);
    }
    // Automatic: as few equal chunks as keep each within kChunkBytes.
    const int64_t most =
        std::max<int64_t>(1, kChunkBytes / (classes * weight.element_size()));
    const int64_t chunks = std::max<int64_t>(1, (rows + most - 1) / most);
    const int64_t chunk =
        chunk_size > 0 ? chunk_size : (rows + chunks - 1) / chunks;
    const bool fp32_dw = !input.is_cuda() || weight.scalar_type() == at::kFloat;
    for (int64_t begin = 0; begin < rows; begin += chunk) {
      const int64_t n = std::min(chunk, rows - begin);
      const auto x = input.narrow(0, begin, n);
      auto z = at::mm(x, weight.t());
      auto loss = losses.narrow(0, begin, n);
      softmax_xent_grad_(z, target.narrow(0, begin, n), ignore_index, loss);
      if (!want_grads) {
        continue;
      }
      auto dx_chunk = dx.narrow(0, begin, n);
      at::mm_out(dx_chunk, z, weight);
      const int beta = begin == 0 ? 0 : 1; // beta 0: dw is not read
      if (fp32_dw) {
        dw.addmm_(z.t().to(at::kFloat), x.to(at::kFloat), beta);
      } else {
        // bf16/fp16 operands, fp32 accumulation and output (cuBLAS).
        at::addmm_out(dw, dw, z.t(), x, at::kFloat, beta);
      }
    }
    auto total = losses.sum();
    at::Tensor count;
    if (mean) {
      count = (target != ignore_index).sum().to(at::kFloat);
      total = total / count;
    }
    if (want_grads) {
      ctx->saved_data["dx"] = dx;
      ctx->saved_data["dw"] = dw;
      if (mean) {
        ctx->saved_data["count"] = count;
      }
      ctx->saved_data["input_dtype"] = input_dtype;
      ctx->saved_data["weight_dtype"] = master_weight.scalar_type();
      if (tied) {
        ctx->saved_data["tied"] = c10::IValue::make_capsule(std::move(tied));
      }
    }
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::linear_cross_entropy: no double backward (backward with "
        "create_graph=true); use torch::cross_entropy_loss(lamp::nn::"
        "linear(...)) for that");
    const variable_list none(9);
    const auto& grad = grads[0];
    if (!grad.defined() || !ctx->saved_data.count("dx")) {
      return none;
    }
    const auto dx = ctx->saved_data["dx"].toTensor();
    const auto dw = ctx->saved_data["dw"].toTensor();
    auto scale = grad.to(at::kFloat);
    if (ctx->saved_data.count("count")) {
      scale = scale / ctx->saved_data["count"].toTensor();
    }
    variable_list out = none;
    if (ctx->needs_input_grad(0)) {
      out[0] = grad_times_scale(dx.to(at::kFloat), scale)
                   .to(ctx->saved_data["input_dtype"].toScalarType());
    }
    if (ctx->needs_input_grad(1)) {
      out[1] = grad_times_scale(dw, scale).to(
          ctx->saved_data["weight_dtype"].toScalarType());
      // A token embedding sharing the weight adds its rows into this (Note
      // [A tied embedding's gradient] in embedding.cpp).
      if (ctx->saved_data.count("tied")) {
        detail::hand_tied_grad(
            c10::static_intrusive_pointer_cast<detail::TiedGradSlot>(
                ctx->saved_data["tied"].toCapsule()),
            out[1]);
      }
    }
    return out;
  }
};

} // namespace

torch::Tensor linear_cross_entropy(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    const torch::Tensor& target,
    const LinearCrossEntropyOptions& options) {
  const char* name = "lamp::nn::linear_cross_entropy";
  TORCH_CHECK(
      input.defined() && weight.defined() && target.defined(),
      name,
      ": input, weight and target must be defined");
  TORCH_CHECK_VALUE(
      !std::holds_alternative<torch::enumtype::kNone>(options.reduction()),
      name,
      ": reduction kNone is not supported (the loss is summed chunk by "
      "chunk); use torch::cross_entropy_loss(lamp::nn::linear(input, "
      "weight), target, ...) for per-row losses");
  TORCH_CHECK_VALUE(
      input.dim() >= 1 && weight.dim() == 2 &&
          input.size(-1) == weight.size(1) && weight.size(0) > 0,
      name,
      ": expected input (..., C) and weight (V, C), got sizes ",
      input.sizes(),
      " and ",
      weight.sizes());
  TORCH_CHECK_VALUE(
      target.scalar_type() == at::kLong &&
          target.numel() * input.size(-1) == input.numel(),
      name,
      ": expected int64 targets, one per row of the input (",
      input.numel() / std::max<int64_t>(input.size(-1), 1),
      "), got ",
      target.scalar_type(),
      " of sizes ",
      target.sizes());
  TORCH_CHECK_VALUE(
      options.chunk_size() >= 0,
      name,
      ": chunk_size must be >= 0 (0: automatic), got ",
      options.chunk_size());
  // As Python's linear under autocast: both operands in the autocast dtype.
  // NOTE: the weight is cast inside the function, not by an autograd op:
  // its gradient, summed in fp32, then comes back in the weight's own dtype
  // directly, not rounded to the GEMM dtype and cast back (GPT-2's tied
  // head: two passes over the 154 MB gradient, 0.2 ms of an H100's step).
  auto x = input.reshape({-1, input.size(-1)});
  const auto device = input.device().type();
  at::ScalarType gemm_dtype = weight.scalar_type();
  // What autocast would cast: floating point, not float64 (the weight is
  // cast below only where autocast's own cast would have cast it).
  bool weight_cast = false;
  if (at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(input, device)) {
    gemm_dtype = at::autocast::get_autocast_dtype(device);
    x = x.to(gemm_dtype);
    weight_cast = at::autocast::is_autocast_eligible(weight, device) &&
        weight.scalar_type() != at::kDouble;
  }
  TORCH_CHECK_VALUE(
      x.is_floating_point() && x.scalar_type() == gemm_dtype &&
          (weight.scalar_type() == gemm_dtype || weight_cast) &&
          x.device() == weight.device() && target.device() == x.device(),
      name,
      ": input and weight must be floating point of one dtype, on the "
      "target's device; got ",
      x.scalar_type(),
      " on ",
      x.device(),
      ", ",
      weight.scalar_type(),
      " on ",
      weight.device(),
      " and targets on ",
      target.device());
  const bool want_grads = at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad());
  // NOTE: the operands are cast already; autocast would cast nothing more,
  // and the loss must not be cast back.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  // The slot a token embedding tied to this weight offered, if any.
  c10::intrusive_ptr<detail::TiedGradSlot> tied;
  if (want_grads && weight.requires_grad()) {
    tied = detail::take_tied_grad_slot(weight);
  }
  return LinearCrossEntropyFunction::apply(
      x.contiguous(),
      weight,
      target.reshape({-1}).contiguous(),
      options.ignore_index(),
      std::holds_alternative<torch::enumtype::kMean>(options.reduction()),
      options.chunk_size(),
      want_grads,
      input.scalar_type(),
      std::move(tied));
}

} // namespace lamp::nn
