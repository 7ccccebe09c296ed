# Finds NVIDIA's cudnn-frontend, the header-only C++ API of cuDNN's graphs
# (https://github.com/NVIDIA/cudnn-frontend). PyPI's nvidia-cudnn-frontend
# ships its headers in site-packages/include, so the copy beside LibTorch's
# torch package is looked for first; then CUDNN_FRONTEND_ROOT (a CMake or
# environment variable: a folder with include/cudnn_frontend.h) and the
# project's .deps/cudnn_frontend (where tools/gpu scripts unpack the wheel).
#
# Result: CudnnFrontend_FOUND, CudnnFrontend_VERSION and
# CudnnFrontend_INCLUDE_DIR (headers only; lamp compiles them with
# CUDNN_FRONTEND_SKIP_JSON_LIB: their JSON serialisation, which lamp does
# not use, doubles their compile time).

set(_fe_hints)
if(CUDNN_FRONTEND_ROOT)
  list(APPEND _fe_hints "${CUDNN_FRONTEND_ROOT}")
endif()
if(DEFINED ENV{CUDNN_FRONTEND_ROOT})
  list(APPEND _fe_hints "$ENV{CUDNN_FRONTEND_ROOT}")
endif()
if(TORCH_INSTALL_PREFIX)
  # site-packages/torch -> site-packages (include/cudnn_frontend.h there).
  list(APPEND _fe_hints "${TORCH_INSTALL_PREFIX}/..")
endif()
list(APPEND _fe_hints "${PROJECT_SOURCE_DIR}/.deps/cudnn_frontend")

find_path(CudnnFrontend_INCLUDE_DIR cudnn_frontend.h
  HINTS ${_fe_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NOT CudnnFrontend_INCLUDE_DIR)
  find_path(CudnnFrontend_INCLUDE_DIR cudnn_frontend.h)
endif()

if(CudnnFrontend_INCLUDE_DIR AND
   EXISTS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h" _fe_defs
       REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define CUDNN_FRONTEND_${part}_VERSION +([0-9]+).*"
           "\\1" _fe_${part} "${_fe_defs}")
  endforeach()
  set(CudnnFrontend_VERSION "${_fe_MAJOR}.${_fe_MINOR}.${_fe_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CudnnFrontend_INCLUDE_DIR
  VERSION_VAR CudnnFrontend_VERSION)
