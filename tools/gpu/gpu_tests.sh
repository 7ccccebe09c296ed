#!/usr/bin/env bash
# On a one-GPU host: builds lamp into build-gpu (tools/gpu/build.sh),
# runs the `gpu` label (Fashion-MNIST linked from .deps), then the suites
# named in SUITES under compute-sanitizer's memcheck; with MULTI=1 (a host of
# two or more GPUs), then the `multi_gpu` label one test at a time (DDP over
# NCCL, the FP8 amax reduction); MULTI=only runs that label alone (a call
# has 10 minutes). Writes $OUT/build.log, $OUT/ctest.log,
# $OUT/memcheck.log, $OUT/ctest_multi.log.
#   OUT=<dir> SUITES='ClipGradGpu.*:UnscaleClipGpu.*' tools/gpu/gpu_tests.sh
#   OUT=<dir> MULTI=1 tools/gpu/gpu_tests.sh
set -u
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
OUT=$OUT bash tools/gpu/build.sh || exit 1
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /usr/share/datasets
[ -e /usr/share/datasets/fashion-mnist ] ||
  ln -s "$PWD/.deps/usr/share/datasets/fashion-mnist" /usr/share/datasets/
if [ -n "${SUITES:-}" ]; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    build-gpu/tests/lamp_tests --gtest_filter="$SUITES" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/memcheck.log" | head -20
fi
if [ "${MULTI:-0}" != only ]; then
  timeout ${CTEST_TIMEOUT:-400} ctest --test-dir build-gpu -L gpu -LE multi_gpu -j3 \
    --timeout 180 > "$OUT/ctest.log" 2>&1
  echo "ctest exit $?"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run" "$OUT/ctest.log" | head -30
fi
if [ "${MULTI:-0}" != 0 ]; then
  nvidia-smi -L
  timeout ${MULTI_TIMEOUT:-500} ctest --test-dir build-gpu -L multi_gpu -j1 \
    --timeout 300 > "$OUT/ctest_multi.log" 2>&1
  echo "ctest multi_gpu exit $?"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|Skipped" \
    "$OUT/ctest_multi.log" | head -40
fi
