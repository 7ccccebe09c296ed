#include <lamp/nn/conv_bn_add_relu.h>
#include <lamp/nn/diagnostics.h>

#include <lamp/config.h>

#include <ATen/autocast_mode.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "bn_finalize.h"
#include "conv_stats.h"

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "bn_add_relu_kernel.h"
#endif

namespace lamp::nn {
namespace detail {

// BatchNormAct2d's counting, for the fused path (it is private there).
struct BatchNormActAccess {
  static double count_call(BatchNormAct2dImpl& bn, const char* who) {
    return bn.count_call(who);
  }
};

} // namespace detail

namespace {

thread_local std::string t_reason;
std::atomic<int64_t> g_fused{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [The fused bottleneck tail's autograd]
// Two autograd functions. ConvWithStats is the convolution: forward from
// conv2d_stats (its output and the per-channel sums, the sums marked
// non-differentiable), backward ATen's convolution_backward, as
// torch::conv2d's. BnAddRelu takes the convolutions' outputs and the
// statistics finalised from the sums (mean and invstd, passed in without
// gradients) and computes the whole BatchNorm backward itself, the terms
// through the batch mean and variance included: so nothing is lost by the
// sums having no gradient. Both run on the current stream; the backward's
// scratch comes from the caching allocator (capturable).

class ConvWithStats : public torch::autograd::Function<ConvWithStats> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      std::vector<int64_t> stride,
      std::vector<int64_t> padding,
      std::vector<int64_t> dilation) {
    detail::ConvGeometry geometry;
    for (int i = 0; i < 2; ++i) {
      geometry.stride[i] = stride[i];
      geometry.padding[i] = padding[i];
      geometry.dilation[i] = dilation[i];
    }
    detail::ConvStats r = detail::conv2d_stats(input, weight, geometry);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->mark_non_differentiable({r.sum, r.sum_of_squares});
    return {r.output, r.sum, r.sum_of_squares};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    if (!grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), {}, {}, {}};
    }
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    auto [dx, dw, db] = at::convolution_backward(
        grads[0],
        input,
        weight,
        std::nullopt,
        stride,
        padding,
        dilation,
        /*transposed=*/false,
        /*output_padding=*/{0, 0},
        /*groups=*/1,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#if LAMP_WITH_CUDA
detail::ActDtype act_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? detail::ActDtype::kHalf
                                      : detail::ActDtype::kBFloat16;
}

float* f32(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// relu(y * scale + shift + shortcut), shortcut z or z * z_scale + z_shift.
class BnAddRelu : public torch::autograd::Function<BnAddRelu> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& y,
      const at::Tensor& weight,
      const at::Tensor& bias,
      const at::Tensor& z,
      // NOTE: optional, not undefined tensors: autograd's custom functions
      // take no undefined tensor as an input.
      const std::optional<at::Tensor>& z_weight,
      const std::optional<at::Tensor>& z_bias,
      const detail::BatchNormFold& fold,
      const std::optional<detail::BatchNormFold>& z_fold) {
    const int64_t channels = y.size(1);
    const int64_t rows = y.numel() / channels;
    at::Tensor out = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    at::Tensor mask =
        at::empty({rows * channels / 8}, y.options().dtype(at::kByte));
    detail::BnAddReluForwardArgs a;
    a.dtype = act_dtype(y);
    a.rows = rows;
    a.channels = channels;
    a.y = y.data_ptr();
    a.scale = fold.scale.data_ptr<float>();
    a.shift = fold.shift.data_ptr<float>();
    a.z = z.data_ptr();
    if (z_fold) {
      a.z_scale = z_fold->scale.data_ptr<float>();
      a.z_shift = z_fold->shift.data_ptr<float>();
    }
    a.out = out.data_ptr();
    a.mask = mask.data_ptr<uint8_t>();
    C10_CUDA_CHECK(detail::launch_bn_add_relu_forward(
        a, c10::cuda::getCurrentCUDAStream()));
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(
        {y,
         weight,
         fold.mean,
         fold.invstd,
         z_fold ? z : at::Tensor(),
         z_fold ? z_weight.value() : at::Tensor(),
         z_fold ? z_fold->mean : at::Tensor(),
         z_fold ? z_fold->invstd : at::Tensor(),
         mask});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor& y = s[0];
    const bool normalised_z = s[4].defined();
    if (!grads[0].defined()) {
      return {{}, {}, {}, {}, {}, {}, {}, {}};
    }
    const at::Tensor dout =
        grads[0].to(y.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t channels = y.size(1);
    const int64_t rows = y.numel() / channels;
    const auto f32_options = y.options().dtype(at::kFloat);
    at::Tensor dy = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    at::Tensor dz = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    at::Tensor dweight = at::empty({channels}, f32_options);
    at::Tensor dbias = at::empty({channels}, f32_options);
    at::Tensor z_dweight, z_dbias;
    if (normalised_z) {
      z_dweight = at::empty({channels}, f32_options);
      z_dbias = at::empty({channels}, f32_options);
    }
    at::Tensor partials = at::empty(
        {detail::bn_add_relu_partial_floats(rows, channels)}, f32_options);
    at::Tensor coefficients = at::empty({6 * channels}, f32_options);
    detail::BnAddReluBackwardArgs a;
    a.dtype = act_dtype(y);
    a.rows = rows;
    a.channels = channels;
    a.dout = dout.data_ptr();
    a.mask = s[8].data_ptr<uint8_t>();
    a.y = y.data_ptr();
    a.mean = f32(s[2]);
    a.invstd = f32(s[3]);
    a.weight = f32(s[1]);
    if (normalised_z) {
      a.z = s[4].data_ptr();
      a.z_weight = f32(s[5]);
      a.z_mean = f32(s[6]);
      a.z_invstd = f32(s[7]);
      a.z_dweight = f32(z_dweight);
      a.z_dbias = f32(z_dbias);
    }
    a.partials = f32(partials);
    a.coefficients = f32(coefficients);
    a.dy = dy.data_ptr();
    a.dz = dz.data_ptr();
    a.dweight = f32(dweight);
    a.dbias = f32(dbias);
    C10_CUDA_CHECK(detail::launch_bn_add_relu_backward(
        a, c10::cuda::getCurrentCUDAStream()));
    return {dy, dweight, dbias, dz, z_dweight, z_dbias, {}, {}};
  }
};
#endif

// The convolution's geometry when the fused path can take it.
std::optional<std::array<std::vector<int64_t>, 3>> geometry_of(
    const torch::nn::Conv2dImpl& conv,
    std::string& why) {
  const auto& o = conv.options;
  if (o.groups() != 1 || o.bias() ||
      !std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()) ||
      o.transposed()) {
    why = "the convolution has groups, a bias, a padding mode or is transposed";
    return std::nullopt;
  }
  const auto* pad = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (pad == nullptr) {
    why = "the convolution's padding is 'same' or 'valid'";
    return std::nullopt;
  }
  return std::array<std::vector<int64_t>, 3>{
      std::vector<int64_t>(o.stride()->begin(), o.stride()->end()),
      std::vector<int64_t>((*pad)->begin(), (*pad)->end()),
      std::vector<int64_t>(o.dilation()->begin(), o.dilation()->end())};
}

bool norm_options_ok(
    bool training,
    bool affine,
    bool track,
    const std::optional<double>& momentum,
    const at::Tensor& weight) {
  return training && affine && track && momentum.has_value() &&
      weight.defined() && weight.scalar_type() == at::kFloat;
}

// The operand's dtype under autocast: the weight cast as torch::conv2d's
// autocast would (cached for the step), when the input already has that
// dtype.
at::Tensor conv_weight(const at::Tensor& input, const at::Tensor& weight) {
  const auto device = input.device().type();
  if (at::autocast::is_autocast_enabled(device) &&
      at::autocast::is_autocast_eligible(input, device)) {
    const auto dtype = at::autocast::get_autocast_dtype(device);
    if (input.scalar_type() == dtype) {
      return at::autocast::cached_cast(dtype, weight, device);
    }
  }
  return weight;
}

bool aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// "" when the fused path can run these operands; else why not.
std::string why_unfused(
    const at::Tensor& input,
    const at::Tensor& weight,
    int64_t out_channels) {
  if (!input.is_cuda()) {
    return "the input is not on a CUDA device";
  }
  if (!LAMP_WITH_CUDA) {
    return "lamp was built without CUDA";
  }
  if (input.scalar_type() != at::kHalf &&
      input.scalar_type() != at::kBFloat16) {
    return "the input is neither float16 nor bfloat16";
  }
  if (weight.scalar_type() != input.scalar_type()) {
    return "the convolution's weight and input differ in dtype";
  }
  if (input.dim() != 4 ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast) || !aligned(input)) {
    return "the input is not a channels-last contiguous 4-d tensor";
  }
  if (out_channels % 8 != 0) {
    return "the output channels are not a multiple of 8";
  }
  return "";
}

