#include "add_layer_norm_cuda.h"

#include "add_layer_norm_kernel.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace lamp::nn::detail {
namespace {

NormFormat format_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return NormFormat::kFloat;
    case at::kHalf:
      return NormFormat::kHalf;
    case at::kBFloat16:
      return NormFormat::kBFloat16;
    default:
      return NormFormat::kNone;
  }
}

} // namespace

bool add_norm_supported(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& residual_bias,
    const at::Tensor& weight,
    const at::Tensor& bias,
    at::ScalarType y_dtype) {
  if (!x.is_cuda() || x.scalar_type() != at::kFloat || !x.is_contiguous() ||
      x.dim() < 1 || x.size(-1) > kMaxNormColumns || x.size(-1) < 1 ||
      format_of(y_dtype) == NormFormat::kNone) {
    return false;
  }
  auto fp32_vector = [&](const at::Tensor& t) {
    return t.device() == x.device() && t.scalar_type() == at::kFloat &&
        t.dim() == 1 && t.size(0) == x.size(-1) && t.is_contiguous();
  };
  if (!fp32_vector(weight) || (bias.defined() && !fp32_vector(bias))) {
    return false;
  }
  if (residual_bias.defined() &&
      (!residual.defined() || residual_bias.device() != x.device() ||
       residual_bias.dim() != 1 || residual_bias.size(0) != x.size(-1) ||
       !residual_bias.is_contiguous() ||
       format_of(residual_bias.scalar_type()) == NormFormat::kNone)) {
    return false;
  }
  return !residual.defined() ||
      (residual.device() == x.device() && residual.sizes() == x.sizes() &&
       residual.is_contiguous() &&
       format_of(residual.scalar_type()) != NormFormat::kNone);
}

AddNormOutputs cuda_add_norm_forward(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& residual_bias,
    const at::Tensor& weight,
    const at::Tensor& bias,
    double eps,
    at::ScalarType y_dtype) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t columns = x.size(-1);
  const int64_t rows = x.numel() / columns;
  AddNormOutputs out;
  out.y = at::empty(x.sizes(), x.options().dtype(y_dtype));
  out.mean = at::empty({rows}, x.options());
  out.rstd = at::empty({rows}, x.options());
  AddNormForward a;
  a.rows = rows;
  a.columns = static_cast<int>(columns);
  a.eps = static_cast<float>(eps);
  a.x = x.const_data_ptr<float>();
  if (residual.defined()) {
    out.sum = at::empty_like(x);
    // NOTE: the kernels take a residual in fp32 or y's type; another is
    // widened to fp32 first (exact).
    const at::Tensor r = residual.scalar_type() == at::kFloat ||
            residual.scalar_type() == y_dtype
        ? residual
        : residual.to(at::kFloat);
    a.r = r.const_data_ptr();
    a.r_format = format_of(r.scalar_type());
    a.sum = out.sum.mutable_data_ptr<float>();
    if (residual_bias.defined()) {
      a.r_bias = residual_bias.const_data_ptr();
      a.r_bias_format = format_of(residual_bias.scalar_type());
    }
  }
  a.weight = weight.const_data_ptr<float>();
  a.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  a.y = out.y.data_ptr();
  a.y_format = format_of(y_dtype);
  a.mean = out.mean.mutable_data_ptr<float>();
  a.rstd = out.rstd.mutable_data_ptr<float>();
  C10_CUDA_CHECK(launch_add_norm_forward(
      a, c10::cuda::getCurrentCUDAStream(x.device().index())));
  return out;
}

std::vector<at::Tensor> cuda_add_norm_backward(
    const at::Tensor& sum,
    const at::Tensor& weight,
    const at::Tensor& mean,
    const at::Tensor& rstd,
    const at::Tensor& dy_in,
    const at::Tensor& dsum_in,
    std::optional<at::ScalarType> residual_dtype,
    bool want_bias,
    std::optional<at::ScalarType> residual_bias_dtype) {
  const c10::cuda::CUDAGuard guard(sum.device());
  const int64_t columns = sum.size(-1);
  const int64_t rows = sum.numel() / columns;
  // NOTE: an undefined dy (y unused) is a zero gradient.
  const auto dy = dy_in.defined() ? dy_in.contiguous() : at::zeros_like(sum);
  const auto dsum =
      dsum_in.defined() ? dsum_in.to(at::kFloat).contiguous() : at::Tensor();
  auto dx = at::empty_like(sum);
  // NOTE: the residual's gradient equals x's, but is a tensor of its own
  // (autograd may accumulate into either in place).
  // The kernel writes it in dy's type; another is a cast of dx afterwards.
  at::Tensor dr;
  const bool dr_in_kernel =
      residual_dtype && *residual_dtype == dy.scalar_type();
  if (dr_in_kernel) {
    dr = at::empty(sum.sizes(), sum.options().dtype(*residual_dtype));
  }
  auto dweight = at::empty_like(weight);
  auto dbias = want_bias ? at::empty_like(weight) : at::Tensor();
  // The residual bias's gradient, dr's column sums: in the kernel where it
  // writes dr, else summed from dr below.
  const bool dr_bias_in_kernel = residual_bias_dtype && dr_in_kernel;
  at::Tensor dr_bias;
  if (dr_bias_in_kernel) {
    dr_bias = at::empty({columns}, sum.options().dtype(*residual_bias_dtype));
  }
  auto partials = at::empty(
      {add_norm_backward_partials(
          rows, static_cast<int>(columns), dr_bias_in_kernel)},
      sum.options());
  AddNormBackward a;
  a.rows = rows;
  a.columns = static_cast<int>(columns);
  a.sum = sum.const_data_ptr<float>();
  a.weight = weight.const_data_ptr<float>();
  a.mean = mean.const_data_ptr<float>();
  a.rstd = rstd.const_data_ptr<float>();
  a.dy = dy.const_data_ptr();
  a.dy_format = format_of(dy.scalar_type());
  a.dsum = dsum.defined() ? dsum.const_data_ptr<float>() : nullptr;
  a.dx = dx.mutable_data_ptr<float>();
  if (dr.defined()) {
    a.dr = dr.data_ptr();
    a.dr_format = format_of(dr.scalar_type());
  }
  if (dr_bias_in_kernel) {
    a.dr_bias = dr_bias.data_ptr();
    a.dr_bias_format = format_of(dr_bias.scalar_type());
  }
  a.dweight = dweight.mutable_data_ptr<float>();
  a.dbias = want_bias ? dbias.mutable_data_ptr<float>() : nullptr;
  a.partials = partials.mutable_data_ptr<float>();
  C10_CUDA_CHECK(launch_add_norm_backward(
      a, c10::cuda::getCurrentCUDAStream(sum.device().index())));
  if (residual_dtype && !dr_in_kernel) {
    dr = dx.to(*residual_dtype);
  }
  if (residual_bias_dtype && !dr_bias_in_kernel) {
    dr_bias = dr.reshape({-1, columns})
                  .sum(0, /*keepdim=*/false, at::kFloat)
                  .to(*residual_bias_dtype);
  }
  return {dx, dr, dweight, dbias, dr_bias};
}

} // namespace lamp::nn::detail
