#!/usr/bin/env bash
# llm.c (karpathy/llm.c's train_gpt2cu: hand-written CUDA kernels, cuBLASLt,
# cuDNN flash attention) as a peer for lamp's GPT-2 step, on one GPU, with
# the same model, batch and token file as tools/gpu/gpt2_bench.sh: GPT-2
# 124M from random init (-e d12: 12 layers, 768 channels, seed 42), bf16
# (llm.c's default), batch 16 x 1024, no gradient accumulation, WARMUP +
# STEPS steps, no validation or sampling in between; prints the median
# ms/step of the steps after the warm-up ones and the tokens/s it gives, and
# the peak GPU memory in use (nvidia-smi, every 200 ms; the whole process,
# CUDA context included).
#
# llm.c's sources (no data, no .git) live in .peers/llm.c (git archive of
# the snapshot: Makefile, train_gpt2.cu, llmc/). The build step copies them
# to BUILD, applies the one change CUDA 13 needs (cudaMemAdvise takes a
# cudaMemLocation, not a device ordinal; the call is guarded by
# CUDART_VERSION) and runs llm.c's Makefile with USE_CUDNN=1 (the cuDNN
# frontend's headers from .deps/cudnn_frontend/include), without NCCL or MPI
# (NO_MULTI_GPU=1 NO_USE_MPI=1). NVCC_LDFLAGS and NVCC_INCLUDES given to make
# replace the Makefile's, so every library is named here.
#
# Run from the repository root:
#   DATA=/tmp/tok/train.bin OUT=<dir> tools/gpu/llmc_bench.sh [build,run]
#   OUT=<dir> tools/gpu/llmc_bench.sh build     # only build (no GPU needed)
# Env: OUT (required), DATA (token file, llm.c's .bin layout; required for
# run), VAL (validation tokens; default: val.bin beside DATA), BUILD (build
# folder, /tmp/llmc), SRC (.peers/llm.c), SM (compute capability, 90),
# BATCH (16), SEQ (1024), STEPS (50, timed), WARMUP (10), TIMEOUT (seconds
# for the run, 0: none), CUDNN_DIR (cuDNN's include/ and lib/; default:
# Python's nvidia.cudnn, else the CUDA toolkit's), LLMC_ARGS (more flags).
# Writes to $OUT: llmc_build.log, llmc.log (its output), llmc_mem.csv
# (nvidia-smi samples, MiB), llmc.jsonl (a summary line in gpt2_bench.sh's
# fields: ms_per_step, tokens_per_s, peak_memory_gib).
set -euo pipefail
OUT=${OUT:?set OUT to the folder for the logs}
WHAT=${1:-build,run}
ROOT=$PWD
SRC=${SRC:-$ROOT/.peers/llm.c}
BUILD=${BUILD:-/tmp/llmc}
SM=${SM:-90}
BATCH=${BATCH:-16}
SEQ=${SEQ:-1024}
STEPS=${STEPS:-50}
WARMUP=${WARMUP:-10}
TIMEOUT=${TIMEOUT:-0}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[llmc_bench $(($(date +%s) - T0))s] $*"; }
want() { [[ ",$WHAT," == *",$1,"* ]]; }

CUDA=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
if [[ -z ${CUDNN_DIR:-} ]]; then
  CUDNN_DIR=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])" 2> /dev/null || true)
  [[ -f $CUDNN_DIR/include/cudnn.h ]] || CUDNN_DIR=$CUDA
fi
CUDNN_LIB=$CUDNN_DIR/lib
[[ -e $CUDNN_LIB/libcudnn.so.9 ]] || CUDNN_LIB=$CUDNN_DIR/lib64
CUDART=$CUDA/lib64
[[ -d $CUDART ]] || CUDART=$CUDA/lib
export LD_LIBRARY_PATH="$CUDNN_LIB:$CUDART:${LD_LIBRARY_PATH:-}"
BIN=$BUILD/train_gpt2cu

if want build; then
  FE=$ROOT/.deps/cudnn_frontend/include
  for f in "$SRC/train_gpt2.cu" "$CUDNN_DIR/include/cudnn.h" "$CUDNN_LIB/libcudnn.so.9" \
    "$FE/cudnn_frontend.h"; do
    [[ -e $f ]] || { say "missing $f"; exit 1; }
  done
  say "build in $BUILD (cuDNN $CUDNN_DIR, CUDA $CUDA, sm_$SM)"
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  cp -r "$SRC/." "$BUILD/"
  # The Makefile insists on ./cudnn-frontend/include (or ~/cudnn-frontend).
  ln -sfn "$(dirname "$FE")" "$BUILD/cudnn-frontend"
  # NOTE: CUDA 13 dropped cudaMemAdvise's int-device form; llm.c's one call
  # (the managed fallback when cudaMalloc runs out) asks for the host.
  python3 - "$BUILD/llmc/cuda_utils.cuh" << 'EOF'
import sys
path = sys.argv[1]
old = ("        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation,"
       " cudaCpuDeviceId), file, line);\n")
