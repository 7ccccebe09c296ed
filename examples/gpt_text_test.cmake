# CTest script: tools/make_tokens.py turns the repository's own Markdown
# into byte tokens, and the tiny GPT learns them: its training loss ends
# under MAX_LOSS (from ln 256 = 5.55) and it reports a validation loss.
#
#   cmake -DPYTHON=<python> -DTOOL=<make_tokens.py> -DTEXT=<folder>
#         -DPROGRAM=<gpt_amp> -DWORK=<folder> -DMAX_LOSS=<x> -P gpt_text_test.cmake

if(NOT PYTHON)
  message("SKIP: no Python to run tools/make_tokens.py")
  return()
endif()
file(REMOVE_RECURSE "${WORK}")
file(GLOB text "${TEXT}/*.md")
execute_process(
  COMMAND "${PYTHON}" "${TOOL}" ${text} --out-dir "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "make_tokens.py:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_tokens.py failed (${rc})")
endif()
execute_process(
  COMMAND "${PROGRAM}" --model tiny --device cpu --data "${WORK}/train.bin"
          --val-data "${WORK}/val.bin" --steps 200 --warmup 0 --batch-size 8
          --lr 2e-3 --log-every 50 --max-loss ${MAX_LOSS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "gpt_amp:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpt_amp failed (${rc})")
endif()
if(NOT out MATCHES "validation loss [0-9.]+")
  message(FATAL_ERROR "gpt_amp reported no validation loss")
endif()
