#pragma once

// Internal: the cuDNN plumbing of lamp's cuDNN ops
// (src/nn/batch_norm_act_cudnn.cpp): the status check, RAII descriptors,
// ATen's handle bound to the current stream, scratch buffers from the
// caching allocator. Only with LAMP_WITH_CUDNN.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

namespace lamp::nn::detail {

// cuDNN turned the inputs down (a CUDNN_STATUS_NOT_SUPPORTED* or
// CUDNN_STATUS_BAD_PARAM* status): it checks arguments before it launches
// anything, so nothing ran and the caller may fall back to ATen.
struct CudnnRejected : c10::Error {
  using c10::Error::Error;
};

// Throws CudnnRejected or c10::Error with cuDNN's status name, its last
// error string and the call.
[[noreturn]] void throw_cudnn_error(
    cudnnStatus_t status,
    const char* call,
    const char* file,
    uint32_t line);

// Every cuDNN call goes through this.
#define LAMP_CUDNN_CHECK(call)                                      \
  do {                                                              \
    const cudnnStatus_t lamp_cudnn_status_ = (call);                \
    if (lamp_cudnn_status_ != CUDNN_STATUS_SUCCESS) {               \
      ::lamp::nn::detail::throw_cudnn_error(                        \
          lamp_cudnn_status_, #call, __FILE__, uint32_t(__LINE__)); \
    }                                                               \
  } while (0)

template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() {
    LAMP_CUDNN_CHECK(Create(&desc_));
  }
  ~Descriptor() {
    Destroy(desc_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const {
    return desc_;
  }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor = Descriptor<
    cudnnTensorDescriptor_t,
    &cudnnCreateTensorDescriptor,
    &cudnnDestroyTensorDescriptor>;
using ActivationDescriptor = Descriptor<
    cudnnActivationDescriptor_t,
    &cudnnCreateActivationDescriptor,
    &cudnnDestroyActivationDescriptor>;

// An NHWC descriptor of a 4-d channels-last fp16 or bf16 tensor.
void set_nhwc(const TensorDescriptor& desc, const at::Tensor& t);

// ATen's handle for this thread and the current device, bound to the
// current stream: work is ordered like any ATen op's, needs no host sync
// and can be captured in a CUDA graph.
cudnnHandle_t handle();

// A device buffer of at least `size` bytes on like's device, from the
// caching allocator on the current stream (never null: a null workspace
// would make cuDNN ignore the fused batch-norm ops).
at::Tensor buffer(size_t size, const at::Tensor& like);

} // namespace lamp::nn::detail
