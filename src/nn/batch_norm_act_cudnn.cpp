#include "batch_norm_act_cudnn.h"

#include <lamp/config.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#if LAMP_WITH_CUDNN
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cudnn.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cudnn_utils.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#endif

namespace lamp::nn::detail {

#if LAMP_WITH_CUDNN
namespace {

// Note [Fused BatchNorm on cuDNN]
// cuDNN's "Ex" batch-norm API runs y = act(bn(x) + z) in one kernel for
// NHWC fp16 tensors in CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode, and its
// backward gives dx, dz, dgamma and dbeta in one kernel from x, y, the saved
// batch mean and inverse standard deviation, and the reserve space, where
// the forward left the ReLU mask. PyTorch's own channels-last fp16 batch
// norm runs the same functions with the plain BN op (ATen's
// native/cudnn/BatchNorm.cpp); lamp adds the ops:
//   relu, residual:    CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION (cuDNN adds z)
//   relu, no residual: CUDNN_BATCHNORM_OPS_BN_ACTIVATION
//   no relu:           CUDNN_BATCHNORM_OPS_BN, then y += z when given
// The ReLU descriptor is ATen's (CUDNN_NOT_PROPAGATE_NAN).
//
// Streams: every call takes ATen's cuDNN handle for this thread and device
// and binds it to the current stream; workspace and reserve space come from
// the caching allocator on that stream, so the work is ordered like any
// ATen op, needs no host sync and can be captured in a CUDA graph. The
// autograd engine runs backward on the forward's stream.
//
// Memory: backward needs x, y (for the ReLU), gamma, beta, the two C-sized
// statistics and the reserve space (a bit mask, N*H*W*C / 8 bytes and
// change). The unfused composite keeps x (batch norm), the ReLU's output
// and its own reserve space; it also allocates the batch norm's output (and
// the sum), which the fused kernel never materialises. y is the next
// layer's input, held anyway. The residual z is not kept.
//
// cuDNN checks its arguments before it launches anything: a
// CUDNN_STATUS_NOT_SUPPORTED* or CUDNN_STATUS_BAD_PARAM* status from the
// size queries or from the forward call means that nothing ran, and the
// caller falls back to the composite (with a warning, once). Any other
// failure, and any failure in backward, is an error.

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

// The descriptors of one call: x (and y, z, dy, dx, dz: all NHWC, same
// shape and dtype), the fp32 1xCx1x1 statistics, the ReLU.
struct Descriptors {
  Descriptors(const at::Tensor& input, bool relu) : relu(relu) {
    set_nhwc(x, input);
    LAMP_CUDNN_CHECK(
        cudnnDeriveBNTensorDescriptor(stats.get(), x.get(), kMode));
    if (relu) {
      LAMP_CUDNN_CHECK(cudnnSetActivationDescriptor(
          act.get(),
          CUDNN_ACTIVATION_RELU,
          CUDNN_NOT_PROPAGATE_NAN,
          std::numeric_limits<double>::max()));
    }
  }
  cudnnActivationDescriptor_t activation() const {
    return relu ? act.get() : nullptr;
  }

