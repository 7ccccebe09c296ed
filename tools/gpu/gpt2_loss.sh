#!/usr/bin/env bash
# GPT-2 training loss, lamp against PyTorch from the same initial weights, on
# one GPU in one call (< 10 minutes): builds lamp's examples/gpt_amp
# (tools/gpu/build.sh), makes real-text BPE tokens
# (tools/gpu/gpt2_corpus.sh, MB=30), trains GPT-2 (124M) with lamp (bf16, the
# whole step in a CUDA graph), which writes its initial weights (--save-init),
# then its PyTorch twin benchmarks/gpt2.py (eager, bf16) from those weights
# (--init) with the same batch order and learning-rate schedule (linear
# warm-up of 100 steps, then cosine to 0, lr 6e-4). lamp also writes its
# validation loss every 500 steps. benchmarks/gpt2_loss_plot.py plots the two.
#
# Run from the repository root, with .deps/ present:
#   OUT=<dir> tools/gpu/gpt2_loss.sh
#   STEPS=500 OUT=<dir> tools/gpu/gpt2_loss.sh
# Env: OUT (required), STEPS (2000), DIR (token files, /tmp/tok), MB (30),
# TARGETS (build targets, gpt_amp; empty: everything), DEADLINE (seconds from
# the start by which both runs must end, 550: each run's timeout is cut to
# fit), SKIP_PYTORCH (set: lamp only, to compare against a PyTorch curve
# kept from an earlier run; the token files' md5 sums in corpus.log say
# whether the data were the same), PRECISIONS (lamp's runs, one after the
# other from the same initial weights: bf16, the default, and/or fp8, FP8
# GEMMs with FP8_SCALING (delayed) scaling; "bf16 fp8" with SKIP_PYTORCH
# compares FP8's loss with bf16's). Writes to $OUT: build/build.log,
# corpus.log, lamp.log(.gz), lamp_loss.jsonl (bf16), lamp_fp8.log and
# lamp_fp8_loss.jsonl (fp8), pytorch.log(.gz), pytorch_loss.jsonl.
# NOTE: a host's documentation is ~10 MB of text (~3M BPE tokens, not MB's
# 30): 2000 steps of 16x1024 tokens are ~11 passes over it.
set -euo pipefail
OUT=${OUT:?set OUT to the folder for the logs and metrics}
STEPS=${STEPS:-2000}
DIR=${DIR:-/tmp/tok}
MB=${MB:-30}
DEADLINE=${DEADLINE:-550}
export TARGETS=${TARGETS-gpt_amp}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[gpt2_loss $(($(date +%s) - T0))s] $*"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

say "build (targets: ${TARGETS:-all})"
if ! OUT=$OUT/build bash tools/gpu/build.sh; then
  say "build failed; the end of $OUT/build/build.log:"
  tail -40 "$OUT/build/build.log" || true
  exit 1
fi
LAMP=build-gpu/examples/gpt_amp
[[ -x $LAMP ]] || { say "$LAMP is missing after the build"; exit 1; }

say "corpus ($MB MB of text) into $DIR"
if ! DIR=$DIR MB=$MB timeout 150 tools/gpu/gpt2_corpus.sh > "$OUT/corpus.log" 2>&1; then
  say "corpus failed:"
  tail -20 "$OUT/corpus.log"
  exit 1
fi
md5sum "$DIR/train.bin" "$DIR/val.bin" >> "$OUT/corpus.log"
tail -5 "$OUT/corpus.log"

# Timeouts: ~40 ms a step for lamp, ~45 for PyTorch eager on an H200, plus
# start-up; each cut to what the deadline leaves (lamp leaves PyTorch its
# share).
lamp_t=$((STEPS * 60 / 1000 + 60))
py_t=$((STEPS * 70 / 1000 + 60))
[[ -n ${SKIP_PYTORCH:-} ]] && py_t=0
((lamp_t > $(left) - py_t)) && lamp_t=$(($(left) - py_t))
((lamp_t < 30)) && lamp_t=30
FAILED=()

for P in ${PRECISIONS:-bf16}; do
  suffix=""
  extra=()
  if [[ $P != bf16 ]]; then
    suffix="_$P"
  fi
  if [[ $P == fp8 ]]; then
    extra=(--fp8-scaling "${FP8_SCALING:-delayed}")
  fi
  say "lamp $P: $STEPS steps (timeout ${lamp_t}s)"
  status=0
  timeout "$lamp_t" "$LAMP" --model gpt2 --batch-size 16 --precision "$P" "${extra[@]}" \
    --cuda-graph --data "$DIR/train.bin" --val-data "$DIR/val.bin" --steps "$STEPS" \
    --warmup 0 --warmup-steps 100 --lr 6e-4 --log-every 10 --eval-every 500 \
    --save-init /tmp/init.pt --metrics "$OUT/lamp${suffix}_loss.jsonl" \
    > "$OUT/lamp${suffix}.log" 2>&1 || status=$?
  if ((status)); then
    say "lamp $P failed (exit $status)"
    FAILED+=("lamp-$P")
  fi
  grep -E "validation loss|ms/step|^gpt2 " "$OUT/lamp${suffix}.log" | tail -8 || true
  tail -3 "$OUT/lamp${suffix}.log"
done

if [[ -n ${SKIP_PYTORCH:-} ]]; then
  say "pytorch: skipped (SKIP_PYTORCH)"
elif [[ -f /tmp/init.pt ]]; then
  py_t_now=$(left)
  ((py_t_now > py_t)) && py_t_now=$py_t
  ((py_t_now < 30)) && py_t_now=30
  say "pytorch: $STEPS steps from lamp's weights (timeout ${py_t_now}s)"
  status=0
  timeout "$py_t_now" python3 benchmarks/gpt2.py --model gpt2 --batch-size 16 \
    --precision bf16 --device cuda --data "$DIR/train.bin" --steps "$STEPS" --warmup 0 \
    --warmup-steps 100 --lr 6e-4 --log-every 10 --init /tmp/init.pt \
    --metrics "$OUT/pytorch_loss.jsonl" > "$OUT/pytorch.log" 2>&1 || status=$?
  if ((status)); then
    say "pytorch failed (exit $status)"
    FAILED+=(pytorch)
  fi
  tail -3 "$OUT/pytorch.log"
else
  say "pytorch: skipped, lamp wrote no /tmp/init.pt"
  FAILED+=(pytorch)
fi

for f in "$OUT"/lamp*.log "$OUT/pytorch.log"; do
  [[ -f $f && $(stat -c %s "$f") -gt 1000000 ]] && gzip -f "$f"
done
say "summary lines:"
grep -h '"kind": *"summary"' "$OUT"/*_loss.jsonl || true
if ((${#FAILED[@]})); then
  say "failed: ${FAILED[*]}"
  exit 1
fi
say "done"
