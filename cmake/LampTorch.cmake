# Finds LibTorch 2.11 for lamp, in this order:
#   1. the user's Torch_DIR / CMAKE_PREFIX_PATH (or a `torch` target that a parent
#      project already made);
#   2. the torch of `python3` (torch.utils.cmake_prefix_path), the usual case on
#      GPU hosts with PyTorch installed;
#   3. PyPI torch==${LAMP_TORCH_PIN} installed into a project-local virtual
#      environment (LAMP_VENV_DIR, git-ignored), created on first configure;
#      only when lamp is the top-level project (a consumer that adds lamp
#      with add_subdirectory/FetchContent gets an error asking for Torch_DIR,
#      and nothing is installed into its environment).
# Sets LAMP_TORCH_SOURCE (which of the three was used) and LAMP_PYTHON (a python
# whose `import torch` is this same LibTorch, used by the tests as their oracle;
# empty when there is none).

set(LAMP_TORCH_PIN "2.11.0")
set(LAMP_TORCHVISION_PIN "0.26.0")
set(LAMP_MATPLOTLIB_PIN "3.10.0") # tools/plot_metrics.py
set(LAMP_CUDNN_FRONTEND_PIN "1.32.0")
set(LAMP_VENV_DIR "${PROJECT_SOURCE_DIR}/.venv" CACHE PATH
    "Project-local virtual environment used when no LibTorch is found otherwise")
option(LAMP_TORCH_VENV
    "Skip Torch_DIR and python3; always use the project-local virtual environment" OFF)

find_package(Python3 COMPONENTS Interpreter)

# Runs `<python> -c "import torch"` and returns its version and cmake prefix.
function(_lamp_python_torch python out_version out_prefix)
  execute_process(
    COMMAND "${python}" -W ignore -c
      "import torch; print(torch.__version__.split('+')[0]); print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE out ERROR_QUIET RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" out "${out}")
    list(GET out 0 version)
    list(GET out 1 prefix)
    set(${out_version} "${version}" PARENT_SCOPE)
    set(${out_prefix} "${prefix}" PARENT_SCOPE)
  else()
    set(${out_version} "" PARENT_SCOPE)
    set(${out_prefix} "" PARENT_SCOPE)
  endif()
endfunction()

# A CUDA LibTorch's CMake config insists on a CUDA toolkit. On a machine
# without one, give it the toolkit that pip ships for the same CUDA version
# (nvcc, headers and libraries under site-packages/nvidia/cu<major>), installed
# into the project venv. Only done for lamp's own venv.
function(_lamp_cuda_toolkit_from_pip python torch_prefix)
  set(torch_dir "${torch_prefix}/../..")
  if(NOT EXISTS "${torch_dir}/version.py")
    return()
  endif()
  file(STRINGS "${torch_dir}/version.py" line REGEX "^cuda.*= *'[0-9.]+'")
  if(NOT line OR CUDAToolkit_ROOT OR CMAKE_CUDA_COMPILER)
    return()  # CPU-only torch, or the user chose a toolkit
  endif()
  find_program(LAMP_SYSTEM_NVCC nvcc
    HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin
    PATHS /usr/local/cuda/bin)
  if(LAMP_SYSTEM_NVCC)
    execute_process(COMMAND "${LAMP_SYSTEM_NVCC}" --version
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      return()
    endif()
  endif()
  string(REGEX REPLACE ".*'([0-9]+)\\.[0-9]+'.*" "\\1" major "${line}")
  get_filename_component(root "${torch_dir}/../nvidia/cu${major}" ABSOLUTE)
  if(NOT EXISTS "${root}/bin/nvcc")
    execute_process(
      COMMAND "${python}" -c
        "import importlib.metadata as m; print(m.version('cuda-toolkit'))"
      OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE rc ERROR_QUIET)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR
        "lamp: LibTorch is a CUDA ${major} build, no CUDA toolkit was found, "
        "and pip's cuda-toolkit is not installed next to torch. Install a CUDA "
        "${major}.x toolkit (or set CUDAToolkit_ROOT).")
    endif()
    message(STATUS "lamp: no CUDA toolkit found; installing pip's "
                   "cuda-toolkit ${version} (nvcc) next to torch")
    execute_process(
      COMMAND "${python}" -m pip install --disable-pip-version-check
              --progress-bar off "cuda-toolkit[nvcc,crt,nvvm,cccl]==${version}"
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "lamp: pip could not install cuda-toolkit ${version}.")
    endif()
  endif()
  # pip ships lib/ with versioned libraries only (libcudart.so.13); nvcc links
  # from lib64/ and CMake's CUDA discovery looks for the unversioned names.
  if(NOT EXISTS "${root}/lib64")
    file(CREATE_LINK lib "${root}/lib64" SYMBOLIC)
  endif()
  file(GLOB libs "${root}/lib/lib*.so.*")
  foreach(lib IN LISTS libs)
    get_filename_component(name "${lib}" NAME)
    string(REGEX REPLACE "\\.so\\..*" ".so" link "${root}/lib/${name}")
    if(NOT EXISTS "${link}")
      file(CREATE_LINK "${name}" "${link}" SYMBOLIC)
    endif()
  endforeach()
  message(STATUS "lamp: using pip's CUDA toolkit in ${root}")
  set(CUDA_TOOLKIT_ROOT_DIR "${root}" CACHE PATH "CUDA toolkit (pip's)")
  set(CUDAToolkit_ROOT "${root}" CACHE PATH "CUDA toolkit (pip's)")
  set(CMAKE_CUDA_COMPILER "${root}/bin/nvcc" CACHE FILEPATH "nvcc (pip's)")