struct Branch {
  at::Tensor y; // the convolution's output
  detail::BatchNormFold fold;
};

// The convolution with its sums, then BatchNorm's statistics and running
// statistics from them.
Branch conv_and_statistics(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::array<std::vector<int64_t>, 3>& geometry,
    const at::Tensor& bn_weight,
    const at::Tensor& bn_bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double momentum,
    double eps) {
  // NOTE: the operands are in their autocast dtype already; autocast would
  // cast nothing more.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::autocast_dispatch_keyset);
  auto outs = ConvWithStats::apply(
      input, weight, geometry[0], geometry[1], geometry[2]);
  Branch b;
  b.y = outs[0];
  const int64_t count = b.y.numel() / b.y.size(1);
  torch::NoGradGuard no_grad;
  b.fold = detail::batch_norm_finalize(
      outs[1],
      outs[2],
      count,
      bn_weight.detach(),
      bn_bias.detach(),
      running_mean,
      running_var,
      momentum,
      eps,
      at::kFloat);
  return b;
}

torch::Tensor fused_or_unfused(
    const torch::Tensor& input,
    const torch::nn::Conv2d& conv,
    const BatchNormAct2d& bn,
    const torch::Tensor& residual,
    const torch::Tensor* shortcut_input,
    const torch::nn::Conv2d* shortcut_conv,
    const torch::nn::BatchNorm2d* shortcut_bn) {
  TORCH_CHECK(
      !conv.is_empty() && !bn.is_empty() &&
          (shortcut_input != nullptr || residual.defined()),
      "lamp::nn::conv_bn_add_relu: the modules and the residual must be "
      "defined");
  const auto unfused = [&](std::string why) {
    t_reason = std::move(why);
    const torch::Tensor shortcut = shortcut_input != nullptr
        ? shortcut_bn->ptr()->forward(
              shortcut_conv->ptr()->forward(*shortcut_input))
        : residual;
    return bn.ptr()->forward(conv.ptr()->forward(input), shortcut);
  };
  const auto& o = bn->options;
  if (!norm_options_ok(
          bn->is_training(),
          o.affine(),
          o.track_running_stats(),
          o.momentum(),
          bn->weight) ||
      !o.relu()) {
    return unfused(
        "bn is not in training, or lacks affine, running statistics, a "
        "momentum, float32 parameters or its ReLU");
  }
  std::string why;
  const auto geometry = geometry_of(*conv, why);
  if (!geometry) {
    return unfused(why);
  }
  TORCH_CHECK(
      conv->options.out_channels() == o.num_features(),
      "lamp::nn::conv_bn_add_relu: conv has ",
      conv->options.out_channels(),
      " output channels, bn ",
      o.num_features(),
      " features");
  const at::Tensor w = conv_weight(input, conv->weight);
  why = why_unfused(input, w, conv->options.out_channels());
  if (!why.empty()) {
    return unfused(why);
  }
  std::optional<std::array<std::vector<int64_t>, 3>> shortcut_geometry;
  at::Tensor shortcut_w;
  if (shortcut_input != nullptr) {
    const auto& so = (*shortcut_bn)->options;
    if (!norm_options_ok(
            (*shortcut_bn)->is_training(),
            so.affine(),
            so.track_running_stats(),
            so.momentum(),
            (*shortcut_bn)->weight)) {
      return unfused(
          "shortcut_bn is not in training, or lacks affine, running "
          "statistics, a momentum or float32 parameters");
    }
    TORCH_CHECK(
        (*shortcut_conv)->options.out_channels() == o.num_features() &&
            so.num_features() == o.num_features(),
        "lamp::nn::conv_bn_add_relu: shortcut_conv's output channels (",
        (*shortcut_conv)->options.out_channels(),
        ") and shortcut_bn's features (",
        so.num_features(),
        ") must be bn's (",
        o.num_features(),
        ")");
    if (shortcut_input->scalar_type() != input.scalar_type()) {
      return unfused("the shortcut's input and the input differ in dtype");
    }
    shortcut_geometry = geometry_of(**shortcut_conv, why);
    if (!shortcut_geometry) {
      return unfused("shortcut: " + why);
    }
    shortcut_w = conv_weight(*shortcut_input, (*shortcut_conv)->weight);
    why = why_unfused(
        *shortcut_input, shortcut_w, (*shortcut_conv)->options.out_channels());
    if (!why.empty()) {
      return unfused("shortcut: " + why);
    }
  } else if (
      residual.scalar_type() != input.scalar_type() ||
      !residual.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      !aligned(residual) || residual.device() != input.device()) {
    return unfused(
        "the residual is not a channels-last contiguous tensor of the "
        "input's dtype and device");
  }
#if LAMP_WITH_CUDA
  const c10::cuda::CUDAGuard guard(input.device());
  const std::string who = c10::str(
      "lamp::nn::conv_bn_add_relu(", conv->options.out_channels(), ")");
  BatchNormAct2dImpl& main_bn = *bn.ptr();
  const double momentum =
      detail::BatchNormActAccess::count_call(main_bn, who.c_str());
  Branch main = conv_and_statistics(
      input,
      w,
      *geometry,
      main_bn.weight,
      main_bn.bias,
      main_bn.running_mean,
      main_bn.running_var,
      momentum,
      o.eps());
  std::optional<Branch> side;
  at::Tensor z = residual;
  std::optional<at::Tensor> z_weight, z_bias;
  if (shortcut_input != nullptr) {
    torch::nn::BatchNorm2dImpl& sbn = *shortcut_bn->ptr();
    {
      torch::NoGradGuard no_grad;
      sbn.num_batches_tracked.add_(1);
    }
    side = conv_and_statistics(
        *shortcut_input,
        shortcut_w,
        *shortcut_geometry,
        sbn.weight,
        sbn.bias,
        sbn.running_mean,
        sbn.running_var,
        *sbn.options.momentum(),
        sbn.options.eps());
    z = side->y;
    z_weight = sbn.weight;
    z_bias = sbn.bias;
  }
  TORCH_CHECK(
      main.y.sizes() == z.sizes(),
      who,
      ": the shortcut's sizes ",
      z.sizes(),
      " differ from the convolution's output's ",
      main.y.sizes());
  t_reason.clear();
  g_fused.fetch_add(1, std::memory_order_relaxed);
  return BnAddRelu::apply(
      main.y,
      main_bn.weight,
      main_bn.bias,
      z,
      z_weight,
      z_bias,
      main.fold,
      side ? std::optional<detail::BatchNormFold>(side->fold)
           : std::nullopt)[0];
#else
  return unfused("lamp was built without CUDA");
#endif
}

} // namespace

