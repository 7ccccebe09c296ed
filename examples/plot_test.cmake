# CTest script: tools/plot_metrics.py draws a real run's --metrics file.
#
#   cmake -DPYTHON=<venv python> -DPROGRAM=<example> -DARGS="<flags;...>"
#         -DTOOL=<plot_metrics.py> -DWORK=<folder> -P plot_test.cmake
#
# Runs PROGRAM ARGS --metrics WORK/metrics.jsonl, then the tool with --out
# WORK; passes when it wrote at least one PNG.

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${PYTHON}" -c "import matplotlib" RESULT_VARIABLE rc
  OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(STATUS "SKIP: no matplotlib in ${PYTHON}")
  return()
endif()
execute_process(COMMAND "${PROGRAM}" ${ARGS} --metrics "${WORK}/metrics.jsonl"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the run failed (${rc}):\n${out}${err}")
endif()
execute_process(
  COMMAND "${PYTHON}" "${TOOL}" "${WORK}/metrics.jsonl" --out "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "plot_metrics.py failed (${rc})")
endif()
file(GLOB pngs "${WORK}/*.png")
if(NOT pngs)
  message(FATAL_ERROR "plot_metrics.py wrote no PNG into ${WORK}")
endif()
message(STATUS "wrote ${pngs}")
file(REMOVE_RECURSE "${WORK}")
