#include "bn_finalize_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lamp::nn::detail {
namespace {

__device__ void store(float* out, double v) {
  *out = static_cast<float>(v);
}
__device__ void store(__half* out, double v) {
  *out = __float2half_rn(static_cast<float>(v));
}
__device__ void store(__nv_bfloat16* out, double v) {
  *out = __float2bfloat16_rn(static_cast<float>(v));
}

// One thread a channel: a few hundred to a few thousand channels, a few
// flops each; the launch is the cost.
template <typename Fold>
__global__ void bn_finalize_kernel(BnFinalizeArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.channels) {
    return;
  }
  // NOTE: in double: var = E[x^2] - E[x]^2 loses what the two terms share;
  // the float sums carry their own rounding, double adds none.
  const double mean = static_cast<double>(a.sum[c]) / a.count;
  double var = static_cast<double>(a.sum_of_squares[c]) / a.count - mean * mean;
  var = var > 0.0 ? var : 0.0;
  const double invstd = 1.0 / sqrt(var + a.eps);
  a.mean[c] = static_cast<float>(mean);
  a.invstd[c] = static_cast<float>(invstd);
  if (a.running_mean != nullptr) {
    const double m = a.momentum;
    a.running_mean[c] =
        static_cast<float>((1.0 - m) * a.running_mean[c] + m * mean);
    a.running_var[c] = static_cast<float>(
        (1.0 - m) * a.running_var[c] + m * var * a.count / (a.count - 1.0));
  }
  const double w = a.weight != nullptr ? a.weight[c] : 1.0;
  const double b = a.bias != nullptr ? a.bias[c] : 0.0;
  const double scale = w * invstd;
  store(static_cast<Fold*>(a.scale) + c, scale);
  store(static_cast<Fold*>(a.shift) + c, b - mean * scale);
}

} // namespace

cudaError_t launch_bn_finalize(
    const BnFinalizeArgs& args,
    cudaStream_t stream) {
  if (args.channels <= 0) {
    return cudaSuccess;
  }
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>((args.channels + kThreads - 1) / kThreads);
  switch (args.fold) {
    case FoldDtype::kHalf:
      bn_finalize_kernel<__half><<<blocks, kThreads, 0, stream>>>(args);
      break;
    case FoldDtype::kBFloat16:
      bn_finalize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(args);
      break;
    case FoldDtype::kFloat:
      bn_finalize_kernel<float><<<blocks, kThreads, 0, stream>>>(args);
      break;
  }
  return cudaGetLastError();
}

} // namespace lamp::nn::detail
