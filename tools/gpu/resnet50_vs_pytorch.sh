#!/usr/bin/env bash
# ResNet-50, lamp against PyTorch, in one call on a one-GPU host, about 7
# minutes (docs/benchmarks.md's first table): builds lamp
# (tools/gpu/build.sh), then resnet50_amp graphed at its defaults (bs256 fp16
# and bf16 twice each, interleaved; bs64 fp16 and bf16), then PyTorch's twin
# (benchmarks/resnet50_amp.py, bs256 channels-last) eager in fp16 and bf16 and
# torch.compile's default mode in fp16, then in bf16 while time is left
# (COMPILE_BF16=0 skips it).
#
# Run from the repository root:  OUT=<dir> tools/gpu/resnet50_vs_pytorch.sh
# Needs .deps/ (tools/gpu/deps.sh; pass carry [".deps"]). Writes to $OUT:
# logs.tgz (build.log, ab_*.jsonl/.log, py_*.log) and prints a summary.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
# shellcheck source=tools/gpu/ab.sh
. tools/gpu/ab.sh

say "lamp, graphed, defaults"
STEPS=100
for i in 1 2; do
  ab "fp16_256_$i" --precision fp16 --batch-size 256
  ab "bf16_256_$i" --precision bf16 --batch-size 256
done
ab fp16_64 --precision fp16 --batch-size 64
ab bf16_64 --precision bf16 --batch-size 64

py() { # label, then resnet50_amp.py's flags
  local label=$1
  shift
  timeout "${PY_TIMEOUT:-200}" python3 benchmarks/resnet50_amp.py --batch-size 256 \
    --channels-last "$@" > "$L/py_$label.log" 2>&1
  echo "$label exit $? $(grep -o '"median_step_ms": [0-9.]*' "$L/py_$label.log" | tail -1)" \
    "$(grep -o '"peak_memory_bytes": [0-9]*' "$L/py_$label.log" | tail -1)"
}
say "PyTorch eager"
py eager_fp16 --precision fp16
py eager_bf16 --precision bf16
say "torch.compile default"
py compile_fp16 --precision fp16 --compile default
[ "${COMPILE_BF16:-1}" = 1 ] && py compile_bf16 --precision bf16 --compile default
tar czf "$OUT/logs.tgz" -C "$OUT" l
say done