endfunction()

set(_lamp_wrong_version_help
  "lamp needs LibTorch ${LAMP_TORCH_PIN} (2.11.x). Point the build at one with "
  "-DTorch_DIR=<libtorch>/share/cmake/Torch, or -DPython3_EXECUTABLE=<python "
  "with torch 2.11>, or pass -DLAMP_TORCH_VENV=ON to let lamp install PyPI "
  "torch==${LAMP_TORCH_PIN} into ${LAMP_VENV_DIR}.")

set(LAMP_PYTHON "")
set(LAMP_TORCH_SOURCE "")

if(DEFINED CACHE{_LAMP_AUTO_TORCH_DIR} AND Torch_DIR STREQUAL _LAMP_AUTO_TORCH_DIR)
  # A previous configure chose this LibTorch (step 2 or 3): reuse its choice.
  find_package(Torch REQUIRED CONFIG)
  set(LAMP_TORCH_SOURCE "${_LAMP_AUTO_TORCH_SOURCE}")
  set(LAMP_PYTHON "${_LAMP_AUTO_PYTHON}")
elseif(TARGET torch AND NOT LAMP_TORCH_VENV)
  set(LAMP_TORCH_SOURCE "the parent project")
elseif(NOT LAMP_TORCH_VENV)
  find_package(Torch CONFIG QUIET)
  if(Torch_FOUND)
    set(LAMP_TORCH_SOURCE "Torch_DIR/CMAKE_PREFIX_PATH (${Torch_DIR})")
  endif()
endif()

if(NOT LAMP_TORCH_SOURCE AND NOT LAMP_TORCH_VENV AND Python3_Interpreter_FOUND)
  _lamp_python_torch("${Python3_EXECUTABLE}" _version _prefix)
  if(_version)
    if(NOT _version MATCHES "^2\\.11\\.")
      message(FATAL_ERROR
        "lamp: ${Python3_EXECUTABLE} has torch ${_version}. "
        ${_lamp_wrong_version_help})
    endif()
    set(Torch_DIR "${_prefix}/Torch" CACHE PATH "LibTorch CMake config" FORCE)
    find_package(Torch REQUIRED CONFIG)
    set(LAMP_TORCH_SOURCE "the torch of ${Python3_EXECUTABLE}")
    set(LAMP_PYTHON "${Python3_EXECUTABLE}")
  endif()
endif()

if(NOT LAMP_TORCH_SOURCE AND NOT PROJECT_IS_TOP_LEVEL)
  # NOTE: a project that adds lamp (add_subdirectory, FetchContent) owns its
  # environment: lamp creates no venv and installs nothing into it.
  message(FATAL_ERROR
    "lamp: no LibTorch ${LAMP_TORCH_PIN} found. lamp installs one into a "
    "virtual environment only when it is the top-level project; here, point "
    "the build at yours with -DTorch_DIR=<libtorch>/share/cmake/Torch (or "
    "CMAKE_PREFIX_PATH), or find_package(Torch) before adding lamp.")
endif()

