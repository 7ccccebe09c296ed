#include "bn_finalize.h"

#include <lamp/config.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "bn_finalize_kernel.h"
#endif

namespace lamp::nn::detail {
namespace {

void check_finalize_arguments(
    const at::Tensor& sum,
    const at::Tensor& sum_of_squares,
    int64_t count,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    at::ScalarType fold_type) {
  TORCH_CHECK_VALUE(
      count > 1,
      "batch_norm_finalize: expected more than 1 value per channel when "
      "training, got ",
      count);
  TORCH_CHECK_VALUE(
      running_mean.defined() == running_var.defined(),
      "batch_norm_finalize: give both running_mean and running_var, or "
      "neither");
  TORCH_CHECK_VALUE(
      fold_type == at::kFloat || fold_type == at::kHalf ||
          fold_type == at::kBFloat16,
      "batch_norm_finalize: the fold's dtype must be float32, float16 or "
      "bfloat16, got ",
      fold_type);
  const int64_t channels = sum.numel();
  for (const at::Tensor* t :
       {&sum, &sum_of_squares, &weight, &bias, &running_mean, &running_var}) {
    if (!t->defined()) {
      continue;
    }
    TORCH_CHECK_VALUE(
        t->scalar_type() == at::kFloat && t->dim() == 1 &&
            t->numel() == channels && t->is_contiguous() &&
            t->device() == sum.device(),
        "batch_norm_finalize: sums, weight, bias and running statistics must "
        "be contiguous float32 [",
        channels,
        "] tensors on one device; got ",
        t->scalar_type(),
        " ",
        t->sizes(),
        " on ",
        t->device());
  }
  TORCH_CHECK_VALUE(
      sum_of_squares.defined(), "batch_norm_finalize: no sum of squares");
}

} // namespace

BatchNormFold batch_norm_finalize(
    const at::Tensor& sum,
    const at::Tensor& sum_of_squares,
    int64_t count,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    double momentum,
    double eps,
    at::ScalarType fold_type) {
  check_finalize_arguments(
      sum,
      sum_of_squares,
      count,
      weight,
      bias,
      running_mean,
      running_var,
      fold_type);
#if LAMP_WITH_CUDA
  if (sum.is_cuda()) {
    const c10::cuda::CUDAGuard guard(sum.device());
    const int64_t channels = sum.numel();
    const auto f32 = sum.options();
    BatchNormFold out{
        at::empty({channels}, f32),
        at::empty({channels}, f32),
        at::empty({channels}, f32.dtype(fold_type)),
        at::empty({channels}, f32.dtype(fold_type))};
    const auto pointer = [](const at::Tensor& t) {
      return t.defined() ? t.data_ptr<float>() : nullptr;
    };
    BnFinalizeArgs args;
    args.channels = channels;
    args.sum = sum.data_ptr<float>();
    args.sum_of_squares = sum_of_squares.data_ptr<float>();
    args.count = static_cast<double>(count);
    args.weight = pointer(weight);
    args.bias = pointer(bias);
    args.running_mean = pointer(running_mean);
    args.running_var = pointer(running_var);
    args.momentum = momentum;
    args.eps = eps;
    args.mean = out.mean.data_ptr<float>();
    args.invstd = out.invstd.data_ptr<float>();
    args.fold = fold_type == at::kHalf ? FoldDtype::kHalf
        : fold_type == at::kBFloat16   ? FoldDtype::kBFloat16
                                       : FoldDtype::kFloat;
    args.scale = out.scale.data_ptr();
    args.shift = out.shift.data_ptr();
    C10_CUDA_CHECK(launch_bn_finalize(args, c10::cuda::getCurrentCUDAStream()));
    return out;
  }
#endif
  // The same arithmetic in ATen ops (the CPU's path, and the GPU tests'
  // reference).
  const double n = static_cast<double>(count);
  const at::Tensor mean = sum.to(at::kDouble) / n;
  const at::Tensor var =
      (sum_of_squares.to(at::kDouble) / n - mean * mean).clamp_min(0);
  const at::Tensor invstd = (var + eps).rsqrt();
  if (running_mean.defined()) {
    running_mean.copy_(
        running_mean.to(at::kDouble) * (1 - momentum) + mean * momentum);
    running_var.copy_(
        running_var.to(at::kDouble) * (1 - momentum) +
        var * (momentum * n / (n - 1)));
  }
  const at::Tensor scale =
      weight.defined() ? weight.to(at::kDouble) * invstd : invstd;
  const at::Tensor shifted = -mean * scale;
  const at::Tensor shift =
      bias.defined() ? bias.to(at::kDouble) + shifted : shifted;
  return {
      mean.to(at::kFloat),
      invstd.to(at::kFloat),
      scale.to(at::kFloat).to(fold_type),
      shift.to(at::kFloat).to(fold_type)};
}

} // namespace lamp::nn::detail
