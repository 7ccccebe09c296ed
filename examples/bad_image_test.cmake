# CTest script: resnet50_amp --data on a generated ImageFolder holding one
# truncated JPEG. Without --skip-bad-images the run ends with exit status 1
# and one line naming the file and the flag that would skip it (no abort, no
# backtrace); with it, the run ends normally and says it skipped one training
# image, and which.
#
#   cmake -DPYTHON=<python with Pillow> -DORACLE=<tests/data/image_oracle.py>
#         -DDATA=<folder> -DPROGRAM=... -DARGS=... -P bad_image_test.cmake

if(NOT PYTHON)
  message("SKIP: no python to generate the images (see README, Build)")
  return()
endif()
file(REMOVE_RECURSE "${DATA}")
foreach(split train val)
  execute_process(
    COMMAND "${PYTHON}" "${ORACLE}" folder "${DATA}/${split}" 2 6 40 4
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generating ${DATA}/${split} failed: ${err}")
  endif()
endforeach()
set(bad "${DATA}/train/class_01/img_0003.jpg")
execute_process(
  COMMAND "${PYTHON}" -c
    "import sys; d = open(sys.argv[1], 'rb').read(); open(sys.argv[1], 'wb').write(d[:len(d) // 2])"
    "${bad}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not truncate ${bad}")
endif()
list(APPEND ARGS --data "${DATA}")

execute_process(COMMAND "${PROGRAM}" ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "expected exit status 1, got '${rc}'\n${out}\n${err}")
endif()
string(STRIP "${err}" err_line)
string(FIND "${err_line}" "\n" newline)
if(NOT newline EQUAL -1 OR NOT err_line MATCHES "^resnet50_amp: .*img_0003\\.jpg")
  message(FATAL_ERROR "expected one line naming the file, got:\n${err}")
endif()
# The hint names the example's flag, not the library's option.
if(NOT err_line MATCHES "--skip-bad-images" OR err_line MATCHES "skip_bad_images")
  message(FATAL_ERROR "expected a hint naming --skip-bad-images, got:\n${err}")
endif()
if(err MATCHES "terminate called|Exception raised from|Traceback")
  message(FATAL_ERROR "an abort or a backtrace:\n${err}")
endif()
message(STATUS "without --skip-bad-images: ${err_line}")

execute_process(COMMAND "${PROGRAM}" ${ARGS} --skip-bad-images
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--skip-bad-images: exit status ${rc}\n${out}\n${err}")
endif()
if(NOT out MATCHES "skipped: 1 training, 0 validation: [^\n]*img_0003\\.jpg")
  message(FATAL_ERROR "--skip-bad-images: no count of 1 skipped image and "
                      "its path:\n${out}")
endif()
