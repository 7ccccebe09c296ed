# CTest script: an example started by a launcher as a user starts it, on
# the CPU (two processes over Gloo).
#
#   cmake -DLAUNCHER=torchrun|mpirun -DPYTHON=<python with torch>
#         -DPROGRAM=<example> -DARGS="<flags;...>" -DEXPECT=<regex>
#         -P launch_test.cmake
#
# torchrun: `python -m torch.distributed.run --standalone --nproc_per_node 2
# --no-python PROGRAM ARGS`. mpirun: Open MPI's, with MASTER_ADDR and a free
# MASTER_PORT exported to both ranks (lamp reads the ranks from Open MPI's
# variables). Passes when the launch exits 0 and its output matches EXPECT.

if(LAUNCHER STREQUAL "torchrun")
  set(command "${PYTHON}" -m torch.distributed.run --standalone
    --nproc_per_node 2 --no-python "${PROGRAM}" ${ARGS})
elseif(LAUNCHER STREQUAL "mpirun")
  find_program(MPIRUN mpirun)
  if(NOT MPIRUN)
    message(STATUS "SKIP: no mpirun (Debian: openmpi-bin)")
    return()
  endif()
  execute_process(
    COMMAND "${PYTHON}" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    OUTPUT_VARIABLE port OUTPUT_STRIP_TRAILING_WHITESPACE)
  # NOTE: --oversubscribe: a 2-core CI machine may count fewer slots;
  # --allow-run-as-root: CI runs as root.
  set(command "${MPIRUN}" -np 2 --oversubscribe --allow-run-as-root
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=${port} "${PROGRAM}" ${ARGS})
else()
  message(FATAL_ERROR "LAUNCHER must be torchrun or mpirun")
endif()
execute_process(COMMAND ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${LAUNCHER} exited with ${rc}")
endif()
if(NOT "${out}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
