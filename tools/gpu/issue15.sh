#!/usr/bin/env bash
# Issue 15 on a one-GPU host, in about 8 minutes: builds lamp (with nvJPEG:
# set NVJPEG_ROOT to a folder with include/nvjpeg.h and lib/libnvjpeg.so.13
# when the CUDA toolkit has none), runs the lamp::data tests (CPU and GPU),
# times the loader alone (lamp CPU decode, lamp nvJPEG decode, torchvision
# ImageFolder + DataLoader) and ResNet-50 fp16 channels-last bs256 graphed
# on generated JPEGs against the same step on synthetic data.
#
# Run from the repository root:  OUT=<dir> tools/gpu/issue15.sh
# Needs python3 with torch 2.11, torchvision and Pillow. Writes to $OUT:
#   configure.log, build.log, tests.log (gtest output of the data suites),
#   bench.jsonl (one line per loader run), e2e_*.log / e2e_*.jsonl.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
B=/tmp/b
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
# 10,000 training JPEGs in 100 classes (~500x375, quality 90), 1,000 val.
( python3 benchmarks/make_jpegs.py /tmp/jd/train --classes 100 --per-class 100 &&
  python3 benchmarks/make_jpegs.py /tmp/jd/val --classes 100 --per-class 10 ) \
  > "$OUT/jpegs.log" 2>&1 &
JPEGS=$!
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 ${CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
grep -E "lamp: " "$OUT/configure.log"
cmake --build $B -j"$(nproc)" --target lamp_tests resnet50_amp image_loader \
  > "$OUT/build.log" 2>&1 || { grep -A12 error "$OUT/build.log" | head -60; exit 1; }
echo "built: $(elapsed)"
# The Python oracle starts slowly on some hosts: allow for it.
timeout 400 $B/tests/lamp_tests --gtest_brief=1 --gtest_filter='Nvjpeg*:ResizeBatch*:JpegMarkers*:ImageLoader*:ImageDecoder*:Transforms*:ImageFolder*:DistributedSampler*' \
  > "$OUT/tests.log" 2>&1
grep -E "PASSED|FAILED|SKIPPED|nvjpeg" "$OUT/tests.log" | head -60
echo "tested: $(elapsed)"
wait $JPEGS
L=$B/benchmarks/image_loader
$L --data /tmp/jd/train --threads 16 | tee "$OUT/bench.jsonl"
$L --data /tmp/jd/train --threads 16 --gpu-decode | tee -a "$OUT/bench.jsonl"
$L --data /tmp/jd/train --threads 4 --gpu-decode | tee -a "$OUT/bench.jsonl"
python3 benchmarks/image_loader.py --data /tmp/jd/train --workers 16 | tee -a "$OUT/bench.jsonl"
echo "loader benchmarks: $(elapsed)"
R=$B/examples/resnet50_amp
COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph --warmup 5 --log-every 100"
$R $COMMON --steps 34 --metrics "$OUT/e2e_synthetic.jsonl" > "$OUT/e2e_synthetic.log" 2>&1
$R $COMMON --data /tmp/jd --epochs 1 --workers 16 --metrics "$OUT/e2e_cpu_decode.jsonl" > "$OUT/e2e_cpu_decode.log" 2>&1
$R $COMMON --data /tmp/jd --epochs 1 --workers 16 --gpu-decode --metrics "$OUT/e2e_gpu_decode.jsonl" > "$OUT/e2e_gpu_decode.log" 2>&1
tail -n 3 "$OUT"/e2e_*.log
echo "total: $(elapsed)"
