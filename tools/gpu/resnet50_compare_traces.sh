#!/usr/bin/env bash
# ResNet-50's fused model part by part, in one call on a one-GPU host where
# build-gpu/ is built (tools/gpu/build.sh): benchmarks/compare.py --fused-bn
# at bs256 (lamp unfused / fused, eager / graphed, the graphed tail off / on,
# and torchvision eager; fp16 and bf16), then torch.compile's default mode on
# the same model (benchmarks/resnet50_amp.py --compile default), then a Chrome
# trace of lamp's fused eager step (tail off) in fp16 and in bf16 summed per
# kernel category (tools/trace_summary.py: where bf16's extra time goes), and
# the same at bs64 fp16 with the tail off and on.
#
# Run from the repository root:  OUT=<dir> tools/gpu/resnet50_compare_traces.sh
# Writes to $OUT: compare.log, compile_fp16.log, trace_summary.txt, trace_*.log.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s)
say() { echo "[resnet50_compare_traces $(($(date +%s) - T0))s] $*"; }
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

say "compare.py --fused-bn"
timeout ${COMPARE_TIMEOUT:-330} python3 benchmarks/compare.py --fused-bn --no-build --build-dir $B \
  --batch-sizes 256 --precisions "${PRECISIONS:-fp16,bf16}" --markdown > "$OUT/compare.log" 2>&1
echo "compare exit $?"
grep -E '^\|' "$OUT/compare.log" | head -20

say "torch.compile default, bs256 fp16 channels-last"
timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/resnet50_amp.py --compile default \
  --precision fp16 --batch-size 256 --channels-last > "$OUT/compile_fp16.log" 2>&1
echo "compile exit $?"
tail -3 "$OUT/compile_fp16.log"

say "traces fp16 / bf16 (fused, eager)"
for p in fp16 bf16; do
  timeout 90 $B/examples/resnet50_amp --device cuda --channels-last --fused-bn --no-fused-tail --precision $p \
    --batch-size 256 --steps 20 --warmup 10 --trace "$OUT/trace" > "$OUT/trace_$p.log" 2>&1
  echo "trace $p exit $?"
done
# bs64 fp16 with the tail off and on: does the tail take kernel time away
# there (the graphed step did not get faster)?
for tail in no-fused-tail fused-tail; do
  timeout 90 $B/examples/resnet50_amp --device cuda --channels-last --fused-bn --$tail \
    --precision fp16 --batch-size 64 --steps 20 --warmup 10 --trace "$OUT/trace64_$tail" \
    > "$OUT/trace64_$tail.log" 2>&1
  echo "trace bs64 $tail exit $?"
done
python3 tools/trace_summary.py "$OUT"/trace.fp16.json "$OUT"/trace.bf16.json \
  "$OUT"/trace64_no-fused-tail.fp16.json "$OUT"/trace64_fused-tail.fp16.json --steps 5 --top 6 \
  > "$OUT/trace_summary.txt" 2>&1
head -120 "$OUT/trace_summary.txt"
gzip -f "$OUT"/trace*.json
say done
