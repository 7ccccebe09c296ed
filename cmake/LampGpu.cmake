# Decides LAMP_WITH_CUDA, LAMP_WITH_NCCL, LAMP_WITH_CUDNN,
# LAMP_WITH_CUDNN_FRONTEND and LAMP_WITH_NVJPEG
# after LibTorch has been found. All default to ON when LibTorch is a CUDA
# build and the CUDA toolkit (and NCCL, cuDNN, nvJPEG) are found, so CPU-only
# machines with the toolkit still compile the GPU paths. Explicit ON that
# cannot be honoured is an error.

set(_lamp_cuda_ok OFF)
set(_lamp_cuda_why "")
if(NOT TARGET torch::cudart)
  set(_lamp_cuda_why "LibTorch ${Torch_VERSION} is a CPU-only build")
elseif(NOT CUDAToolkit_FOUND)
  set(_lamp_cuda_why "no CUDA toolkit was found")
else()
  # LibTorch links torch::cudart from this toolkit; lamp uses the same target.
  # Make sure it is the CUDA major LibTorch was built with, or the process
  # would end up with two libcudart majors.
  set(_torch_cuda "")
  if(EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
    file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" _line
         REGEX "^cuda.*= *'[0-9.]+'")
    string(REGEX REPLACE ".*'([0-9.]+)'.*" "\\1" _torch_cuda "${_line}")
  elseif(EXISTS "${TORCH_INSTALL_PREFIX}/build-version")
    file(READ "${TORCH_INSTALL_PREFIX}/build-version" _line)
    if(_line MATCHES "\\+cu([0-9]+)([0-9])")
      set(_torch_cuda "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    endif()
  endif()
  string(REGEX REPLACE "\\..*" "" _torch_cuda_major "${_torch_cuda}")
  if(_torch_cuda AND NOT _torch_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
    message(FATAL_ERROR
      "lamp: LibTorch ${Torch_VERSION} was built with CUDA ${_torch_cuda} but "
      "the CUDA toolkit found is ${CUDAToolkit_VERSION} "
      "(${CUDAToolkit_BIN_DIR}). Two CUDA runtimes cannot share one process: "
      "point -DCUDAToolkit_ROOT at a CUDA ${_torch_cuda_major}.x toolkit, or "
      "use a LibTorch built for CUDA ${CUDAToolkit_VERSION_MAJOR}.")
  endif()
  set(LAMP_TORCH_CUDA_VERSION "${_torch_cuda}")
  set(_lamp_cuda_ok ON)
endif()

option(LAMP_WITH_CUDA "Build lamp's CUDA code (default: on when found)"
       ${_lamp_cuda_ok})
if(LAMP_WITH_CUDA AND NOT _lamp_cuda_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_CUDA=ON but ${_lamp_cuda_why}. Use a CUDA LibTorch and "
    "toolkit, or configure with -DLAMP_WITH_CUDA=OFF.")
endif()
# cuBLASLt: GEMMs with GELU epilogues (lamp::nn::gelu_mlp). LibTorch's own
# GEMMs use it, so every CUDA LibTorch comes with one.
if(LAMP_WITH_CUDA)
  find_package(CUBLASLT)
  if(NOT CUBLASLT_FOUND)
    message(FATAL_ERROR
      "lamp: cuBLASLt was not found next to LibTorch (nvidia/cu13/lib) or in "
      "the CUDA toolkit. Set CUBLASLT_ROOT to a folder with include/cublasLt.h "
      "and lib/libcublasLt.so*, or configure with -DLAMP_WITH_CUDA=OFF.")
  endif()
endif()

set(_lamp_nccl_ok OFF)
if(LAMP_WITH_CUDA)
  find_package(NCCL)
  set(_lamp_nccl_ok ${NCCL_FOUND})
endif()
option(LAMP_WITH_NCCL "Build lamp's NCCL code (default: on when found)"
       ${_lamp_nccl_ok})
if(LAMP_WITH_NCCL AND NOT _lamp_nccl_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_NCCL=ON but NCCL was not found (it also needs "
    "LAMP_WITH_CUDA). Set NCCL_ROOT, or configure with -DLAMP_WITH_NCCL=OFF.")
endif()

# Gloo: collectives between CPU processes (lamp::dist without GPUs), through
# the c10d::ProcessGroupGloo that LibTorch carries when it was built with it.
set(_lamp_gloo_ok OFF)
get_target_property(_lamp_torch_defs torch_cpu INTERFACE_COMPILE_DEFINITIONS)
if("USE_C10D_GLOO" IN_LIST _lamp_torch_defs)
  find_package(Gloo)
  set(_lamp_gloo_ok ${Gloo_FOUND})
endif()
option(LAMP_WITH_GLOO
       "Build lamp's Gloo backend (CPU processes; default: on when found)"
       ${_lamp_gloo_ok})
if(LAMP_WITH_GLOO AND NOT _lamp_gloo_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_GLOO=ON but gloo's headers (Debian: libgloo-dev) or a "
    "LibTorch built with Gloo were not found. Set Gloo_ROOT, or configure with "
    "-DLAMP_WITH_GLOO=OFF.")
endif()

set(_lamp_cudnn_ok OFF)
if(LAMP_WITH_CUDA)
  find_package(CUDNN)
  set(_lamp_cudnn_ok ${CUDNN_FOUND})
endif()
option(LAMP_WITH_CUDNN
       "Build lamp's cuDNN code (fused BatchNorm; default: on when found)"
       ${_lamp_cudnn_ok})
if(LAMP_WITH_CUDNN AND NOT _lamp_cudnn_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_CUDNN=ON but cuDNN was not found (it also needs "
    "LAMP_WITH_CUDA). Set CUDNN_ROOT, or configure with -DLAMP_WITH_CUDNN=OFF.")
endif()

set(_lamp_cudnn_frontend_ok OFF)
if(LAMP_WITH_CUDNN)
  find_package(CudnnFrontend)
  set(_lamp_cudnn_frontend_ok ${CudnnFrontend_FOUND})
endif()
option(LAMP_WITH_CUDNN_FRONTEND
       "Build lamp's cuDNN graph code (cudnn-frontend; default: on when found)"
       ${_lamp_cudnn_frontend_ok})
if(LAMP_WITH_CUDNN_FRONTEND AND NOT _lamp_cudnn_frontend_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_CUDNN_FRONTEND=ON but cudnn-frontend's headers were not "
    "found (it also needs LAMP_WITH_CUDNN). pip install --no-deps "
    "nvidia-cudnn-frontend next to torch, set CUDNN_FRONTEND_ROOT to a folder "
    "with include/cudnn_frontend.h, or configure with "
    "-DLAMP_WITH_CUDNN_FRONTEND=OFF.")
endif()

set(_lamp_nvjpeg_ok OFF)
if(LAMP_WITH_CUDA)
  find_package(NVJPEG)
  set(_lamp_nvjpeg_ok ${NVJPEG_FOUND})
endif()
option(LAMP_WITH_NVJPEG
       "Build lamp's nvJPEG code (GPU JPEG decoding; default: on when found)"
       ${_lamp_nvjpeg_ok})
if(LAMP_WITH_NVJPEG AND NOT _lamp_nvjpeg_ok)
  message(FATAL_ERROR
    "lamp: LAMP_WITH_NVJPEG=ON but nvJPEG was not found (it also needs "
    "LAMP_WITH_CUDA). Install it (pip install nvidia-nvjpeg next to torch, "
    "or the CUDA toolkit's libnvjpeg), set NVJPEG_ROOT to a folder with "
    "include/nvjpeg.h and lib/libnvjpeg.so.*, or configure with "
    "-DLAMP_WITH_NVJPEG=OFF.")
endif()

if(LAMP_WITH_CUDA)
  message(STATUS "lamp: CUDA ${CUDAToolkit_VERSION} (LibTorch built with "
                 "CUDA ${LAMP_TORCH_CUDA_VERSION})")
else()
  message(STATUS "lamp: without CUDA (${_lamp_cuda_why})")
endif()
if(LAMP_WITH_CUDA)
  message(STATUS "lamp: cuBLASLt (${CUBLASLT_LIBRARY})")
endif()
if(LAMP_WITH_NCCL)
  message(STATUS "lamp: NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
else()
  message(STATUS "lamp: without NCCL")
endif()
if(LAMP_WITH_CUDNN)
  message(STATUS "lamp: cuDNN ${CUDNN_VERSION} (${CUDNN_LIBRARY})")
else()
  message(STATUS "lamp: without cuDNN (fused BatchNorm falls back to ATen ops)")
endif()
if(LAMP_WITH_CUDNN_FRONTEND)
  message(STATUS "lamp: cudnn-frontend ${CudnnFrontend_VERSION} "
                 "(${CudnnFrontend_INCLUDE_DIR})")
else()
  message(STATUS "lamp: without cudnn-frontend (no cuDNN graph convolutions)")
endif()
if(LAMP_WITH_NVJPEG)
  message(STATUS "lamp: nvJPEG ${NVJPEG_VERSION} (${NVJPEG_LIBRARY})")
else()
  message(STATUS "lamp: without nvJPEG (JPEGs are decoded on the CPU)")
endif()
