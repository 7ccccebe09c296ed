# Finds libjpeg-turbo's TurboJPEG API (Debian/Ubuntu: libturbojpeg0-dev),
# which lamp::data decodes JPEG files with on the CPU.
#
# Result: TurboJPEG_FOUND, TurboJPEG_INCLUDE_DIR, TurboJPEG_LIBRARY and the
# imported target TurboJPEG::TurboJPEG.

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(_turbojpeg_pc QUIET libturbojpeg)
endif()
find_path(TurboJPEG_INCLUDE_DIR turbojpeg.h
  HINTS ${_turbojpeg_pc_INCLUDE_DIRS})
find_library(TurboJPEG_LIBRARY NAMES turbojpeg libturbojpeg.so.0
  NAMES_PER_DIR HINTS ${_turbojpeg_pc_LIBRARY_DIRS})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TurboJPEG
  REQUIRED_VARS TurboJPEG_LIBRARY TurboJPEG_INCLUDE_DIR)

if(TurboJPEG_FOUND AND NOT TARGET TurboJPEG::TurboJPEG)
  add_library(TurboJPEG::TurboJPEG UNKNOWN IMPORTED)
  set_target_properties(TurboJPEG::TurboJPEG PROPERTIES
    IMPORTED_LOCATION "${TurboJPEG_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TurboJPEG_INCLUDE_DIR}")
endif()
mark_as_advanced(TurboJPEG_INCLUDE_DIR TurboJPEG_LIBRARY)
