# Finds cuBLASLt, preferring the copy that LibTorch itself loads (pip's
# nvidia/cu13/lib or nvidia/cublas/lib next to torch) so that one process
# never holds two cuBLASLt builds, then the CUDA toolkit's, then
# CUBLASLT_ROOT. The header is the toolkit's (or CUBLASLT_ROOT's): the
# library is backward compatible with the headers of its major version.
#
# Result: CUBLASLT_FOUND, CUBLASLT_INCLUDE_DIR, CUBLASLT_LIBRARY and the
# imported target CUBLASLT::CUBLASLT.

set(_cublaslt_hints)
if(TORCH_INSTALL_PREFIX)
  list(APPEND _cublaslt_hints
    "${TORCH_INSTALL_PREFIX}/../nvidia/cu13"
    "${TORCH_INSTALL_PREFIX}/../nvidia/cublas")
endif()
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND _cublaslt_hints "${CUDAToolkit_LIBRARY_DIR}/..")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _cublaslt_hints "${dir}/..")
  endforeach()
endif()
if(DEFINED ENV{CUBLASLT_ROOT})
  list(APPEND _cublaslt_hints "$ENV{CUBLASLT_ROOT}")
endif()

find_path(CUBLASLT_INCLUDE_DIR cublasLt.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_cublaslt_hints} PATH_SUFFIXES include)
# NOTE: pip ships only the versioned libcublasLt.so.13, the toolkit both.
find_library(CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 NAMES_PER_DIR
  HINTS ${_cublaslt_hints} PATH_SUFFIXES lib lib64 lib/x64)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUBLASLT
  REQUIRED_VARS CUBLASLT_LIBRARY CUBLASLT_INCLUDE_DIR)

if(CUBLASLT_FOUND AND NOT TARGET CUBLASLT::CUBLASLT)
  add_library(CUBLASLT::CUBLASLT UNKNOWN IMPORTED)
  set_target_properties(CUBLASLT::CUBLASLT PROPERTIES
    IMPORTED_LOCATION "${CUBLASLT_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUBLASLT_INCLUDE_DIR}")
endif()
mark_as_advanced(CUBLASLT_INCLUDE_DIR CUBLASLT_LIBRARY)