new = ("#if CUDART_VERSION >= 13000\n"
       "        cudaMemLocation loc = {cudaMemLocationTypeHost, 0};\n"
       "        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, loc),"
       " file, line);\n"
       "#else\n" + old + "#endif\n")
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"{path}: the cudaMemAdvise call to patch was not found once")
open(path, "w").write(text.replace(old, new))
EOF
  # NVML (mfu.h uses it when nvml.h is there): the toolkit's stub, else the
  # driver's library.
  nvml=()
  if [[ -f $CUDA/include/nvml.h ]]; then
    for d in "$CUDA/lib64/stubs" "$CUDA/lib/stubs" "$CUDA/targets/x86_64-linux/lib/stubs"; do
      [[ -e $d/libnvidia-ml.so ]] && { nvml=(-L"$d" -lnvidia-ml); break; }
    done
    if ((${#nvml[@]} == 0)); then
      lib=$(ldconfig -p | awk '/libnvidia-ml\.so/ {print $NF; exit}')
      [[ -n $lib ]] && nvml=(-L"$(dirname "$lib")" -l:"$(basename "$lib")")
    fi
  fi
  ldflags="-L$CUDART -lcublas -lcublasLt ${nvml[*]} -L$CUDNN_LIB -l:libcudnn.so.9 -lnvrtc"
  ldflags+=" -Xlinker -rpath=$CUDNN_LIB"
  status=0
  (
    cd "$BUILD"
    nvcc --version | tail -1
    make -j2 train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16 \
      GPU_COMPUTE_CAPABILITY="$SM" CUDNN_FRONTEND_PATH="$FE" \
      NVCC_INCLUDES="-I$FE -I$CUDNN_DIR/include" NVCC_LDFLAGS="$ldflags"
  ) > "$OUT/llmc_build.log" 2>&1 || status=$?
  if ((status)); then
    say "build failed (exit $status):"
    grep -B2 -A8 -iE "error" "$OUT/llmc_build.log" | head -60
    exit 1
  fi
  say "built $BIN"
fi

if want run; then
  DATA=${DATA:?set DATA to a token file (llm.c .bin layout)}
  VAL=${VAL:-$(dirname "$DATA")/val.bin}
  [[ -x $BIN ]] || { say "$BIN is missing; build first"; exit 1; }
  total=$((STEPS + WARMUP))
  say "train_gpt2cu: d12, batch $BATCH x $SEQ, bf16, $total steps on $DATA"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
    > "$OUT/llmc_mem.csv" 2> /dev/null &
  smi=$!
  status=0
  # -v: validation only at the first and last step (one batch, -m 1); -s 0:
  # no sampling; no -o: no log folder or checkpoints.
  # shellcheck disable=SC2086 # LLMC_ARGS is a list of flags
  timeout "$TIMEOUT" "$BIN" -i "$DATA" -j "$VAL" -e d12 -b "$BATCH" -t "$SEQ" \
    -d $((BATCH * SEQ)) -x "$total" -v 1000000 -m 1 -s 0 ${LLMC_ARGS:-} 2>&1 |
    tee "$OUT/llmc.log" || status=${PIPESTATUS[0]}
  sleep 0.5
  kill "$smi" 2> /dev/null || true
  wait "$smi" 2> /dev/null || true
  ((status)) && say "train_gpt2cu failed (exit $status)"
  python3 - "$OUT" "$WARMUP" "$BATCH" "$SEQ" << 'EOF'
import json, os, re, statistics, sys

out, warmup, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
step_re = re.compile(r"^step\s+(\d+)/(\d+) \| loss ([\d.naif-]+).*\| ([\d.]+) ms \|.*\| (\d+) tok/s")
steps = []
alloc_mib = None
for line in open(os.path.join(out, "llmc.log"), errors="replace"):
    m = step_re.match(line)
    if m:
        steps.append((int(m[1]), float(m[3]), float(m[4]), int(m[5])))
    m = re.match(r"device memory usage: (\d+) MiB", line)
    if m:
        alloc_mib = int(m[1])
timed = [s for s in steps if s[0] > warmup]
mem = [int(x) for x in open(os.path.join(out, "llmc_mem.csv")).read().split() if x.isdigit()]
peak_mib = max(mem) if mem else None
if not timed:
    sys.exit(f"llmc_bench: no step lines after step {warmup} in llmc.log")
ms = statistics.median(s[2] for s in timed)
row = {
    "kind": "summary", "impl": "llm.c", "model": "d12", "batch_size": batch, "seq_len": seq,
    "steps_timed": len(timed), "ms_per_step": ms, "mean_step_ms": statistics.fmean(s[2] for s in timed),
    "tokens_per_s": batch * seq / (ms / 1e3), "ema_tokens_per_s": timed[-1][3],
    "first_loss": steps[0][1], "final_loss": steps[-1][1],
    "peak_memory_gib": peak_mib / 1024 if peak_mib is not None else None,
    "peak_memory_source": "nvidia-smi memory.used (whole GPU, CUDA context included)",
    "after_alloc_memory_gib": alloc_mib / 1024 if alloc_mib is not None else None,
}
with open(os.path.join(out, "llmc.jsonl"), "w") as f:
    f.write(json.dumps(row) + "\n")
print(f"llm.c: median {ms:.2f} ms/step over steps {timed[0][0]}-{timed[-1][0]}, "
      f"{row['tokens_per_s']:,.0f} tokens/s (its EMA {row['ema_tokens_per_s']:,}), "
      f"peak {row['peak_memory_gib'] or float('nan'):.2f} GiB (nvidia-smi), "
      f"loss {row['first_loss']:.3f} -> {row['final_loss']:.3f}")
EOF
  exit "$status"
fi
