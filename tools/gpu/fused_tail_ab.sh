#!/usr/bin/env bash
# The fused bottleneck tail (lamp::nn::conv_bn_add_relu) on a one-GPU host,
# in about 5 minutes: builds lamp (tools/gpu/build.sh), runs the
# fused layers' GPU tests, times resnet50_amp graphed with and without the
# tail (pairs interleaved: bs256 fp16 twice, bs256 bf16, bs64 fp16), the
# example tests, a 1,000-step loss curve each way and compute-sanitizer's
# memcheck on the new kernels' tests.
#
# Run from the repository root:  OUT=<dir> tools/gpu/fused_tail_ab.sh
# Needs .deps/ (tools/gpu/deps.sh; pass carry [".deps"]). Writes to $OUT:
# build.log, tests.log, ab_*.jsonl/.log, ctest.log, curve_*.jsonl/.log,
# memcheck.log, and logs.tgz with all of them (a device call returns at most
# 8 files).
set -u
OUT=${OUT:?set OUT to the folder for the logs}
# shellcheck source=tools/gpu/ab.sh
. tools/gpu/ab.sh

say tests
timeout 200 $B/tests/lamp_tests \
  --gtest_filter='ConvStats*:ConvBnAddRelu*:BatchNormAct*:BatchNormFinalize*' > "$L/tests.log" 2>&1
echo "tests exit $?"
grep -E '^\[ +(FAILED|PASSED|SKIPPED) ' "$L/tests.log" | head -30

say "A/B"
for i in 1 2; do
  ab "fp16_256_base$i" --precision fp16 --batch-size 256 --fused-bn --no-fused-tail
  ab "fp16_256_tail$i" --precision fp16 --batch-size 256 --fused-bn --fused-tail
done
ab bf16_256_base --precision bf16 --batch-size 256 --fused-bn --no-fused-tail
ab bf16_256_tail --precision bf16 --batch-size 256 --fused-bn --fused-tail

say examples
timeout 100 ctest --test-dir $B -R 'example\.resnet50_amp' -j2 --output-on-failure > "$L/ctest.log" 2>&1
echo "ctest exit $?"
grep -E 'tests passed|\*\*\*|Not Run|Timeout' "$L/ctest.log" | head

say "loss curves"
for t in base tail; do
  flag=--no-fused-tail
  [ $t = tail ] && flag=--fused-tail
  timeout 75 $R --device cuda --channels-last --cuda-graph --precision fp16 --batch-size 256 \
    --steps 1000 --warmup 3 --log-every 10 --fused-bn $flag \
    --metrics "$L/curve_$t.jsonl" > "$L/curve_$t.log" 2>&1
  echo "curve $t exit $? $(grep -o '"median_step_ms": [0-9.]*' "$L/curve_$t.jsonl" | tail -1)"
done
ab fp16_64_base --precision fp16 --batch-size 64 --fused-bn --no-fused-tail
ab fp16_64_tail --precision fp16 --batch-size 64 --fused-bn --fused-tail
tar czf "$OUT/logs.tgz" -C "$OUT" l

say memcheck
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 "$CS" --tool memcheck --error-exitcode 3 $B/tests/lamp_tests \
  --gtest_filter='ConvBnAddReluGpu.Matches*:ConvBnAddReluGpu.WhatItDoes*:BatchNormFinalizeGpu.*:ConvStatsGpu.ChannelSums*' \
  > "$L/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck.log" | head
say done
tar czf "$OUT/logs.tgz" -C "$OUT" l
