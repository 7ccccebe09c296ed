#!/usr/bin/env bash
# The stem's convolution as lamp::nn::space_to_depth_conv2d (resnet50_amp's
# default with the fused model in bf16; --no-s2d-stem turns it off) on a
# one-GPU host, in about 6 minutes: builds lamp (tools/gpu/build.sh), runs its
# tests and compute-sanitizer's memcheck on its GPU tests, times resnet50_amp
# graphed bs256 bf16 with and without the rearranged stem (pairs interleaved,
# twice), fp16 at its default and with --s2d-stem, bs64 bf16 each way, traces
# one eager bf16 step each way (per-category kernel time,
# tools/trace_summary.py), then the example's tests, or with GPU_CTEST=1 every
# test labelled gpu (Fashion-MNIST linked from .deps).
#
# Run from the repository root:  OUT=<dir> tools/gpu/s2d_stem_ab.sh
# Needs .deps/ (tools/gpu/deps.sh; pass carry [".deps"]). Writes to $OUT:
# logs.tgz (build.log, tests.log, memcheck.log, ab_*.jsonl/.log,
# trace_*.log, sum.txt, ctest.log) and prints a summary.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
# shellcheck source=tools/gpu/ab.sh
. tools/gpu/ab.sh

say tests
timeout 120 $B/tests/lamp_tests \
  --gtest_filter='SpaceToDepthConv*:ResNet50.SpaceToDepth*' > "$L/tests.log" 2>&1
echo "tests exit $?"
grep -E '^\[ +(FAILED|PASSED|SKIPPED) |mean error' "$L/tests.log" | head -20
timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $B/tests/lamp_tests --gtest_filter='SpaceToDepthConvGpu.*' > "$L/memcheck.log" 2>&1
echo "memcheck exit $? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1)"

say "A/B"
for i in 1 2; do
  ab "bf16_256_s2d$i" --precision bf16 --batch-size 256
  ab "bf16_256_conv$i" --precision bf16 --batch-size 256 --no-s2d-stem
done
ab fp16_256 --precision fp16 --batch-size 256
ab fp16_256_s2d --precision fp16 --batch-size 256 --s2d-stem
ab bf16_64_s2d --precision bf16 --batch-size 64
ab bf16_64_conv --precision bf16 --batch-size 64 --no-s2d-stem

say traces
for t in s2d conv; do
  flag=--s2d-stem
  [ $t = conv ] && flag=--no-s2d-stem
  timeout 90 $R --device cuda --channels-last --precision bf16 --batch-size 256 \
    --steps 20 --warmup 10 $flag --trace "$L/trace_$t" > "$L/trace_$t.log" 2>&1
  echo "trace $t exit $?"
done
python3 tools/trace_summary.py "$L"/trace_s2d.bf16.json "$L"/trace_conv.bf16.json \
  --steps 5 --top 6 > "$L/sum.txt" 2>&1
grep -B2 -A12 "GPU kernels" "$L/sum.txt" | head -40
rm -f "$L"/*.json

if [ "${GPU_CTEST:-0}" = 1 ]; then
  say "ctest -L gpu"
  mkdir -p /usr/share/datasets
  ln -sfn "$PWD/.deps/usr/share/datasets/fashion-mnist" /usr/share/datasets/fashion-mnist
  timeout 300 ctest --test-dir $B -L gpu -LE multi_gpu -j3 --timeout 180 > "$L/ctest.log" 2>&1
else
  say examples
  timeout 100 ctest --test-dir $B -R 'example\.resnet50_amp' -j2 --output-on-failure > "$L/ctest.log" 2>&1
fi
echo "ctest exit $?"
grep -E 'tests passed|\*\*\*|Not Run|Timeout' "$L/ctest.log" | head
tar czf "$OUT/logs.tgz" -C "$OUT" l
say done
