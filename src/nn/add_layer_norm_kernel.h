#pragma once

// Internal: lamp::nn::add_layer_norm's kernels (Note [Residual add and
// LayerNorm in one pass] in add_layer_norm.cpp). Plain CUDA, no LibTorch
// types (add_layer_norm_cuda.cpp is the caller).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp::nn::detail {

enum class NormFormat : uint8_t { kNone, kFloat, kHalf, kBFloat16 };

// The largest row add_layer_norm's kernels take.
constexpr int kMaxNormColumns = 2048;

struct AddNormForward {
  int64_t rows = 0;
  int columns = 0;
  float eps = 1e-5f;
  const float* x = nullptr; // rows x columns
  const void* r = nullptr; // rows x columns in r_format, or null
  NormFormat r_format = NormFormat::kNone;
  // Added to each row of r (columns, in r_bias_format), or null.
  const void* r_bias = nullptr;
  NormFormat r_bias_format = NormFormat::kNone;
  const float* weight = nullptr; // columns
  const float* bias = nullptr; // columns, or null
  float* sum = nullptr; // x + r, rows x columns (null when r is)
  void* y = nullptr; // LayerNorm(sum), rows x columns in y_format
  NormFormat y_format = NormFormat::kFloat;
  float* mean = nullptr; // rows
  float* rstd = nullptr; // rows
};

struct AddNormBackward {
  int64_t rows = 0;
  int columns = 0;
  const float* sum = nullptr; // what the forward normalised
  const float* weight = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const void* dy = nullptr; // in dy_format
  NormFormat dy_format = NormFormat::kFloat;
  const float* dsum = nullptr; // the sum's own gradient, or null
  float* dx = nullptr; // rows x columns
  void* dr = nullptr; // in dr_format, or null
  NormFormat dr_format = NormFormat::kNone;
  // dr's column sums (of its values as stored), the gradient of the
  // forward's r_bias, in dr_bias_format; or null. Needs dr.
  void* dr_bias = nullptr;
  NormFormat dr_bias_format = NormFormat::kNone;
  float* dweight = nullptr; // columns
  float* dbias = nullptr; // columns, or null
  float* partials = nullptr; // add_norm_backward_partials(...) floats
};

// Floats of scratch the backward needs (with dr_bias: `bias_sums`).
int64_t add_norm_backward_partials(int64_t rows, int columns, bool bias_sums);

cudaError_t launch_add_norm_forward(
    const AddNormForward& a,
    cudaStream_t stream);
cudaError_t launch_add_norm_backward(
    const AddNormBackward& a,
    cudaStream_t stream);

} // namespace lamp::nn::detail