if(NOT LAMP_TORCH_SOURCE)
  if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR
      "lamp: no LibTorch found and no python3 to install one. Install python3 "
      "(with venv and pip), or pass -DTorch_DIR=<libtorch>/share/cmake/Torch.")
  endif()
  set(_venv_python "${LAMP_VENV_DIR}/bin/python")
  if(EXISTS "${_venv_python}")
    _lamp_python_torch("${_venv_python}" _version _prefix)
  else()
    set(_version "")
  endif()
  if(NOT _version STREQUAL LAMP_TORCH_PIN)
    message(STATUS "lamp: installing PyPI torch==${LAMP_TORCH_PIN} into "
                   "${LAMP_VENV_DIR} (once; a few GB)")
    if(NOT EXISTS "${_venv_python}")
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -m venv "${LAMP_VENV_DIR}"
        RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR
          "lamp: `${Python3_EXECUTABLE} -m venv ${LAMP_VENV_DIR}` failed. On "
          "Debian/Ubuntu install python3-venv (apt-get install python3-venv).")
      endif()
    endif()
    execute_process(
      COMMAND "${_venv_python}" -m pip install --disable-pip-version-check
              --progress-bar off "torch==${LAMP_TORCH_PIN}"
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR
        "lamp: pip could not install torch==${LAMP_TORCH_PIN} into "
        "${LAMP_VENV_DIR}. Check network access to PyPI, or pass "
        "-DTorch_DIR=<libtorch>/share/cmake/Torch.")
    endif()
    _lamp_python_torch("${_venv_python}" _version _prefix)
  endif()
  # The tests compare lamp's ResNet-50 with torchvision's.
  execute_process(
    COMMAND "${_venv_python}" -c "import torchvision"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(STATUS "lamp: installing PyPI torchvision==${LAMP_TORCHVISION_PIN} "
                   "into ${LAMP_VENV_DIR} (test oracle)")
    execute_process(
      COMMAND "${_venv_python}" -m pip install --disable-pip-version-check
              --progress-bar off "torch==${LAMP_TORCH_PIN}"
              "torchvision==${LAMP_TORCHVISION_PIN}"
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(WARNING "lamp: could not install torchvision; the ResNet-50 "
                      "comparison test will be skipped")
    endif()
  endif()
  # tools/plot_metrics.py draws the examples' --metrics files.
  execute_process(
    COMMAND "${_venv_python}" -c "import matplotlib"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(STATUS "lamp: installing PyPI matplotlib==${LAMP_MATPLOTLIB_PIN} "
                   "into ${LAMP_VENV_DIR} (tools/plot_metrics.py)")
    execute_process(
      COMMAND "${_venv_python}" -m pip install --disable-pip-version-check
              --progress-bar off "matplotlib==${LAMP_MATPLOTLIB_PIN}"
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(WARNING "lamp: could not install matplotlib; "
                      "tools/plot_metrics.py and its test will be skipped")
    endif()
  endif()
  # cudnn-frontend's headers (lamp's cuDNN graph code) beside a CUDA torch:
  # headers only, so without the package's Python dependencies.
  get_filename_component(_site "${_prefix}/../../.." ABSOLUTE)
  execute_process(
    COMMAND "${_venv_python}" -c
      "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0 AND NOT EXISTS "${_site}/include/cudnn_frontend.h")
    message(STATUS "lamp: installing PyPI nvidia-cudnn-frontend=="
                   "${LAMP_CUDNN_FRONTEND_PIN} (headers) into ${LAMP_VENV_DIR}")
    execute_process(
      COMMAND "${_venv_python}" -m pip install --disable-pip-version-check
              --progress-bar off --no-deps
              "nvidia-cudnn-frontend==${LAMP_CUDNN_FRONTEND_PIN}"
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(WARNING "lamp: could not install nvidia-cudnn-frontend; lamp's "
                      "cuDNN graph code will not be built")
    endif()
  endif()
  _lamp_cuda_toolkit_from_pip("${_venv_python}" "${_prefix}")
  set(Torch_DIR "${_prefix}/Torch" CACHE PATH "LibTorch CMake config" FORCE)
  find_package(Torch REQUIRED CONFIG)
  set(LAMP_TORCH_SOURCE "the project venv ${LAMP_VENV_DIR}")
  set(LAMP_PYTHON "${_venv_python}")
endif()

if(NOT Torch_VERSION MATCHES "^2\\.11\\.")
  message(FATAL_ERROR
    "lamp: found LibTorch ${Torch_VERSION} through ${LAMP_TORCH_SOURCE}. "
    ${_lamp_wrong_version_help})
endif()

# The tests compare against Python torch: when the LibTorch came from the user,
# use python3 if its torch is the same version.
if(NOT LAMP_PYTHON AND Python3_Interpreter_FOUND)
  _lamp_python_torch("${Python3_EXECUTABLE}" _version _prefix)
  if(_version STREQUAL Torch_VERSION)
    set(LAMP_PYTHON "${Python3_EXECUTABLE}")
  endif()
endif()

if(LAMP_PYTHON)
  set(_LAMP_AUTO_TORCH_DIR "${Torch_DIR}" CACHE INTERNAL "")
  set(_LAMP_AUTO_TORCH_SOURCE "${LAMP_TORCH_SOURCE}" CACHE INTERNAL "")
  set(_LAMP_AUTO_PYTHON "${LAMP_PYTHON}" CACHE INTERNAL "")
endif()

message(STATUS "lamp: using LibTorch ${Torch_VERSION} from ${LAMP_TORCH_SOURCE}")
if(LAMP_PYTHON)
  message(STATUS "lamp: Python oracle for tests: ${LAMP_PYTHON}")
else()
  message(STATUS "lamp: no python with torch ${Torch_VERSION}; tests that "
                 "compare against PyTorch will be skipped")
endif()
