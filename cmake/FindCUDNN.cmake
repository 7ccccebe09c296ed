# Finds cuDNN, preferring the copy that LibTorch itself loads (pip's
# nvidia/cudnn next to torch) so that one process never holds two cuDNNs,
# then the CUDA toolkit's, then CUDNN_ROOT.
#
# Result: CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY and the
# imported target CUDNN::CUDNN.

set(_cudnn_hints)
if(TORCH_INSTALL_PREFIX)
  list(APPEND _cudnn_hints "${TORCH_INSTALL_PREFIX}/../nvidia/cudnn")
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _cudnn_hints "${dir}/..")
  endforeach()
endif()
if(DEFINED ENV{CUDNN_ROOT})
  list(APPEND _cudnn_hints "$ENV{CUDNN_ROOT}")
endif()

# NOTE: pip ships only the versioned libcudnn.so.9, the toolkit both names.
find_path(CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
  HINTS ${_cudnn_hints} PATH_SUFFIXES lib lib64 lib/x64)

if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_defs
       REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(part MAJOR MINOR PATCHLEVEL)
    string(REGEX REPLACE ".*#define CUDNN_${part} +([0-9]+).*" "\\1"
           _cudnn_${part} "${_cudnn_defs}")
  endforeach()
  set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
