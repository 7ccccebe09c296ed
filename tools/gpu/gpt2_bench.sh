#!/usr/bin/env bash
# A GPT-2 training step, lamp against PyTorch, on one GPU in one call:
# lamp's examples/gpt_amp (bf16 or PRECISION, the whole step in a CUDA graph), then its
# Python twin benchmarks/gpt2.py in eager mode and under torch.compile (modes
# default and max-autotune-no-cudagraphs), each with the same model, batch,
# sequence length and steps after 10 untimed warm-up steps (where
# torch.compile compiles), then a table of their summary lines.
#
# Run from the repository root, with lamp built in build-gpu/
# (cmake --build build-gpu --target gpt_amp):
#   OUT=<dir> tools/gpu/gpt2_bench.sh
#   MODEL=gpt2-medium BATCH=8 SKIP=pytorch-compile-max-autotune-no-cudagraphs \
#     OUT=<dir> tools/gpu/gpt2_bench.sh
# Env: OUT (required), MODEL (gpt2), BATCH (16), SEQ (1024), STEPS (50, timed),
# DATA (a token file for every run; default: random tokens), TRACE (set: lamp's
# graphed run and the Python runs write $OUT/<run>_trace.json, 3 steps each),
# SKIP (runs to leave out, by name, separated by spaces or commas: lamp,
# lamp-eager, pytorch-eager, pytorch-compile-default,
# pytorch-compile-max-autotune-no-cudagraphs), TIMEOUT (seconds for each run;
# 0, the default, is no limit), LAMP_ARGS and PY_ARGS (more flags for one
# side, e.g. PY_ARGS="--checkpointing"), PRECISION (bf16, or fp8: lamp's
# FP8 GEMMs against torchao's float8 training, whose wheel tools/gpu/deps.sh
# puts in .deps/wheels; add LAMP_ARGS="--fp8-scaling delayed" or
# PY_ARGS="--fp8-recipe rowwise" for the other recipes). Compiling gpt2 with
# max-autotune-no-cudagraphs takes minutes (it benchmarks GEMM kernels).
# Writes to $OUT, for each run: <run>.log (its output), <run>.jsonl (its
# metrics). A run that fails is reported and the others still run; the script
# then exits 1. In the table, "vs compile" is tokens/s over torch.compile
# default's (above 1: faster).
set -euo pipefail
OUT=${OUT:?set OUT to the folder for the logs and metrics}
MODEL=${MODEL:-gpt2}
BATCH=${BATCH:-16}
SEQ=${SEQ:-1024}
STEPS=${STEPS:-50}
PRECISION=${PRECISION:-bf16}
SKIP=" ${SKIP:-} "
SKIP=${SKIP//,/ }
TIMEOUT=${TIMEOUT:-0}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[gpt2_bench $(($(date +%s) - T0))s] $*"; }
# The libraries of .deps/, when lamp was built against them.
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

# torchao for the Python side of PRECISION=fp8: its wheel unpacked (a wheel
# is a zip; the host has no network to install from).
if [[ $PRECISION == fp8 ]]; then
  for AO in .deps/wheels/torchao-*.whl; do
    [[ -e $AO ]] || break
    python3 -m zipfile -e "$AO" /tmp/lamp-torchao
    export PYTHONPATH="/tmp/lamp-torchao${PYTHONPATH:+:$PYTHONPATH}"
    break
  done
fi

RUNS=(lamp lamp-eager pytorch-eager pytorch-compile-default pytorch-compile-max-autotune-no-cudagraphs)
DATA_ARGS=()
[[ -n ${DATA:-} ]] && DATA_ARGS=(--data "$DATA")
FAILED=()

# run NAME COMMAND...: runs it unless SKIP names it, its output to the
# terminal and to $OUT/NAME.log.
run() {
  local name=$1
  shift
  if [[ $SKIP == *" $name "* ]]; then
    say "$name: skipped (SKIP)"
    return
  fi
  say "$name: $*"
  rm -f "$OUT/$name.jsonl"
  if ! timeout "$TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.log"; then
    say "$name: failed (exit ${PIPESTATUS[0]}), see $OUT/$name.log"
    FAILED+=("$name")
  fi
}

nvidia-smi -L 2> /dev/null || true
LAMP=build-gpu/examples/gpt_amp
if [[ -x $LAMP || $SKIP == *" lamp "* ]]; then
  # shellcheck disable=SC2086 # LAMP_ARGS and PY_ARGS are lists of flags
  run lamp "$LAMP" --model "$MODEL" --batch-size "$BATCH" --seq-len "$SEQ" \
    --precision "$PRECISION" --cuda-graph --steps "$STEPS" --warmup 10 "${DATA_ARGS[@]}" \
    --metrics "$OUT/lamp.jsonl" ${TRACE:+--trace "$OUT/lamp_trace.json"} ${LAMP_ARGS:-}
  # shellcheck disable=SC2086
  run lamp-eager "$LAMP" --model "$MODEL" --batch-size "$BATCH" --seq-len "$SEQ" \
    --precision "$PRECISION" --steps "$STEPS" --warmup 10 "${DATA_ARGS[@]}" \
    --metrics "$OUT/lamp-eager.jsonl" ${LAMP_ARGS:-}
else
  say "lamp: $LAMP is missing; build it first (cmake --build build-gpu --target gpt_amp)"
  FAILED+=(lamp)
fi
for mode in none default max-autotune-no-cudagraphs; do
  name=pytorch-compile-$mode
  [[ $mode == none ]] && name=pytorch-eager
  # shellcheck disable=SC2086
  run "$name" python3 benchmarks/gpt2.py --model "$MODEL" --batch-size "$BATCH" \
    --seq-len "$SEQ" --precision "$PRECISION" --compile "$mode" --device cuda \
    --steps "$STEPS" --warmup 10 "${DATA_ARGS[@]}" --metrics "$OUT/$name.jsonl" \
    ${TRACE:+--trace "$OUT/${name}_trace.json"} ${PY_ARGS:-}
done

say "summary: $MODEL, batch $BATCH, sequence $SEQ, $PRECISION, median of $STEPS steps"
python3 - "$OUT" "${RUNS[@]}" << 'EOF'
import json, os, sys

out, names = sys.argv[1], sys.argv[2:]


def summary(name):
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if r.get("kind") == "summary"]
    if not rows:
        return None
    r = rows[-1]
    # NOTE: tolerates the names lamp's other examples use for the same figures.
    ms = r.get("ms_per_step", r.get("median_step_ms"))
    gib = r.get("peak_memory_gib")
    if gib is None and r.get("peak_memory_bytes") is not None:
        gib = r["peak_memory_bytes"] / 2**30
    tps = r.get("tokens_per_s")
    if tps is None and ms and r.get("batch_size") and r.get("seq_len"):
        tps = r["batch_size"] * r["seq_len"] / (ms / 1e3)
    return ms, tps, gib


results = {n: summary(n) for n in names}
base = results.get("pytorch-compile-default")
base_tps = base[1] if base else None
fmt = "{:<44} {:>9} {:>12} {:>9} {:>11}"
print(fmt.format("impl", "ms/step", "tokens/s", "peak GiB", "vs compile"))
for name, r in results.items():
    if r is None:
        print(fmt.format(name, "-", "-", "-", "-"))
        continue
    ms, tps, gib = r
    print(fmt.format(
        name, f"{ms:.2f}" if ms else "-", f"{tps:,.0f}" if tps else "-",
        f"{gib:.2f}" if gib is not None else "-",
        f"{tps / base_tps:.2f}x" if tps and base_tps else "-"))
EOF
if ((${#FAILED[@]})); then
  say "failed: ${FAILED[*]}"
  exit 1
fi
say "done"
