#!/usr/bin/env bash
# The fused BatchNorm (lamp::nn::BatchNormAct2d and the kernels around it)
# on a GPU host, in about 7 minutes: builds lamp into /tmp/b, runs the fused
# BatchNorm and ResNet-50 tests (CPU and GPU), traces ResNet-50 bs256 fp16
# channels-last with and without the fused BatchNorm (kernel time per
# category), then benchmarks fused vs unfused vs PyTorch eager.
#
# Run from the repository root on the device:  OUT=<dir> tools/gpu/fused_bn.sh
# Writes to $OUT (each file as soon as its step ends):
#   build.log          configure + build output (and nvidia-smi, cuDNN found)
#   ctest.log          ctest -R 'BatchNormAct|BatchCount|NonFinite|MemsetNodes|MaxPool|...' -V
#   trace_summary.txt  GPU time per kernel category, fused vs unfused
#   traces.tar.gz      the two Chrome traces (open in ui.perfetto.dev)
#   bench.md           compare.py --fused-bn table (bs256/64, fp16/bf16)
#   bench.log          the benchmark's commands and rows as they finish
set -u
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
ROOT=$PWD
B=/tmp/b
START=$(date +%s)
DEADLINE=$((START + 540)) # the benchmark stops here (9 min)
left() { echo $((DEADLINE - $(date +%s))); }
say() { echo "[fused_bn $(($(date +%s) - START))s] $*"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

say "configure + build"
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'cuDNN', torch.backends.cudnn.version())"
  cmake -S . -B "$B" -G Ninja -DCMAKE_PREFIX_PATH="$ROOT/.deps/usr" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build "$B" -j16
} > "$OUT/build.log" 2>&1
status=$?
grep -E "lamp: (cuDNN|without cuDNN|CUDA|using LibTorch)" "$OUT/build.log"
if [ $status -ne 0 ]; then
  say "build failed"
  tail -60 "$OUT/build.log"
  exit 1
fi

say "tests"
(cd "$B" && timeout 200 ctest -R 'BatchNormAct|BatchCount|NonFinite|MemsetNodes|MaxPool|GlobalAvgPool|ConvShortcut|CastWeights|ResNet50|resnet50_amp.cuda' \
  -V --timeout 240) > "$OUT/ctest.log" 2>&1
status=$?
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|\*\*\*|peak memory|mean \|fused" \
  "$OUT/ctest.log"
say "ctest exit $status"

say "traces (resnet50_amp bs256 fp16 channels-last, last 5 steps)"
T=/tmp/fused_bn-traces
rm -rf "$T" && mkdir -p "$T"
for bn in fused no-fused; do
  timeout 60 "$B/examples/resnet50_amp" --device cuda --precision fp16 \
    --channels-last --batch-size 256 --steps 10 --warmup 5 "--$bn-bn" \
    --trace "$T/$bn" > "$T/$bn.log" 2>&1 || say "trace run --$bn-bn failed"
done
python3 tools/trace_summary.py "$T"/fused.fp16.json "$T"/no-fused.fp16.json \
  --steps 5 --top 6 > "$OUT/trace_summary.txt" 2>&1
cat "$T"/*.log >> "$OUT/trace_summary.txt"
head -40 "$OUT/trace_summary.txt"
(cd "$T" && tar czf "$OUT/traces.tar.gz" fused.fp16.json no-fused.fp16.json) ||
  say "no traces to pack"

say "benchmark ($(left)s left)"
timeout $(($(left) > 60 ? $(left) : 60)) python3 benchmarks/compare.py \
  --fused-bn --no-build --build-dir "$B" --steps 30 --warmup 5 --markdown \
  > "$OUT/bench.md" 2> "$OUT/bench.log"
say "benchmark exit $?"
cat "$OUT/bench.md"
grep -v '^\$' "$OUT/bench.log" | tail -8
say "done"
