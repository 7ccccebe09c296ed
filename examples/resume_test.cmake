# CTest script: a run interrupted and resumed from its checkpoint logs the
# same steps as the uninterrupted run.
#
#   cmake -DPROGRAM=<example> -DARGS="<flags;...>" -DWORK=<folder>
#         -DEVERY=<checkpoint every> -DSTOP=<stop after> -P resume_test.cmake
#
# Runs PROGRAM three times: the whole run; the run stopped after STOP steps
# with a checkpoint every EVERY steps; the run resumed from the newest
# checkpoint. Every step and epoch line the resumed run writes to --metrics
# (timings and the loader's decode counts removed) must be in the whole run's
# metrics, and it must write some. A fourth run, resumed from the finished
# run's checkpoint, must say the run is finished and exit 0.

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run_example name)
  execute_process(
    COMMAND "${PROGRAM}" ${ARGS} --metrics "${WORK}/${name}.jsonl" ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${name}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} run failed (${rc})")
  endif()
endfunction()

# The JSON lines of a metrics file, without summaries and timings.
function(read_metrics name out)
  file(STRINGS "${WORK}/${name}.jsonl" lines)
  set(kept)
  foreach(line IN LISTS lines)
    if(line MATCHES "\"kind\": \"summary\"")
      continue()
    endif()
    string(REGEX REPLACE ", \"(step_ms|images_per_s|tokens_per_s|gpu_decoded|cpu_decoded)\": [^,}]*" "" line "${line}")
    list(APPEND kept "${line}")
  endforeach()
  set(${out} "${kept}" PARENT_SCOPE)
endfunction()

run_example(whole)
run_example(stopped --checkpoint-dir "${WORK}/ckpt" --checkpoint-every ${EVERY}
                    --stop-after ${STOP})
run_example(resumed --checkpoint-dir "${WORK}/ckpt" --resume)

# The first of `lines` that `whole` lacks, or "".
function(first_missing lines whole out)
  set(${out} "" PARENT_SCOPE)
  foreach(line IN LISTS lines)
    list(FIND whole "${line}" at)
    if(at EQUAL -1)
      set(${out} "${line}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

read_metrics(whole whole)
read_metrics(resumed resumed)
list(LENGTH resumed n)
if(n EQUAL 0)
  message(FATAL_ERROR "the resumed run logged no steps")
endif()
first_missing("${resumed}" "${whole}" missing)
# NOTE: a mismatch is the resume's fault only if the uninterrupted run
# reproduces itself. Once (CI, 2026-12-07, the FP8 run on a loaded 2-core
# machine) an uninterrupted run logged another step-1 loss, in the 6th
# digit, than every run before and since; the first step's forward reads
# no state lamp saves, and neither thread counts, malloc's leftovers, the
# CPU's ISA nor load made it again. So a mismatch runs the uninterrupted
# run again: if the two agree, the resume is wrong; if they differ, this
# machine's runs are not bitwise reproducible, and the resumed run must
# equal the second one bit for bit.
if(NOT missing STREQUAL "")
  run_example(whole-again)
  read_metrics(whole-again again)
  if(NOT "${again}" STREQUAL "${whole}")
    message(WARNING "the uninterrupted run did not reproduce itself on this "
                    "machine:\n  first:  ${whole}\n  second: ${again}\n"
                    "the resumed run is checked against the second")
    set(whole "${again}")
    first_missing("${resumed}" "${whole}" missing)
  endif()
endif()
if(NOT missing STREQUAL "")
  message(FATAL_ERROR "the resumed run logged a line the whole run did not:\n"
                      "  ${missing}\nwhole run:\n  ${whole}")
endif()
message(STATUS "resumed run: ${n} metrics lines, all equal to the whole run's")

# Resumed again, the run has nothing left: one line saying so, status 0, no
# table of results (it printed "nan" for what it never measured).
execute_process(
  COMMAND "${PROGRAM}" ${ARGS} --checkpoint-dir "${WORK}/ckpt" --resume
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "finished, resumed:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "already finished" OR
   out MATCHES "(^|[^a-z])nan([^a-z]|$)")
  message(FATAL_ERROR "resuming a finished run: want status 0 and \"already "
                      "finished\", got status ${rc}")
endif()
# Passed: the checkpoints go (ResNet-50's are ~300 MB each, and CI machines'
# disks are small); the metrics stay to be read.
file(REMOVE_RECURSE "${WORK}/ckpt")
