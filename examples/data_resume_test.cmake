# CTest script: resnet50_amp --data on a generated ImageFolder, interrupted
# and resumed from its checkpoint in the middle of an epoch, logs the same
# steps and validation accuracies as the uninterrupted run (the loader's
# position travels in the checkpoint).
#
#   cmake -DPYTHON=<python with Pillow> -DORACLE=<tests/data/image_oracle.py>
#         -DDATA=<folder> -DPROGRAM=... -DARGS=... -DWORK=... -DEVERY=...
#         -DSTOP=... -P data_resume_test.cmake

if(NOT PYTHON)
  message("SKIP: no python to generate the images (see README, Build)")
  return()
endif()
file(REMOVE_RECURSE "${DATA}")
function(make_folder split per_class seed)
  execute_process(
    COMMAND "${PYTHON}" "${ORACLE}" folder "${DATA}/${split}" 3 ${per_class}
            48 ${seed}
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generating ${DATA}/${split} failed: ${err}")
  endif()
endfunction()
make_folder(train 8 0)
make_folder(val 4 1)
list(APPEND ARGS --data "${DATA}")
include("${CMAKE_CURRENT_LIST_DIR}/resume_test.cmake")
