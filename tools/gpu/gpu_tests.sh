#!/usr/bin/env bash
# On a one-GPU host: builds lamp into build-gpu (tools/gpu/build.sh),
# runs the `gpu` label (Fashion-MNIST linked from .deps), then the suites
# named in SUITES under compute-sanitizer's memcheck. Writes $OUT/build.log,
# $OUT/ctest.log, $OUT/memcheck.log.
#   OUT=<dir> SUITES='ClipGradGpu.*:UnscaleClipGpu.*' tools/gpu/gpu_tests.sh
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
timeout ${CTEST_TIMEOUT:-400} ctest --test-dir build-gpu -L gpu -LE multi_gpu -j3 \
  --timeout 180 > "$OUT/ctest.log" 2>&1
echo "ctest exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run" "$OUT/ctest.log" | head -30
