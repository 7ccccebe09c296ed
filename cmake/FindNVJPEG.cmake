# Finds nvJPEG, the CUDA toolkit's JPEG codec library, in this order:
#   1. NVJPEG_ROOT (CMake or environment variable: a folder with include/
#      and lib/, e.g. the contents of pip's nvidia/cu13 from the
#      nvidia-nvjpeg wheel), then CMAKE_PREFIX_PATH;
#   2. the CUDA toolkit: the library FindCUDAToolkit found (CUDA::nvjpeg),
#      else its library and include folders;
#   3. pip's nvidia-nvjpeg next to LibTorch: nvidia/cu13 (CUDA 13 wheels)
#      or nvidia/nvjpeg (CUDA 12 wheels);
#   4. NVJPEG_HINTS, more prefixes (lamp's package config passes the nvJPEG
#      lamp was built with).
#
# Result: NVJPEG_FOUND, NVJPEG_VERSION, NVJPEG_INCLUDE_DIR, NVJPEG_LIBRARY and
# the imported target NVJPEG::NVJPEG.

set(_nvjpeg_roots)
if(NVJPEG_ROOT)
  list(APPEND _nvjpeg_roots "${NVJPEG_ROOT}")
endif()
if(DEFINED ENV{NVJPEG_ROOT})
  list(APPEND _nvjpeg_roots "$ENV{NVJPEG_ROOT}")
endif()

set(_nvjpeg_hints)
if(NOT _nvjpeg_roots AND TARGET CUDA::nvjpeg)
  get_target_property(_nvjpeg_lib CUDA::nvjpeg IMPORTED_LOCATION)
  if(_nvjpeg_lib)
    get_filename_component(_nvjpeg_dir "${_nvjpeg_lib}" DIRECTORY)
    list(APPEND _nvjpeg_hints "${_nvjpeg_dir}/..")
  endif()
endif()
foreach(dir IN LISTS CUDAToolkit_LIBRARY_DIR CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nvjpeg_hints "${dir}/..")
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nvjpeg_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(TORCH_INSTALL_PREFIX)
  list(APPEND _nvjpeg_hints
    "${TORCH_INSTALL_PREFIX}/../nvidia/cu13"
    "${TORCH_INSTALL_PREFIX}/../nvidia/nvjpeg")
endif()
list(APPEND _nvjpeg_hints ${NVJPEG_HINTS})

# NOTE: NVJPEG_ROOT (searched first by find_package's <Package>_ROOT rule,
# listed again for projects with policy CMP0074 OLD) comes before
# CMAKE_PREFIX_PATH, which comes before the hints. pip ships only the
# versioned libnvjpeg.so.13 (or .so.12), the toolkit both names.
find_path(NVJPEG_INCLUDE_DIR nvjpeg.h
  HINTS ${_nvjpeg_roots} ${_nvjpeg_hints} PATH_SUFFIXES include)
find_library(NVJPEG_LIBRARY
  NAMES nvjpeg libnvjpeg.so.13 libnvjpeg.so.12 NAMES_PER_DIR
  HINTS ${_nvjpeg_roots} ${_nvjpeg_hints}
  PATH_SUFFIXES lib lib64 lib/x64 targets/x86_64-linux/lib)

if(NVJPEG_INCLUDE_DIR AND EXISTS "${NVJPEG_INCLUDE_DIR}/nvjpeg.h")
  file(STRINGS "${NVJPEG_INCLUDE_DIR}/nvjpeg.h" _nvjpeg_defs
       REGEX "^#define NVJPEG_VER_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NVJPEG_VER_${part} +([0-9]+).*" "\\1"
           _nvjpeg_${part} "${_nvjpeg_defs}")
  endforeach()
  set(NVJPEG_VERSION "${_nvjpeg_MAJOR}.${_nvjpeg_MINOR}.${_nvjpeg_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NVJPEG
  REQUIRED_VARS NVJPEG_LIBRARY NVJPEG_INCLUDE_DIR
  VERSION_VAR NVJPEG_VERSION)

if(NVJPEG_FOUND AND NOT TARGET NVJPEG::NVJPEG)
  add_library(NVJPEG::NVJPEG UNKNOWN IMPORTED)
  set_target_properties(NVJPEG::NVJPEG PROPERTIES
    IMPORTED_LOCATION "${NVJPEG_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NVJPEG_INCLUDE_DIR}")
endif()
mark_as_advanced(NVJPEG_INCLUDE_DIR NVJPEG_LIBRARY)
