#!/usr/bin/env bash
# Builds lamp on a one-GPU host into build-gpu/ (Release, sm_90, nvJPEG,
# the libraries of .deps/), as the other scripts here expect it; prints
# lamp's configure summary, and on failure the errors, then exits 1.
#
# Run from the repository root:  OUT=<dir> [TARGETS="a b"] tools/gpu/build.sh
# TARGETS: build targets (default: everything). Needs .deps/
# (tools/gpu/deps.sh; pass carry [".deps"]). Writes $OUT/build.log.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
ROOT=$PWD
B=$ROOT/build-gpu
T0=$(date +%s)
say() { echo "[build $(($(date +%s) - T0))s] $*"; }
export LD_LIBRARY_PATH="$ROOT/.deps/usr/lib/x86_64-linux-gnu:$ROOT/.deps/lib/x86_64-linux-gnu:$ROOT/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

say "configure + build"
{
  nvidia-smi -L
  cmake -S . -B "$B" -G Ninja -DCMAKE_PREFIX_PATH="$ROOT/.deps/usr" \
    -DCMAKE_CXX_FLAGS="-isystem $ROOT/.deps/usr/include/x86_64-linux-gnu" \
    -DNVJPEG_ROOT="$ROOT/.deps/nvjpeg/nvidia/cu13" -DLAMP_WITH_NVJPEG=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build "$B" -j16 ${TARGETS:+--target $TARGETS}
} > "$OUT/build.log" 2>&1
status=$?
grep -E "lamp: " "$OUT/build.log"
if [ $status -ne 0 ]; then
  say "build failed"
  grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80
  exit 1
fi
