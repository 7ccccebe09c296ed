#include <lamp/nn/space_to_depth_conv.h>

#include <lamp/config.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <cstdint>

#if LAMP_WITH_CUDA
#include "space_to_depth_cuda.h"
#endif

namespace lamp::nn {
namespace {

// Note [A stride-2 convolution as a stride-1 one]
// With the input zero-padded by p (and one more row or column at the end
// when its padded size is odd, never read by a window) and the kernel
// zero-padded to even sizes 2*kh2 x 2*kw2, write each kernel row u as
// 2*a + r and each padded input row as 2*I + r (r in {0, 1}), columns
// likewise (v = 2*b + s, 2*J + s). Then
//   out[n, o, i, j] = sum over c, u, v of w[o, c, u, v] * xp[n, c, 2i+u, 2j+v]
//                   = sum over (c, r, s), a, b of
//                       W2[o, (c, r, s), a, b] * X2[n, (c, r, s), i+a, j+b]
// with X2[n, (c, r, s), I, J] = xp[n, c, 2I + r, 2J + s] (the 2x2
// space-to-depth of xp, channel c*4 + r*2 + s) and W2[o, (c, r, s), a, b] =
// w[o, c, 2a + r, 2b + s]: a stride-1 convolution without padding, same
// products. Zero channels round 4*Cin up to a multiple of 8 (cuDNN's NHWC
// kernels want that). Its output has torch::conv2d's sizes, or one row
// (column) more when the padded input is odd and the kernel even: that one
// is cut off. Backward undoes the rearrangements: the weight gradient of W2
// rearranged back (the padded taps dropped), the input gradient of X2
// rearranged back (the padding cut off).

struct Geometry {
  int64_t pad, h2, w2, kh2, kw2, channels, out_h, out_w;
};

Geometry geometry(
    const at::Tensor& input,
    const at::Tensor& weight,
    int64_t pad) {
  Geometry g;
  g.pad = pad;
  g.h2 = (input.size(2) + 2 * pad + 1) / 2;
  g.w2 = (input.size(3) + 2 * pad + 1) / 2;
  g.kh2 = (weight.size(2) + 1) / 2;
  g.kw2 = (weight.size(3) + 1) / 2;
  g.channels = (4 * input.size(1) + 7) / 8 * 8;
  g.out_h = (input.size(2) + 2 * pad - weight.size(2)) / 2 + 1;
  g.out_w = (input.size(3) + 2 * pad - weight.size(3)) / 2 + 1;
  return g;
}

// X2 (N, channels, h2, w2) in `dtype`, channels-last. See the Note. On
// CUDA one kernel (the cast included); elsewhere ATen's ops.
at::Tensor input_to_depth(
    const at::Tensor& input,
    const Geometry& g,
    at::ScalarType dtype) {
#if LAMP_WITH_CUDA
  if (auto x2 = detail::cuda_input_to_depth(
          input, g.pad, g.h2, g.w2, g.channels, dtype)) {
    return *x2;
  }
#endif
  const auto x = input.to(dtype);
  const int64_t n = x.size(0);
  const int64_t c = x.size(1);
  const auto padded = at::constant_pad_nd(
      x,
      {g.pad,
       2 * g.w2 - x.size(3) - g.pad,
       g.pad,
       2 * g.h2 - x.size(2) - g.pad});
  auto out = at::empty({n, g.h2, g.w2, g.channels}, x.options());
  out.narrow(3, 0, 4 * c)
      .unflatten(3, {c, 2, 2})
      .copy_(padded.unflatten(3, {g.w2, 2})
                 .unflatten(2, {g.h2, 2})
                 .permute({0, 2, 4, 1, 3, 5}));
  if (g.channels > 4 * c) {
    out.narrow(3, 4 * c, g.channels - 4 * c).zero_();
  }
  return out.permute({0, 3, 1, 2}); // (N, C, H, W) sizes, NHWC memory
}

// The rearrangement undone, for a gradient: (N, channels, h2, w2) back to
// `like`'s sizes, its first rows and columns from `offset` (the padding)
// on, in `like`'s layout. The input's gradient from X2's, and the weight's
// from W2's (rows h2 = kh2, offset 0).
at::Tensor from_depth(
    const at::Tensor& grad,
    const at::Tensor& like,
    int64_t h2,
    int64_t w2,
    int64_t offset) {
  const int64_t c = like.size(1);
  return grad.narrow(1, 0, 4 * c)
      .unflatten(1, {c, 2, 2}) // (n, c, r, s, I, J)
      .permute({0, 1, 4, 2, 5, 3}) // (n, c, I, r, J, s)
      .reshape({like.size(0), c, 2 * h2, 2 * w2})
      .narrow(2, offset, like.size(2))
      .narrow(3, offset, like.size(3))
      .contiguous(like.suggest_memory_format());
}

// W2 (Cout, channels, kh2, kw2), channels-last. See the Note.
at::Tensor weight_to_depth(const at::Tensor& w, const Geometry& g) {
  const int64_t o = w.size(0);
  const int64_t c = w.size(1);
  auto w2 = at::constant_pad_nd(
                w, {0, 2 * g.kw2 - w.size(3), 0, 2 * g.kh2 - w.size(2)})
                .reshape({o, c, g.kh2, 2, g.kw2, 2}) // (o, c, a, r, b, s)
                .permute({0, 1, 3, 5, 2, 4}) // (o, c, r, s, a, b)
                .reshape({o, 4 * c, g.kh2, g.kw2});
  if (g.channels > 4 * c) {
    w2 = at::constant_pad_nd(w2, {0, 0, 0, 0, 0, g.channels - 4 * c});
  }
  return w2.contiguous(at::MemoryFormat::ChannelsLast);
}

class SpaceToDepthConvFunction
    : public torch::autograd::Function<SpaceToDepthConvFunction> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      int64_t padding) {
    ctx->set_materialize_grads(false);
    // NOTE: the input, not X2: X2 is larger (16 channels for 3, a padded
    // border) and backward makes it again in one pass; the input is kept by
    // its caller anyway. It may be of another dtype than the weight (the
    // autocast case: the rearrangement casts it, so no cast copy exists).
    ctx->save_for_backward({input, weight});
    ctx->saved_data["padding"] = padding;
    const Geometry g = geometry(input, weight, padding);
    auto out = at::conv2d(
        input_to_depth(input, g, weight.scalar_type()),
        weight_to_depth(weight, g));
    if (out.size(2) != g.out_h || out.size(3) != g.out_w) {
      out = out.narrow(2, 0, g.out_h)
                .narrow(3, 0, g.out_w)
                .contiguous(at::MemoryFormat::ChannelsLast);
    }
    return out;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::space_to_depth_conv2d: no double backward (backward with "
        "create_graph=true); use torch::conv2d for that");
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const Geometry g =
        geometry(input, weight, ctx->saved_data["padding"].toInt());
    const bool want_input = ctx->needs_input_grad(0);
    const bool want_weight = ctx->needs_input_grad(1);
    // X2's values only for the weight gradient; the input gradient needs
    // its sizes alone.
    const auto x2 = want_weight
        ? input_to_depth(input, g, weight.scalar_type())
        : at::empty(
              {input.size(0), g.channels, g.h2, g.w2},
              weight.options().memory_format(at::MemoryFormat::ChannelsLast));
    const auto w2 = weight_to_depth(weight, g);
    // The cut-off row or column (see the Note) had no gradient. NOTE:
    // padded only then: constant_pad_nd copies even when it pads nothing.
    const int64_t cut_h = x2.size(2) - w2.size(2) + 1 - g.out_h;
    const int64_t cut_w = x2.size(3) - w2.size(3) + 1 - g.out_w;
    const auto dy = (cut_h > 0 || cut_w > 0
                         ? at::constant_pad_nd(grad, {0, cut_w, 0, cut_h})
                         : grad)
                        .contiguous(at::MemoryFormat::ChannelsLast);
    auto [dx2, dw2, unused] = at::convolution_backward(
        dy,
        x2,
        w2,
        /*bias_sizes=*/std::nullopt,
        /*stride=*/{1, 1},
        /*padding=*/{0, 0},
        /*dilation=*/{1, 1},
        /*transposed=*/false,
        /*output_padding=*/{0, 0},
        /*groups=*/1,
        /*output_mask=*/{want_input, want_weight, false});
    (void)unused;
    return {
        want_input
            ? from_depth(dx2, input, g.h2, g.w2, g.pad).to(input.scalar_type())
            : at::Tensor(),
        want_weight ? from_depth(dw2, weight, g.kh2, g.kw2, 0) : at::Tensor(),
        at::Tensor()};
  }
};

} // namespace

