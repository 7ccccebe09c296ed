#include <lamp/build_info.h>

#include <torch/version.h>

#include <sstream>

#if LAMP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if LAMP_WITH_NCCL
#include <nccl.h>
#endif
#if LAMP_WITH_CUDNN
#include <cudnn.h>
#endif

namespace lamp {

std::string build_info() {
  std::ostringstream out;
  out << "lamp " << LAMP_VERSION << ", LibTorch " << TORCH_VERSION;
#if LAMP_WITH_CUDA
  out << ", CUDA " << CUDART_VERSION / 1000 << "."
      << CUDART_VERSION % 1000 / 10;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    out << " (runtime " << runtime / 1000 << "." << runtime % 1000 / 10 << ")";
  }
#endif
#if LAMP_WITH_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
    out << ", NCCL " << nccl / 10000 << "." << nccl % 10000 / 100 << "."
        << nccl % 100;
  }
#endif
#if LAMP_WITH_CUDNN
  // cudnnGetVersion() is MAJOR * 10000 + MINOR * 100 + PATCH since 9.0.
  const size_t cudnn = cudnnGetVersion();
  out << ", cuDNN " << cudnn / 10000 << "." << cudnn % 10000 / 100 << "."
      << cudnn % 100;
#endif
  return out.str();
}

} // namespace lamp
