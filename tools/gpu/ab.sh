# Sourced by tools/gpu/fused_tail_ab.sh, resnet50_vs_pytorch.sh and
# s2d_stem_ab.sh, after `set -u`, with OUT set: the logs'
# folder L, `say`, the libraries of .deps/ on the path, lamp built into
# build-gpu (tools/gpu/build.sh; the script ends if that fails), R
# the example, and `ab LABEL FLAGS...`: resnet50_amp graphed on CUDA,
# channels-last, STEPS (60) timed steps, metrics in $L/ab_LABEL.jsonl,
# printing the median step and the peak memory.
L=$OUT/l
mkdir -p "$L"
T0=$(date +%s)
say() { echo "[$(basename "$0" .sh) $(($(date +%s) - T0))s] $*"; }
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
OUT=$L bash tools/gpu/build.sh || { tar czf "$OUT/logs.tgz" -C "$OUT" l; exit 1; }
B=build-gpu
R=$B/examples/resnet50_amp

ab() { # label, then resnet50_amp's flags
  local label=$1
  shift
  timeout 120 $R --device cuda --channels-last --cuda-graph --steps "${STEPS:-60}" --warmup 10 \
    "$@" --metrics "$L/ab_$label.jsonl" > "$L/ab_$label.log" 2>&1
  echo "$label exit $? $(grep -o '"median_step_ms": [0-9.]*' "$L/ab_$label.jsonl" | tail -1)" \
    "$(grep -o '"peak_memory_bytes": [0-9]*' "$L/ab_$label.jsonl" | tail -1)"
}