torch::Tensor space_to_depth_conv2d(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    int64_t padding) {
  TORCH_CHECK(
      input.defined() && weight.defined(),
      "lamp::nn::space_to_depth_conv2d: input and weight must be defined");
  TORCH_CHECK_VALUE(
      input.dim() == 4 && weight.dim() == 4 &&
          input.size(1) == weight.size(1) && input.size(1) > 0,
      "lamp::nn::space_to_depth_conv2d: expected input (N, C, H, W) and "
      "weight (Cout, C, kH, kW) with the same C, got sizes ",
      input.sizes(),
      " and ",
      weight.sizes());
  TORCH_CHECK_VALUE(
      padding >= 0 && input.size(2) + 2 * padding >= weight.size(2) &&
          input.size(3) + 2 * padding >= weight.size(3),
      "lamp::nn::space_to_depth_conv2d: the kernel (",
      weight.size(2),
      "x",
      weight.size(3),
      ") is larger than the input padded by ",
      padding,
      " (",
      input.size(2),
      "x",
      input.size(3),
      "); pass a larger input or padding");
  // As torch::conv2d under autocast: both operands in the autocast dtype
  // (fp64 stays, as autocast's casts leave it). NOTE: the weight is cast
  // here (autocast caches that cast); the input in the rearrangement, which
  // reads it once either way.
  at::ScalarType dtype = input.scalar_type();
  at::Tensor w = weight;
  const auto device = input.device().type();
  if (at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(input, device)) {
    const auto autocast_dtype = at::autocast::get_autocast_dtype(device);
    if (dtype != at::kDouble) {
      dtype = autocast_dtype;
    }
    w = at::autocast::cached_cast(autocast_dtype, weight, device);
  }
  TORCH_CHECK_VALUE(
      input.is_floating_point() && w.scalar_type() == dtype &&
          w.device() == input.device(),
      "lamp::nn::space_to_depth_conv2d: input and weight must be floating "
      "point of one dtype on one device, got ",
      input.scalar_type(),
      " on ",
      input.device(),
      " and ",
      w.scalar_type(),
      " on ",
      w.device());
  // NOTE: the weight is cast already, the input is cast by the
  // rearrangement; autocast would cast nothing more.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  return SpaceToDepthConvFunction::apply(input, w, padding);
}

} // namespace lamp::nn