  bool relu;
  TensorDescriptor x;
  TensorDescriptor stats;
  ActivationDescriptor act;
};

cudnnBatchNormOps_t ops_for(bool relu, bool residual) {
  if (!relu) {
    return CUDNN_BATCHNORM_OPS_BN;
  }
  return residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                  : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
}

const char* ops_name(cudnnBatchNormOps_t ops) {
  switch (ops) {
    case CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION:
      return "BN_ADD_ACTIVATION";
    case CUDNN_BATCHNORM_OPS_BN_ACTIVATION:
      return "BN_ACTIVATION";
    default:
      return "BN";
  }
}

const void* maybe_ptr(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr() : nullptr;
}

// What the forward takes besides the differentiable tensors.
struct Config {
  at::Tensor running_mean;
  at::Tensor running_var;
  double momentum = 0.1;
  double eps = 1e-5;
  bool relu = true;
};

class BatchNormActFunction
    : public torch::autograd::Function<BatchNormActFunction> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      const std::optional<at::Tensor>& residual,
      const std::optional<at::Tensor>& weight,
      const std::optional<at::Tensor>& bias,
      const Config& config) {
    const c10::cuda::CUDAGuard guard(input.device());
    const int64_t channels = input.size(1);
    const auto stats_options = input.options().dtype(at::kFloat);
    // NOTE: without affine, cuDNN still needs gamma and beta.
    const at::Tensor scale =
        weight ? *weight : at::ones({channels}, stats_options);
    const at::Tensor shift =
        bias ? *bias : at::zeros({channels}, stats_options);
    const auto ops = ops_for(config.relu, residual.has_value());
    const bool fused_add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;

    const Descriptors d(input, config.relu);
    const cudnnHandle_t h = handle();
    size_t workspace_size = 0;
    LAMP_CUDNN_CHECK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        h,
        kMode,
        ops,
        d.x.get(),
        d.x.get(), // z
        d.x.get(), // y
        d.stats.get(),
        d.activation(),
        &workspace_size));
    size_t reserve_size = 0;
    LAMP_CUDNN_CHECK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
        h, kMode, ops, d.activation(), d.x.get(), &reserve_size));
    const at::Tensor workspace = buffer(workspace_size, input);
    const at::Tensor reserve = buffer(reserve_size, input);
    // NOTE: empty_like keeps the input's (channels-last) strides.
    at::Tensor output = at::empty_like(input);
    at::Tensor save_mean = at::empty({channels}, stats_options);
    at::Tensor save_invstd = at::empty({channels}, stats_options);
    const float one = 1.f;
    const float zero = 0.f;
    LAMP_CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
        h,
        kMode,
        ops,
        &one,
        &zero,
        d.x.get(),
        input.const_data_ptr(),
        fused_add ? d.x.get() : nullptr,
        fused_add ? residual->const_data_ptr() : nullptr,
        d.x.get(),
        output.data_ptr(),
        d.stats.get(),
        scale.const_data_ptr(),
        shift.const_data_ptr(),
        config.momentum,
        const_cast<void*>(maybe_ptr(config.running_mean)),
        const_cast<void*>(maybe_ptr(config.running_var)),
        config.eps,
        save_mean.data_ptr(),
        save_invstd.data_ptr(),
        d.activation(),
        workspace.data_ptr(),
        static_cast<size_t>(workspace.numel()),
        reserve.data_ptr(),
        static_cast<size_t>(reserve.numel())));
    if (residual && !fused_add) {
      output.add_(*residual);
    }

    // NOTE: y only for the ReLU's backward; the BN op needs x alone.
    ctx->save_for_backward(
        {input,
         config.relu ? output : at::Tensor(),
         scale,
         shift,
         save_mean,
         save_invstd,
         reserve});
    ctx->saved_data["relu"] = config.relu;
    ctx->saved_data["residual"] = residual.has_value();
    ctx->saved_data["weight"] = weight.has_value();
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["eps"] = config.eps;
    return output;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    TORCH_CHECK(
        !at::GradMode::is_enabled(),
        "lamp::nn::BatchNormAct2d: the fused cuDNN kernel has no double "
        "backward (backward with create_graph=true); use a CPU, NCHW or "
        "fp32 input for the unfused ops");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& output = saved[1];
    const at::Tensor& scale = saved[2];
    const at::Tensor& shift = saved[3];
    const at::Tensor& save_mean = saved[4];
    const at::Tensor& save_invstd = saved[5];
    const at::Tensor& reserve = saved[6];
    const bool relu = ctx->saved_data["relu"].toBool();
    const bool residual = ctx->saved_data["residual"].toBool();
    const double eps = ctx->saved_data["eps"].toDouble();
    const auto ops = ops_for(relu, residual);
    const bool fused_add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;

    const c10::cuda::CUDAGuard guard(input.device());
    // NOTE: the gradient may arrive in any layout; cuDNN reads NHWC.
    const at::Tensor grad_output =
        grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor grad_input = at::empty_like(input);
    at::Tensor grad_residual = fused_add ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_weight = at::empty_like(scale);
    at::Tensor grad_bias = at::empty_like(shift);

    const Descriptors d(input, relu);
    const cudnnHandle_t h = handle();
    size_t workspace_size = 0;
    LAMP_CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        h,
        kMode,
        ops,
        d.x.get(), // x
        d.x.get(), // y
        d.x.get(), // dy
        fused_add ? d.x.get() : nullptr, // dz
        d.x.get(), // dx
        d.stats.get(),
        d.activation(),
        &workspace_size));
    const at::Tensor workspace = buffer(workspace_size, input);
    const float one = 1.f;
    const float zero = 0.f;
    LAMP_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
        h,
        kMode,
        ops,
        &one,
        &zero,
        &one,
        &zero,
        d.x.get(),
        input.const_data_ptr(),
        relu ? d.x.get() : nullptr,
        relu ? output.const_data_ptr() : nullptr,
        d.x.get(),
        grad_output.const_data_ptr(),
        fused_add ? d.x.get() : nullptr,
        fused_add ? grad_residual.data_ptr() : nullptr,
        d.x.get(),
        grad_input.data_ptr(),
        d.stats.get(),
        scale.const_data_ptr(),
        relu ? shift.const_data_ptr() : nullptr,
        grad_weight.data_ptr(),
        grad_bias.data_ptr(),
        eps,
        save_mean.const_data_ptr(),
        save_invstd.const_data_ptr(),
        d.activation(),
        workspace.data_ptr(),
        static_cast<size_t>(workspace.numel()),
        const_cast<void*>(reserve.const_data_ptr()),
        static_cast<size_t>(reserve.numel())));
    if (residual && !fused_add) {
      grad_residual = grads[0]; // y = bn(x) + z
    }
    // One gradient per forward argument; undefined where that argument was
    // absent (no residual, no affine) and for the config.
    return {
        grad_input,
        grad_residual,
        ctx->saved_data["weight"].toBool() ? grad_weight : at::Tensor(),
        ctx->saved_data["bias"].toBool() ? grad_bias : at::Tensor(),
        at::Tensor()};
  }
};

