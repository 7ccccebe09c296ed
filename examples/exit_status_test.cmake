# CTest script: a run that must end with a given exit status and message.
#
#   cmake -DPROGRAM=<example> -DARGS="<flags;...>" -DEXPECT_RC=<status>
#         -DEXPECT=<regex> [-DSKIP_IF=<regex>] -P exit_status_test.cmake
#
# Passes when PROGRAM ARGS exits with EXPECT_RC and its output matches
# EXPECT; prints "SKIP: ..." (for SKIP_REGULAR_EXPRESSION) when the output
# matches SKIP_IF instead (e.g. the run could train here after all).

execute_process(COMMAND "${PROGRAM}" ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message(STATUS "exit ${rc}:\n${out}${err}")
if(DEFINED SKIP_IF AND "${out}${err}" MATCHES "${SKIP_IF}")
  message(STATUS "SKIP: the output matches '${SKIP_IF}'")
  return()
endif()
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