torch::Tensor conv_bn_add_relu(
    const torch::Tensor& input,
    const torch::nn::Conv2d& conv,
    const BatchNormAct2d& bn,
    const torch::Tensor& residual) {
  TORCH_CHECK(
      residual.defined(),
      "lamp::nn::conv_bn_add_relu: the residual must be defined (without "
      "one, call bn(conv(input)))");
  return fused_or_unfused(input, conv, bn, residual, nullptr, nullptr, nullptr);
}

torch::Tensor conv_bn_add_relu(
    const torch::Tensor& input,
    const torch::nn::Conv2d& conv,
    const BatchNormAct2d& bn,
    const torch::Tensor& shortcut_input,
    const torch::nn::Conv2d& shortcut_conv,
    const torch::nn::BatchNorm2d& shortcut_bn) {
  TORCH_CHECK(
      shortcut_input.defined() && !shortcut_conv.is_empty() &&
          !shortcut_bn.is_empty(),
      "lamp::nn::conv_bn_add_relu: shortcut_input, shortcut_conv and "
      "shortcut_bn must be defined");
  return fused_or_unfused(
      input, conv, bn, {}, &shortcut_input, &shortcut_conv, &shortcut_bn);
}

namespace detail {

std::string conv_bn_add_relu_fallback_reason() {
  return t_reason;
}

int64_t conv_bn_add_relu_fused_count() {
  return g_fused.load(std::memory_order_relaxed);
}

} // namespace detail

} // namespace lamp::nn
