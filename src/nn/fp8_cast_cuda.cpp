#include "fp8_cast_cuda.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8_cast_kernel.h"
#include "fp8_scale_update_kernel.h"

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

// Whether the kernel casts `ride` along (Fp8CastArgs::ride_src): an fp32
// vector on x's device, into fp16 or bf16.
bool rides_along(
    const at::Tensor& x,
    const at::Tensor& ride,
    at::ScalarType ride_dtype) {
  return ride.defined() && ride.device() == x.device() &&
      ride.scalar_type() == at::kFloat && ride.dim() == 1 &&
      ride.is_contiguous() &&
      (ride_dtype == at::kBFloat16 || ride_dtype == at::kHalf);
}

// op(x) (x and aux contiguous) * scale in `fp8` into the copies asked for;
// amax(|op(x)|) folded into `amax` when defined (quantize_delayed); `ride`
// into `ride_dtype` as Fp8Cast::bias16 when defined (by the kernel where
// rides_along, else by ATen).
Fp8Cast cast_kernel(
    at::Tensor x,
    at::ScalarType fp8,
    const at::Tensor& scale,
    const at::Tensor& amax,
    bool saturate_inf,
    bool data,
    bool transposed,
    bool column_sums,
    Fp8CastOp op,
    const at::Tensor& aux,
    const at::Tensor& ride,
    at::ScalarType ride_dtype) {
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
  // NOTE: no fill of `amax` first: delayed scaling's update zeroes the
  // newest slot, and each cast folds its amax into it (one kernel less a
  // cast: 576 fills a gpt2-xl step, 0.6 ms of its 152.9 on an H100).
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
  // NOTE: 1 / scale written by the kernel (one launch less a cast).
  out.inverse_scale = at::empty({}, scale.options());
  args.inverse_scale = out.inverse_scale.data_ptr<float>();
  args.op = op;
  args.aux = aux.defined() ? aux.data_ptr() : nullptr;
  if (op != Fp8CastOp::kNone && !fp8_cast_is_eight_wide(args)) {
    // The 2-wide path has no ops: ATen's first (the same values).
    x = fp8_reference_op(x, op, aux);
    args.x = x.data_ptr();
    args.op = Fp8CastOp::kNone;
    args.aux = nullptr;
  }
  if (ride.defined() && !rides_along(x, ride, ride_dtype)) {
    out.bias16 = ride.to(ride_dtype);
  } else if (ride.defined()) {
    out.bias16 = at::empty({ride.numel()}, ride.options().dtype(ride_dtype));
    args.ride_src = ride.data_ptr<float>();
    args.ride_dst = out.bias16.data_ptr();
    args.ride_n = ride.numel();
    args.ride_half = ride_dtype == at::kHalf;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor partials;
  if (column_sums && fp8_cast_is_eight_wide(args)) {
    const int64_t tiles = (rows + 63) / 64;
    partials = at::empty({tiles, cols}, x.options().dtype(at::kFloat));
    args.column_partials = partials.data_ptr<float>();
  }
  C10_CUDA_CHECK(launch_fp8_cast(args, stream));
  if (partials.defined()) {
    out.column_sums = at::empty({cols}, partials.options());
    C10_CUDA_CHECK(launch_fp8_column_fold(
        partials.data_ptr<float>(),
        partials.size(0),
        cols,
        out.column_sums.data_ptr<float>(),
        stream));
  }
  return out;
}

// Whether `aux` is what `op` takes: for kGeluBackward x's shape, dtype and
// device, else undefined.
bool aux_fits(const at::Tensor& x, Fp8CastOp op, const at::Tensor& aux) {
  if (op != Fp8CastOp::kGeluBackward) {
    return !aux.defined();
  }
  return aux.defined() && aux.sizes() == x.sizes() &&
      aux.scalar_type() == x.scalar_type() && aux.device() == x.device();
}

at::Tensor contiguous_or_none(const at::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
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
    bool transposed,
    bool column_sums,
    Fp8CastOp op,
    const at::Tensor& aux,
    const at::Tensor& ride,
    at::ScalarType ride_dtype) {
  TORCH_CHECK(
      fp8_cast_cuda_applies(x) && aux_fits(x, op, aux) &&
          scale.scalar_type() == at::kFloat &&
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
      transposed,
      column_sums,
      op,
      contiguous_or_none(aux),
      ride,
      ride_dtype);
}

Fp8Cast fp8_cast_tensorwise_cuda(
    const at::Tensor& x,
    at::ScalarType fp8,
    bool data,
    bool transposed,
    bool column_sums,
    Fp8CastOp op,
    const at::Tensor& aux,
    const at::Tensor& ride,
    at::ScalarType ride_dtype) {
  TORCH_CHECK(
      fp8_cast_cuda_applies(x) && aux_fits(x, op, aux),
      "fp8_cast_tensorwise_cuda: not a case it takes");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto xc = x.contiguous();
  const auto auxc = contiguous_or_none(aux);
  auto amax = at::zeros({}, x.options().dtype(at::kFloat));
  C10_CUDA_CHECK(launch_fp8_amax(
      cast_input_type(xc.scalar_type()),
      xc.data_ptr(),
      xc.numel(),
      amax.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream(),
      op,
      auxc.defined() ? auxc.data_ptr() : nullptr));
  // quantize_tensorwise's scale, with its ops (so its bits).
  const auto scale = fp8_max_of(fp8) / amax.clamp_min(kFp8AmaxEps);
  return cast_kernel(
      xc,
      fp8,
      scale,
      at::Tensor(),
      /*saturate_inf=*/true,
      data,
      transposed,
      column_sums,
      op,
      auxc,
      ride,
      ride_dtype);
}

bool fp8_update_cuda_applies(const Fp8DelayedState& s) {
  const auto& h = s.history;
  return h.is_cuda() && h.scalar_type() == at::kFloat && h.dim() == 2 &&
      h.size(0) == 3 && h.size(1) >= 1 && h.size(1) <= kFp8UpdateMaxHistory &&
      h.is_contiguous() && s.scale.device() == h.device() &&
      s.scale.scalar_type() == at::kFloat && s.scale.numel() == 3 &&
      s.scale.is_contiguous();
}

namespace {

// The update's arguments every layer shares, for histories of `len`.
Fp8ScaleUpdateArgs update_args(const Fp8Recipe& recipe, int64_t len) {
  Fp8ScaleUpdateArgs args;
  args.len = static_cast<int>(len);
  args.most_recent = recipe.amax_compute() == Fp8AmaxCompute::kMostRecent;
  // NOTE: as ATen divides by a scalar on CUDA: times its reciprocal,
  // computed in fp32 (2^margin past fp32's range: inf, so 0).
  args.margin_scale =
      1.0f / static_cast<float>(std::ldexp(1.0, recipe.margin()));
  return args;
}

} // namespace

void fp8_update_delayed_cuda(
    const Fp8DelayedState& s,
    const Fp8Recipe& recipe) {
  TORCH_CHECK(
      fp8_update_cuda_applies(s),
      "fp8_update_delayed_cuda: not a state it takes");
  const c10::cuda::CUDAGuard guard(s.history.device());
  auto args = update_args(recipe, s.history.size(1));
  args.history = s.history.data_ptr<float>();
  args.scale = s.scale.data_ptr<float>();
  C10_CUDA_CHECK(
      launch_fp8_scale_update(args, c10::cuda::getCurrentCUDAStream()));
}

void fp8_update_delayed_cuda(
    const std::vector<Fp8DelayedState>& states,
    const Fp8Recipe& recipe) {
  if (states.empty()) {
    return;
  }
  const auto& first = states.front().history;
  std::vector<float*> histories, scales;
  histories.reserve(states.size());
  scales.reserve(states.size());
  for (const auto& s : states) {
    TORCH_CHECK(
        fp8_update_cuda_applies(s) && s.history.device() == first.device() &&
            s.history.size(1) == first.size(1),
        "fp8_update_delayed_cuda: not states it takes together");
    histories.push_back(s.history.data_ptr<float>());
    scales.push_back(s.scale.data_ptr<float>());
  }
  const c10::cuda::CUDAGuard guard(first.device());
  C10_CUDA_CHECK(launch_fp8_scale_updates(
      update_args(recipe, first.size(1)),
      histories.data(),
      scales.data(),
      static_cast<int>(states.size()),
      c10::cuda::getCurrentCUDAStream()));
}

} // namespace lamp::nn::detail
