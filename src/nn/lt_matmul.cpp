#include "lt_matmul.h"

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

// Note [Row-major GEMMs through cuBLASLt]
// cuBLASLt is column-major. A row-major [R, C] buffer is the column-major
// [C, R] matrix, so row-major out = op(a) · op(b) is column-major
// out^T = op(b)^T · op(a)^T: cuBLASLt's A is `b`, its B is `a`, m = N,
// n = M, k = K. The bias (length m = N) is then added to every row of the
// row-major output, and the aux
// matrix is [M, N] row-major with leading dimension N: what ATen's
// addmm-with-bias does, and what llm.c does for its GELU epilogues.

namespace lamp::nn::detail {
namespace {

#define LAMP_CUBLASLT_CHECK(expr)                  \
  do {                                             \
    const cublasStatus_t lamp_status_ = (expr);    \
    TORCH_CHECK(                                   \
        lamp_status_ == CUBLAS_STATUS_SUCCESS,     \
        "lamp: cuBLASLt call failed: " #expr ": ", \
        cublasLtGetStatusString(lamp_status_));    \
  } while (false)

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const {
    cublasLtMatmulDescDestroy(d);
  }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const {
    cublasLtMatrixLayoutDestroy(l);
  }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t a, T v) {
  LAMP_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, a, &v, sizeof v));
}

template <typename T>
void set(
    cublasLtMatmulPreference_t p,
    cublasLtMatmulPreferenceAttributes_t a,
    T v) {
  LAMP_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof v));
}

Layout layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  LAMP_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  return Layout(l);
}

// The largest power of two up to 256 that divides the address: what
// cuBLASLt's heuristic may assume of the operand.
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) {
    a /= 2;
  }
  return a;
}

// The heuristic's choice for one problem: cuBLASLt's heuristic costs tens
// of microseconds of host time a call, and a training step asks the same
// few questions every step.
using Key = std::tuple<
    int, // device
    int, // epilogue
    int, // data type
    int64_t,
    int64_t,
    int64_t, // M, N, K
    bool,
    bool, // transposes
    uint32_t,
    uint32_t,
    uint32_t,
    uint32_t, // alignments of b, a, out, aux
    size_t>; // workspace
std::mutex cache_mutex;
std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algo_cache;

} // namespace

bool lt_matmul(
    const at::Tensor& out,
    const at::Tensor& a,
    bool transpose_a,
    const at::Tensor& b,
    bool transpose_b,
    LtEpilogue epilogue,
    const at::Tensor& aux,
    const at::Tensor& bias) {
  const auto dtype = out.scalar_type();
  TORCH_INTERNAL_ASSERT(dtype == at::kBFloat16 || dtype == at::kHalf);
  TORCH_INTERNAL_ASSERT(a.scalar_type() == dtype && b.scalar_type() == dtype);
  TORCH_INTERNAL_ASSERT(aux.defined() && aux.scalar_type() == dtype);
  TORCH_INTERNAL_ASSERT(
      out.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
      aux.is_contiguous());
  const int64_t M = out.size(0);
  const int64_t N = out.size(1);
  const int64_t K = transpose_a ? a.size(0) : a.size(1);
  TORCH_INTERNAL_ASSERT((transpose_a ? a.size(1) : a.size(0)) == M);
  TORCH_INTERNAL_ASSERT((transpose_b ? b.size(1) : b.size(0)) == K);
  TORCH_INTERNAL_ASSERT((transpose_b ? b.size(0) : b.size(1)) == N);
  TORCH_INTERNAL_ASSERT(aux.size(0) == M && aux.size(1) == N);
  const cudaDataType_t type = dtype == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;

  const c10::cuda::CUDAGuard guard(out.device());
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();

  cublasLtMatmulDesc_t raw_desc = nullptr;
  LAMP_CUBLASLT_CHECK(
      cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const Desc desc(raw_desc);
  // See Note [Row-major GEMMs through cuBLASLt]: cuBLASLt's A is `b`.
  set(raw_desc,
      CUBLASLT_MATMUL_DESC_TRANSA,
      transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(raw_desc,
      CUBLASLT_MATMUL_DESC_TRANSB,
      transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  cublasLtEpilogue_t mode = CUBLASLT_EPILOGUE_DEFAULT;
  switch (epilogue) {
    case LtEpilogue::kGeluAuxBias:
      TORCH_INTERNAL_ASSERT(bias.defined() && bias.scalar_type() == dtype);
      mode = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.const_data_ptr());
      break;
    case LtEpilogue::kDGelu:
      mode = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, mode);
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.data_ptr());
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{N});

  const auto a_layout =
      transpose_b ? layout(type, K, N, K) : layout(type, N, K, N);
  const auto b_layout =
      transpose_a ? layout(type, M, K, M) : layout(type, K, M, K);
  const auto d_layout = layout(type, N, M, N);

  const Key key{
      out.get_device(),
      static_cast<int>(epilogue),
      static_cast<int>(type),
      M,
      N,
      K,
      transpose_a,
      transpose_b,
      alignment(b.const_data_ptr()),
      alignment(a.const_data_ptr()),
      alignment(out.const_data_ptr()),
      alignment(aux.const_data_ptr()),
      workspace_size};
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool known = false;
  {
    const std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = algo_cache.find(key);
    if (it != algo_cache.end()) {
      algo = it->second;
      known = true;
    }
  }
  if (!known) {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    LAMP_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    const Pref pref(raw_pref);
    set(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_size);
    set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::get<8>(key));
    set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::get<9>(key));
    set(raw_pref,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        std::get<10>(key));
    set(raw_pref,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        std::get<10>(key));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle,
        raw_desc,
        a_layout.get(),
        b_layout.get(),
        d_layout.get(),
        d_layout.get(),
        raw_pref,
        1,
        &result,
        &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
      algo = result.algo;
    } else {
      TORCH_CHECK(
          status == CUBLAS_STATUS_SUCCESS ||
              status == CUBLAS_STATUS_NOT_SUPPORTED,
          "lamp: cuBLASLt's heuristic failed: ",
          cublasLtGetStatusString(status));
    }
    const std::lock_guard<std::mutex> lock(cache_mutex);
    algo_cache.emplace(key, algo);
  }
  if (!algo) {
    return false;
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  LAMP_CUBLASLT_CHECK(cublasLtMatmul(
      handle,
      raw_desc,
      &alpha,
      b.const_data_ptr(),
      a_layout.get(),
      a.const_data_ptr(),
      b_layout.get(),
      &beta,
      out.const_data_ptr(),
      d_layout.get(),
      out.mutable_data_ptr(),
      d_layout.get(),
      &*algo,
      workspace,
      workspace_size,
      c10::cuda::getCurrentCUDAStream(out.get_device()).stream()));
  return true;
}

} // namespace lamp::nn::detail
