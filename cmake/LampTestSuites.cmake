# Note [a ctest test per gtest suite]
# lamp_tests' ctest tests, made when ctest starts (tests/CMakeLists.txt
# adds the file that sets the variables below and includes this one to the
# directory's TEST_INCLUDE_FILES), from `lamp_tests --gtest_list_tests`.
#
# One ctest test a gtest *suite* (`--gtest_filter=Suite.*`), not a test:
# each process loads LibTorch first (~0.4 s alone, ~0.8 s on a busy 2-core
# CI machine), and with 500 tests that start-up was a third of the suite's
# time. Suites whose tests start processes of their own and take seconds
# each (LAMP_TESTS_EACH: DDP, the rendezvous) keep a ctest test a gtest
# test, so that ctest -j spreads them over the cores.
#
# Labels by suite name: *MultiGpu multi_gpu, *Gpu gpu, the rest cpu. A
# suite whose every test skipped (GTEST_SKIP without the hardware) is
# reported as skipped through the line tests/all_skipped_listener.cpp
# prints; one that also passed or failed a test is not.
#
# Variables: LAMP_TESTS_EXE, LAMP_TESTS_DIR (working directory),
# LAMP_TESTS_LIST (the listing, kept until the executable changes),
# LAMP_TESTS_EACH (regex of suites with a ctest test a test),
# LAMP_TESTS_ENV_MOD (ENVIRONMENT_MODIFICATION), LAMP_TESTS_ORACLE_SOCKET
# (the Python oracle's socket; empty without one).

if(NOT EXISTS "${LAMP_TESTS_EXE}")
  # Fails, naming what is missing (as GoogleTest's discovery does).
  add_test(lamp_tests_NOT_BUILT "${LAMP_TESTS_EXE}")
  return()
endif()

if(NOT EXISTS "${LAMP_TESTS_LIST}" OR
   "${LAMP_TESTS_EXE}" IS_NEWER_THAN "${LAMP_TESTS_LIST}")
  # NOTE: listing loads LibTorch: seconds on a busy machine.
  execute_process(
    COMMAND "${LAMP_TESTS_EXE}" --gtest_list_tests
    WORKING_DIRECTORY "${LAMP_TESTS_DIR}"
    OUTPUT_VARIABLE _listing
    ERROR_VARIABLE _errors
    RESULT_VARIABLE _result
    TIMEOUT 120)
  if(NOT _result EQUAL 0)
    message(WARNING "lamp_tests --gtest_list_tests failed (${_result}): "
      "${_errors}")
    add_test(lamp_tests_NOT_LISTED "${LAMP_TESTS_EXE}" --gtest_list_tests)
    return()
  endif()
  file(WRITE "${LAMP_TESTS_LIST}" "${_listing}")
else()
  file(READ "${LAMP_TESTS_LIST}" _listing)
endif()

# Suite lines ("Suite." or "Prefix/Suite.  # TypeParam = ...") and test
# lines ("  Test" or "  Test/0  # GetParam() = ..."); a parameter's
# printout may hold semicolons, CMake's list separator.
string(REPLACE ";" "," _listing "${_listing}")
string(REPLACE "\n" ";" _lines "${_listing}")
set(_suites)
set(_suite)
foreach(_line IN LISTS _lines)
  if(_line MATCHES "^([^ #]+)\\.( .*)?$")
    set(_suite "${CMAKE_MATCH_1}")
    list(APPEND _suites "${_suite}")
    set(_tests_${_suite})
  elseif(_line MATCHES "^  ([^ ]+)" AND _suite)
    list(APPEND "_tests_${_suite}" "${CMAKE_MATCH_1}")
  endif()
endforeach()

function(_lamp_test name filter label)
  add_test("${name}" "${LAMP_TESTS_EXE}" "--gtest_filter=${filter}")
  set(_properties
    LABELS "${label}"
    WORKING_DIRECTORY "${LAMP_TESTS_DIR}"
    SKIP_REGULAR_EXPRESSION "lamp_tests: every test of this run was skipped")
  if(LAMP_TESTS_ORACLE_SOCKET)
    list(APPEND _properties
      FIXTURES_REQUIRED python_oracle
      ENVIRONMENT "LAMP_ORACLE_SOCKET=${LAMP_TESTS_ORACLE_SOCKET}")
  endif()
  if(label STREQUAL "multi_gpu")
    list(APPEND _properties TIMEOUT 300)
  endif()
  set_tests_properties("${name}" PROPERTIES ${_properties})
  # NOTE: apart: the value may be a list (semicolons).
  set_tests_properties("${name}" PROPERTIES
    ENVIRONMENT_MODIFICATION "${LAMP_TESTS_ENV_MOD}")
endfunction()

foreach(_suite IN LISTS _suites)
  if(_suite MATCHES "MultiGpu$")
    set(_label multi_gpu)
  elseif(_suite MATCHES "Gpu$")
    set(_label gpu)
  else()
    set(_label cpu)
  endif()
  if(_suite MATCHES "${LAMP_TESTS_EACH}")
    foreach(_test IN LISTS "_tests_${_suite}")
      _lamp_test("${_suite}.${_test}" "${_suite}.${_test}" "${_label}")
    endforeach()
  else()
    _lamp_test("${_suite}" "${_suite}.*" "${_label}")
  endif()
endforeach()
