# CTest script: a flag that must not change what a run computes (e.g.
# --activation-checkpointing) leaves every logged step as it was.
#
#   cmake -DPROGRAM=<example> -DARGS="<flags;...>" -DEXTRA="<flags;...>"
#         -DWORK=<folder> -P same_metrics_test.cmake
#
# Runs PROGRAM with ARGS, then with ARGS and EXTRA; the step lines of their
# --metrics (timings removed) must be equal, loss for loss, bit for bit.

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run_and_read name out)
  execute_process(
    COMMAND "${PROGRAM}" ${ARGS} --metrics "${WORK}/${name}.jsonl" ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  message(STATUS "${name}:\n${stdout}${stderr}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the ${name} run failed (${rc})")
  endif()
  file(STRINGS "${WORK}/${name}.jsonl" lines REGEX "\"kind\": \"step\"")
  set(kept)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ", \"(step_ms|tokens_per_s|images_per_s)\": [^,}]*" "" line "${line}")
    list(APPEND kept "${line}")
  endforeach()
  set(${out} "${kept}" PARENT_SCOPE)
endfunction()

run_and_read(plain plain)
run_and_read(with with ${EXTRA})
list(LENGTH plain n)
if(n EQUAL 0)
  message(FATAL_ERROR "the runs logged no steps")
endif()
if(NOT plain STREQUAL with)
  string(REPLACE ";" "\n  " plain "${plain}")
  string(REPLACE ";" "\n  " with "${with}")
  message(FATAL_ERROR "${EXTRA} changed the steps:\nwithout:\n  ${plain}\nwith:\n  ${with}")
endif()
message(STATUS "${n} steps, equal with and without ${EXTRA}")
