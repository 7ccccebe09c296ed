#!/usr/bin/env bash
# After tools/gpu/fused_tail_ab.sh in the same call (build-gpu/ built): Chrome
# traces of the graphed-model's eager step with the fused tail (bs64 and
# bs256 fp16, bs256 bf16) summed per kernel category (tools/trace_summary.py),
# bf16 graphed with cuDNN's autotuning (--cudnn-benchmark) with the tail off
# and on, and the tail's GraphedStep test eight times while other GPU tests
# run beside it.
#
# Run from the repository root:  OUT=<dir> tools/gpu/fused_tail_traces.sh
# Writes to $OUT/t: tail*.json.gz, sum.txt, bench_*.jsonl/.log.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
L=$OUT/t
mkdir -p "$L"
B=build-gpu
R=$B/examples/resnet50_amp
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:$PWD/.deps/lib/x86_64-linux-gnu:$PWD/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
for run in "fp16 64" "fp16 256" "bf16 256"; do
  set -- $run
  timeout 90 $R --device cuda --channels-last --fused-bn --fused-tail --precision $1 \
    --batch-size $2 --steps 20 --warmup 10 --trace "$L/tail$2" > "$L/tail$1_$2.log" 2>&1
  echo "trace $run exit $?"
done
python3 tools/trace_summary.py "$L"/tail64.fp16.json "$L"/tail256.fp16.json "$L"/tail256.bf16.json \
  --steps 5 --top 8 > "$L/sum.txt" 2>&1
grep -A10 "GPU kernels" "$L/sum.txt"
gzip -f "$L"/*.json
for tail in no-fused-tail fused-tail; do
  timeout 120 $R --device cuda --channels-last --cuda-graph --fused-bn --$tail --precision bf16 \
    --batch-size 256 --steps 60 --warmup 10 --cudnn-benchmark --metrics "$L/bench_$tail.jsonl" \
    > "$L/bench_$tail.log" 2>&1
  echo "bf16 --cudnn-benchmark $tail exit $? $(grep -o '"median_step_ms": [0-9.]*' "$L/bench_$tail.jsonl" | tail -1)"
done
echo "== the tail's GraphedStep test under load"
(for i in 1 2 3 4 5 6; do
  timeout 60 $B/tests/lamp_tests --gtest_filter='ConvStatsGpu.*:MaxPoolGpu.*:BatchNormActGpu.*' \
    > /dev/null 2>&1
done) &
for i in $(seq 8); do
  timeout 60 $B/tests/lamp_tests --gtest_filter='ConvBnAddReluGpu.GraphedStep*' 2>&1 |
    grep -E "^\[  (FAILED|PASSED)|Failure" | head -2
done
wait
