#include <lamp/nn/conv_shortcut.h>
#include <lamp/nn/diagnostics.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>

namespace lamp::nn {
namespace {

// Note [Accumulating the shortcut's gradient]
// The block input x has two consumers: the 1x1 convolution y = conv(x, W)
// and the shortcut s (an alias of x that this function returns as its
// second output). Autograd calls backward once both gradients, dy and ds,
// are there. In channels-last memory x, y and their gradients are
// row-major matrices (N*H*W rows, C columns), so
//   dx = ds + dy W      (dy: rows x Cout, W: Cout x Cin)
// is one GEMM with beta = 1: at::addmm_ on ds. That needs ds to be ours to
// overwrite: it is when nothing but the call's own gradient list holds it
// or its storage (the test autograd's InputBuffer makes before it adds in
// place), it is not a view and has x's dtype and layout. backward takes the
// list by reference so as not to hold a second reference itself (CppNode
// passes the list it owns, inputs moved in). Otherwise dx = addmm(ds, dy,
// W) into a new tensor (ATen copies ds there first). The weight gradient is
// at::convolution_backward's, as torch::conv2d's. Everything runs on the
// current stream, as the ATen ops it calls; no host sync.

std::atomic<int64_t> g_counts[3] = {};

void count(ShortcutGradient how) {
  g_counts[static_cast<int>(how)].fetch_add(1, std::memory_order_relaxed);
}

// A channels-last contiguous 4-d tensor as the row-major matrix its memory
// is: N*H*W rows, C columns. NOTE: view, not reshape: results are written
// through it, so it must never be a copy (view throws instead).
at::Tensor as_rows(const at::Tensor& t) {
  return t.permute({0, 2, 3, 1}).view({-1, t.size(1)});
}

bool ours_to_overwrite(const at::Tensor& grad, const at::Tensor& like) {
  return grad.use_count() == 1 && grad.storage().use_count() == 1 &&
      !grad.is_view() && grad.scalar_type() == like.scalar_type() &&
      grad.device() == like.device() && grad.sizes() == like.sizes() &&
      grad.is_contiguous(at::MemoryFormat::ChannelsLast);
}

class ConvShortcutFunction
    : public torch::autograd::Function<ConvShortcutFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, weight});
    // NOTE: returning the input makes autograd return a view of it whose
    // gradient comes here.
    return {at::conv2d(input, weight), input};
  }

  // NOTE: `grads` by reference; see Note [Accumulating the shortcut's
  // gradient].
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list& grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::conv1x1_and_shortcut: no double backward (backward with "
        "create_graph=true) on the fused path; pass a contiguous (NCHW) "
        "input for the unfused ops");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    at::Tensor& grad_output = grads[0];
    at::Tensor& grad_shortcut = grads[1];
    if (!grad_output.defined()) {
      return {grad_shortcut, at::Tensor()};
    }
    grad_output = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor grad_weight;
    if (ctx->needs_input_grad(1)) {
      grad_weight = std::get<1>(at::convolution_backward(
          grad_output,
          input,
          weight,
          /*bias_sizes=*/std::nullopt,
          /*stride=*/{1, 1},
          /*padding=*/{0, 0},
          /*dilation=*/{1, 1},
          /*transposed=*/false,
          /*output_padding=*/{0, 0},
          /*groups=*/1,
          /*output_mask=*/{false, true, false}));
    }
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      const auto dy = as_rows(grad_output);
      const auto w = weight.view({weight.size(0), weight.size(1)});
      if (!grad_shortcut.defined()) {
        count(ShortcutGradient::kNoShortcutGradient);
        grad_input = at::empty_like(input, at::MemoryFormat::ChannelsLast);
        auto rows = as_rows(grad_input);
        at::mm_out(rows, dy, w);
      } else if (ours_to_overwrite(grad_shortcut, input)) {
        count(ShortcutGradient::kInPlace);
        grad_input = std::move(grad_shortcut);
        as_rows(grad_input).addmm_(dy, w);
      } else {
        count(ShortcutGradient::kCopy);
        grad_input = at::empty_like(input, at::MemoryFormat::ChannelsLast);
        as_rows(grad_input)
            .copy_(as_rows(
                grad_shortcut.contiguous(at::MemoryFormat::ChannelsLast)));
        as_rows(grad_input).addmm_(dy, w);
      }
    }
    return {grad_input, grad_weight};
  }
};

bool fusable(const at::Tensor& input, const at::Tensor& weight) {
  return input.dim() == 4 && weight.dim() == 4 && input.is_floating_point() &&
      weight.scalar_type() == input.scalar_type() &&
      weight.device() == input.device() && weight.size(1) == input.size(1) &&
      weight.size(2) == 1 && weight.size(3) == 1 && weight.is_contiguous() &&
      input.is_contiguous(at::MemoryFormat::ChannelsLast) &&
      input.numel() > 0 && at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad());
}

} // namespace

namespace detail {

int64_t conv_shortcut_gradient_count(ShortcutGradient how) {
  return g_counts[static_cast<int>(how)].load(std::memory_order_relaxed);
}

} // namespace detail

std::pair<torch::Tensor, torch::Tensor> conv1x1_and_shortcut(
    const torch::Tensor& input,
    const torch::Tensor& weight) {
  TORCH_CHECK(
      input.defined() && weight.defined(),
      "lamp::nn::conv1x1_and_shortcut: input and weight must be defined");
  TORCH_CHECK(
      weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1,
      "lamp::nn::conv1x1_and_shortcut: expected a 1x1 convolution weight "
      "(Cout, Cin, 1, 1), got sizes ",
      weight.sizes());
  // As torch::conv2d under autocast: both operands in the autocast dtype.
  // The shortcut stays `input` itself, so an input that autocast would cast
  // takes the unfused path.
  at::Tensor w = weight;
  const auto device = input.device().type();
  if (at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(input, device)) {
    const auto dtype = at::autocast::get_autocast_dtype(device);
    if (input.scalar_type() == dtype) {
      w = at::autocast::cached_cast(dtype, weight, device);
    }
  }
  if (!fusable(input, w)) {
    return {torch::conv2d(input, weight), input};
  }
  // NOTE: both operands are cast already; autocast would cast nothing more.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  auto outputs = ConvShortcutFunction::apply(input, w);
  return {std::move(outputs[0]), std::move(outputs[1])};
}

} // namespace lamp::nn
