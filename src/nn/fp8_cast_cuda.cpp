#include "fp8_cast_cuda.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "fp8_cast_kernel.h"

namespace lamp::nn::detail {
namespace {

Fp8CastInput cast_input_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return Fp8CastInput::kHalf;
    case at::kBFloat16:
      return Fp8CastInput::kBFloat16;
    default:
      return Fp8CastInput::kFloat;
  }
}

// x (contiguous) * scale in `fp8` into the copies asked for; amax(|x|) into
// `amax` when defined (zeroed here).
Fp8Cast cast_kernel(
    at::Tensor x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax,
    bool saturate_inf,
    bool data,
    bool transposed) {
  // NOTE: the kernel loads two elements at once: a view that starts at an
  // odd element is copied first.
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % (2 * x.element_size()) != 0) {
    x = x.clone();
  }
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto options = x.options().dtype(fp8);
  Fp8Cast out;
  if (data) {
    out.data = at::empty({rows, cols}, options);
  }
  if (transposed) {
    out.data_t = at::empty({cols, rows}, options);
  }
  if (amax.defined()) {
    amax.zero_();
  }
  Fp8CastArgs args;
  args.input_type = cast_input_type(x.scalar_type());
  args.x = x.data_ptr();
  args.rows = rows;
  args.cols = cols;
  args.format =
      fp8 == at::kFloat8_e4m3fn ? Fp8CastFormat::kE4M3 : Fp8CastFormat::kE5M2;
  args.scale = scale.data_ptr<float>();
  args.saturate_inf = saturate_inf;
  args.out = data ? static_cast<uint8_t*>(out.data.data_ptr()) : nullptr;
  args.out_t =
      transposed ? static_cast<uint8_t*>(out.data_t.data_ptr()) : nullptr;
  args.amax = amax.defined() ? amax.data_ptr<float>() : nullptr;
  C10_CUDA_CHECK(launch_fp8_cast(args, c10::cuda::getCurrentCUDAStream()));
  out.inverse_scale = scale.reciprocal();
  return out;
}

} // namespace

bool fp8_cast_cuda_applies(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return x.is_cuda() && x.dim() == 2 && x.size(0) % 2 == 0 &&
      x.size(1) % 2 == 0 && x.size(1) <= 65535 * 64 &&
      (t == at::kFloat || t == at::kHalf || t == at::kBFloat16);
}

Fp8Cast fp8_cast_delayed_cuda(
    const at::Tensor& x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax,
    bool data,
    bool transposed) {
  TORCH_CHECK(
      fp8_cast_cuda_applies(x) && scale.scalar_type() == at::kFloat &&
          amax.scalar_type() == at::kFloat && scale.numel() == 1 &&
          amax.numel() == 1 && scale.device() == x.device() &&
          amax.device() == x.device(),
      "fp8_cast_delayed_cuda: not a case it takes");
  const c10::cuda::CUDAGuard guard(x.device());
  // NOTE: a strided operand is made contiguous (one copy) rather than
  // read with its strides: the tiles' loads rely on rows being contiguous.
  return cast_kernel(
      x.contiguous(),
      fp8,
      scale,
      amax,
      /*saturate_inf=*/false,
      data,
      transposed);
}

Fp8Cast fp8_cast_tensorwise_cuda(
    const at::Tensor& x,
    at::ScalarType fp8,
    bool data,
    bool transposed) {
  TORCH_CHECK(
      fp8_cast_cuda_applies(x),
      "fp8_cast_tensorwise_cuda: not a case it takes");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto xc = x.contiguous();
  auto amax = at::zeros({}, x.options().dtype(at::kFloat));
  C10_CUDA_CHECK(launch_fp8_amax(
      cast_input_type(xc.scalar_type()),
      xc.data_ptr(),
      xc.numel(),
      amax.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream()));
  // quantize_tensorwise's scale, with its ops (so its bits).
  const auto scale = fp8_max_of(fp8) / amax.clamp_min(kFp8AmaxEps);
  return cast_kernel(
      xc,
      fp8,
      scale,
      at::Tensor(),
      /*saturate_inf=*/true,
      data,
      transposed);
}

} // namespace lamp::nn::detail
