# Finds gloo's headers (Debian: libgloo-dev), which c10d's ProcessGroupGloo.hpp
# includes. lamp links no gloo library: the Gloo process group and gloo
# itself are compiled into LibTorch (libtorch_cpu); the headers only declare
# what lamp calls. Set Gloo_ROOT to look elsewhere first.
#
# Result: Gloo_FOUND, Gloo_INCLUDE_DIR.

find_path(Gloo_INCLUDE_DIR gloo/algorithm.h HINTS "$ENV{Gloo_ROOT}/include")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo REQUIRED_VARS Gloo_INCLUDE_DIR)
mark_as_advanced(Gloo_INCLUDE_DIR)
