#!/usr/bin/env bash
# The stem's convolution as lamp::nn::space_to_depth_conv2d (resnet50_amp
# --s2d-stem) on a one-GPU host, in about 4 minutes:
# builds lamp (tools/gpu/issue25.sh build), runs the
# new tests, times resnet50_amp graphed bs256 with and without the
# rearranged stem (bf16 pairs interleaved, twice; bs64 bf16; fp16 with it
# with it and without; fp16 at its defaults for the bf16/fp16 ratio), the
# example's tests and a 1,000-step bf16 loss curve each way.
#
# Run from the repository root:  OUT=<dir> tools/gpu/issue26_stem.sh
# Needs .deps/ (tools/gpu/deps.sh; pass carry [".deps"]). Writes to $OUT:
# logs.tgz (build.log, tests.log, ab_*.jsonl/.log, ctest.log,
# curve_*.jsonl/.log) and prints a summary.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
# shellcheck source=tools/gpu/ab.sh
. tools/gpu/ab.sh

say tests
timeout 120 $B/tests/lamp_tests \
  --gtest_filter='SpaceToDepthConv*:ResNet50.SpaceToDepth*' > "$L/tests.log" 2>&1
echo "tests exit $?"
grep -E '^\[ +(FAILED|PASSED|SKIPPED) |mean error' "$L/tests.log" | head -20

say "A/B"
for i in 1 2; do
  ab "bf16_256_s2d$i" --precision bf16 --batch-size 256 --s2d-stem
  ab "bf16_256_conv$i" --precision bf16 --batch-size 256
done
ab fp16_256 --precision fp16 --batch-size 256
ab fp16_256_s2d --precision fp16 --batch-size 256 --s2d-stem
ab bf16_64_s2d --precision bf16 --batch-size 64 --s2d-stem
ab bf16_64_conv --precision bf16 --batch-size 64

say examples
timeout 100 ctest --test-dir $B -R 'example\.resnet50_amp' -j2 --output-on-failure > "$L/ctest.log" 2>&1
echo "ctest exit $?"
grep -E 'tests passed|\*\*\*|Not Run|Timeout' "$L/ctest.log" | head

say "loss curves"
for t in s2d conv; do
  flag=--s2d-stem
  [ $t = conv ] && flag=--no-s2d-stem
  timeout 75 $R --device cuda --channels-last --cuda-graph --precision bf16 --batch-size 256 \
    --steps 1000 --warmup 3 --log-every 10 $flag \
    --metrics "$L/curve_$t.jsonl" > "$L/curve_$t.log" 2>&1
  echo "curve $t exit $? $(grep -o '"median_step_ms": [0-9.]*' "$L/curve_$t.jsonl" | tail -1)"
done
tar czf "$OUT/logs.tgz" -C "$OUT" l
say done