// Why these inputs are not for the fused kernel ("" when they are).
std::string unsupported_reason(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double eps) {
  if (!input.is_cuda()) {
    return c10::str("input is on ", input.device(), ", not CUDA");
  }
  if (!at::globalContext().userEnabledCuDNN()) {
    return "cuDNN is disabled (at::globalContext().userEnabledCuDNN())";
  }
  const auto dtype = input.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return c10::str(
        "input dtype is ", dtype, "; the fused kernels take Half and BFloat16");
  }
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return "input is not channels-last contiguous";
  }
  if (input.numel() == 0) {
    return "input is empty";
  }
  if (input.size(1) % 4 != 0) {
    return c10::str(
        "C = ", input.size(1), " channels is not a multiple of 4 (cuDNN)");
  }
  // NOTE: ATen's limits for cuDNN batch norm in training
  // (_select_batch_norm_backend).
  if (input.size(0) > 880801 ||
      input.numel() >= std::numeric_limits<int32_t>::max()) {
    return c10::str("input sizes ", input.sizes(), " exceed cuDNN's limits");
  }
  if (eps < CUDNN_BN_MIN_EPSILON) {
    return c10::str("eps ", eps, " < CUDNN_BN_MIN_EPSILON");
  }
  if (residual.defined()) {
    if (residual.scalar_type() != dtype) {
      return c10::str(
          "residual dtype ", residual.scalar_type(), " differs from input's");
    }
    if (residual.device() != input.device()) {
      return c10::str("residual is on ", residual.device());
    }
    if (!residual.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      return "residual is not channels-last contiguous";
    }
  }
  const std::pair<const char*, const at::Tensor*> stats[] = {
      {"weight", &weight},
      {"bias", &bias},
      {"running_mean", &running_mean},
      {"running_var", &running_var}};
  for (const auto& [name, t] : stats) {
    if (!t->defined()) {
      continue;
    }
    if (t->scalar_type() != at::kFloat || t->device() != input.device() ||
        !t->is_contiguous()) {
      return c10::str(
          name,
          " must be a contiguous Float tensor on ",
          input.device(),
          "; it is ",
          t->scalar_type(),
          " on ",
          t->device());
    }
  }
  if (running_mean.defined() != running_var.defined()) {
    return "running_mean and running_var must both be given, or neither";
  }
  return "";
}

} // namespace
#endif // LAMP_WITH_CUDNN

std::optional<at::Tensor> cudnn_batch_norm_act(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double momentum,
    double eps,
    bool relu,
    std::string& why) {
#if LAMP_WITH_CUDNN
  why = unsupported_reason(
      input, residual, weight, bias, running_mean, running_var, eps);
  if (!why.empty()) {
    return std::nullopt;
  }
  auto optional = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  try {
    return BatchNormActFunction::apply(
        input,
        optional(residual),
        optional(weight),
        optional(bias),
        Config{running_mean, running_var, momentum, eps, relu});
  } catch (const CudnnRejected& e) {
    why = e.msg();
    TORCH_WARN_ONCE(
        "lamp::nn::batch_norm_act: cuDNN turned down its fused ",
        ops_name(ops_for(relu, residual.defined())),
        " kernel for a ",
        input.scalar_type(),
        " input of sizes ",
        input.sizes(),
        "; running the unfused batch norm instead (warned once). ",
        e.msg());
    return std::nullopt;
  }
#else
  (void)residual;
  (void)weight;
  (void)bias;
  (void)running_mean;
  (void)running_var;
  (void)momentum;
  (void)eps;
  (void)relu;
  // NOTE: a CPU input's reason first, as in a build with cuDNN.
  why = input.is_cuda()
      ? std::string("lamp was built without cuDNN (LAMP_WITH_CUDNN=OFF)")
      : c10::str("input is on ", input.device(), ", not CUDA");
  return std::nullopt;
#endif
}

} // namespace lamp::nn::detail
