#!/usr/bin/env bash
# The image pipeline on a one-GPU host, in under 10 minutes: builds lamp with
# nvJPEG (tools/gpu/build.sh), runs the lamp::data tests (CPU and GPU), writes
# the photo and hard benchmark sets (benchmarks/make_jpegs.py), times the
# loader alone (every decoder, partial decode on and off, torchvision's
# DataLoader and torchvision.io.decode_jpeg on the GPU) and ResNet-50 fp16
# channels-last bs256 graphed on each set against the same step on synthetic
# data. Other steps are the A/B runs behind the loader's defaults
# (docs/design/image-loader.md).
#
# Run from the repository root:  OUT=<dir> tools/gpu/image_pipeline.sh [STEPS]
# STEPS (default build,tests,sets,loader,e2e): any of build tests sets
# loader probe roi e2e epochs dct prio now alloc firstpass backends resize
# workers, comma-separated (`build` alone: what tools/gpu/build.sh does;
# TARGETS limits it).
# Needs .deps/ (Debian's libjpeg-turbo, libpng, GoogleTest, CLI11 unpacked
# with dpkg -x, and PyPI's nvidia-nvjpeg under .deps/nvjpeg), and python3
# with torch, torchvision and Pillow. Writes to $OUT:
#   build.log, tests.log, sets.log, loader.jsonl, e2e_*.log / e2e_*.jsonl.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
STEPS=${1:-build,tests,sets,loader,e2e}
mkdir -p "$OUT"
ROOT=$PWD
B=$ROOT/build-gpu
T0=$(date +%s)
say() { echo "[image_pipeline $(($(date +%s) - T0))s] $*"; }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$ROOT/.deps/usr/lib/x86_64-linux-gnu:$ROOT/.deps/lib/x86_64-linux-gnu:$ROOT/.deps/nvjpeg/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

if want build; then
  OUT=$OUT bash tools/gpu/build.sh || exit 1
fi

if want sets; then
  # In the background while the tests run.
  say "benchmark sets"
  (
    python3 benchmarks/make_jpegs.py $B/sets/photo/train --classes 100 --per-class 60
    [ -n "${PHOTO_ONLY:-}" ] && exit 0
    [ -n "${TRAIN_ONLY:-}" ] ||
      python3 benchmarks/make_jpegs.py $B/sets/photo/val --classes 100 --per-class 3 --seed 1
    python3 benchmarks/make_jpegs.py $B/sets/hard/train --profile hard --classes 100 --per-class 40
    [ -n "${TRAIN_ONLY:-}" ] && exit 0
    python3 benchmarks/make_jpegs.py $B/sets/hard/val --profile hard --classes 100 --per-class 3 --seed 1
  ) > "$OUT/sets.log" 2>&1 &
  SETS=$!
fi

if want tests; then
  say "tests"
  : > "$OUT/tests.log"
  for suite in ${TEST_SUITES:-'ResizeBatch*' 'Nvjpeg*' 'ImageLoaderGpu*' 'ImageLoaderTest.Batches*'}; do
    timeout ${TEST_TIMEOUT:-100} "$B/tests/lamp_tests" --gtest_filter="$suite" \
      >> "$OUT/tests.log" 2>&1
    say "lamp_tests $suite: exit $?"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure$" "$OUT/tests.log" | head -40
fi

if [ -n "${SETS:-}" ]; then
  wait $SETS
  grep -E "^[{]|Error" "$OUT/sets.log" | head
fi

L=$B/benchmarks/image_loader
if want loader; then
  say "loader alone (photo profile)"
  for args in ${LOADER_ARGS:-"--decode cpu" "--decode cpu --no-partial-decode" \
      "--decode gpu --stage-threads 1" "--decode gpu" "--decode gpu --stage-threads 3" \
      "--decode gpu --no-partial-decode" "--decode auto --stage-threads 1" "--decode auto" \
      "--decode auto --stage-threads 3"}; do
    timeout 90 $L --data $B/sets/photo/train --threads 16 --batches 120 $args \
      2>> "$OUT/loader.err" | tee -a "$OUT/loader.jsonl"
  done
  timeout 90 $L --data $B/sets/hard/train --threads 16 --batches 60 --decode auto 2>> "$OUT/loader.err" |
    sed 's/^{/{"set": "hard", /' | tee -a "$OUT/loader.jsonl"
  timeout 120 python3 benchmarks/image_loader.py --data $B/sets/photo/train \
    --decode-jpeg-cuda --batches 60 2>> "$OUT/loader.err" | tee -a "$OUT/loader.jsonl"
  [ -n "${NO_DATALOADER:-}" ] ||
    timeout 150 python3 benchmarks/image_loader.py --data $B/sets/photo/train \
      --workers 16 --batches 60 2>> "$OUT/loader.err" | tee -a "$OUT/loader.jsonl"
fi

if want probe; then
  # Where the GPU half's ceiling is: nvJPEG alone with 1-3 decoders (threads,
  # alternate batches), the CUDA backend alone, and the loader with fewer
  # decode threads than cores (the stage thread's share of the CPU).
  say "probe"
  N=$B/benchmarks/nvjpeg_decoder
  for d in 1 2 3; do
    timeout 60 $N --data $B/sets/photo/train --decoders $d --batches 60 \
      2>> "$OUT/probe.err" | tee -a "$OUT/probe.jsonl"
  done
  for d in 1 4; do
    timeout 60 $N --data $B/sets/photo/train --decoders $d --batches 20 --cuda-backend \
      2>> "$OUT/probe.err" | tee -a "$OUT/probe.jsonl"
  done
  for args in "--decode gpu --threads 4" "--decode gpu --threads 16" \
      "--decode auto --threads 12" "--decode auto --threads 14" "--decode auto --threads 16" \
      "--decode cpu --threads 16"; do
    timeout 90 $L --data $B/sets/photo/train --batches 100 $args \
      2>> "$OUT/probe.err" | tee -a "$OUT/probe.jsonl"
  done
fi

if want roi; then
  # nvJPEG's ROI decode (the training crop only) against whole images, the
  # decoder alone; then the loader with and without it, and with the decode
  # threads at a lower priority than the stage threads (--decode-nice).
  say "roi + priority"
  N=$B/benchmarks/nvjpeg_decoder
  for set in photo hard; do
    for args in "--decoders 2" "--decoders 2 --roi" "--decoders 3" "--decoders 3 --roi"; do
      timeout 60 $N --data $B/sets/$set/train --batches 40 $args \
        2>> "$OUT/roi.err" | sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/roi.jsonl"
    done
  done
  for set in photo hard; do
    for args in "--decode auto --no-partial-decode --decode-nice 0" "--decode auto --decode-nice 0" \
        "--decode auto" "--decode auto --decode-nice 10" "--decode auto --stage-threads 3" \
        "--decode gpu --stage-threads 3"; do
      timeout 60 $L --data $B/sets/$set/train --threads 16 --batches 80 $args \
        2>> "$OUT/roi.err" | sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/roi.jsonl"
    done
  done
fi

if want e2e; then
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  say "end to end"
  timeout 60 $R $COMMON --steps 30 --warmup 5 --log-every 10 \
    --metrics "$OUT/e2e_synthetic.jsonl" > "$OUT/e2e_synthetic.log" 2>&1
  for set in photo hard; do
    timeout 120 $R $COMMON --data $B/sets/$set --epochs 2 --warmup 5 --workers 16 --log-every 1 \
      --metrics "$OUT/e2e_$set.jsonl" > "$OUT/e2e_$set.log" 2>&1
    say "e2e $set exit $?"
  done
  for f in "$OUT"/e2e_*.log; do
    echo "== $f"
    grep -E "epoch|precision|fp16 |skipped|error|Error" "$f" | tail -6
  done
fi
if want epochs; then
  # The next epoch prepared ahead (--prefetch-next-epoch, the default) or
  # not, same call: three epochs on each set, each step's time and the mean
  # and median per epoch (tools/gpu/epoch_steps.py).
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  say "epochs A/B"
  timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 \
    --metrics "$OUT/ep_synthetic.jsonl" > "$OUT/ep_synthetic.log" 2>&1
  for set in photo hard; do
    for ahead in prefetch-next-epoch no-prefetch-next-epoch; do
      timeout 150 $R $COMMON --data $B/sets/$set --epochs ${EPOCHS:-3} --warmup 5 --workers 16 \
        --log-every 1 --$ahead --metrics "$OUT/ep_${set}_$ahead.jsonl" > "$OUT/ep_${set}_$ahead.log" 2>&1
      say "epochs $set $ahead exit $?"
    done
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/ep_*.jsonl
fi
if want dct; then
  # DCT-domain downscaling (--dct-downscale, off by default) A/B, same call:
  # the loader alone on both sets, then ResNet-50 on the hard set, three
  # epochs each way, every step timed (tools/gpu/epoch_steps.py).
  say "dct downscale A/B"
  for set in photo hard; do
    for args in "--decode cpu" "--decode cpu --dct-downscale" "--decode auto" \
        "--decode auto --dct-downscale"; do
      timeout 60 $L --data $B/sets/$set/train --threads 16 --batches ${DCT_BATCHES:-60} $args \
        2>> "$OUT/dct.err" | sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/dct.jsonl"
    done
  done
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 \
    --metrics "$OUT/dct_synthetic.jsonl" > "$OUT/dct_synthetic.log" 2>&1
  for set in ${DCT_SETS:-hard}; do
    for flag in no-dct dct-downscale; do
      extra=""
      [ $flag = dct-downscale ] && extra="--dct-downscale"
      timeout 150 $R $COMMON --data $B/sets/$set --epochs ${EPOCHS:-3} --warmup 5 --workers 16 \
        --log-every 1 $extra --metrics "$OUT/dct_${set}_$flag.jsonl" > "$OUT/dct_${set}_$flag.log" 2>&1
      say "dct $set $flag exit $?"
    done
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/dct_*.jsonl
fi
if want prio; then
  # The decode threads' nice value end to end (--decode-nice, default 5):
  # beside the training step the stage threads (nvJPEG's host work) and the
  # training thread compete with 16 decode threads for 16 cores; a nice-0
  # thread sharing a core with a nice-5 one gets ~75 % of it, with a nice-19
  # one ~98 %. Three epochs on the hard set each way, every step timed.
  say "decode priority A/B"
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 \
    --metrics "$OUT/prio_synthetic.jsonl" > "$OUT/prio_synthetic.log" 2>&1
  for nice in ${NICES:-5 10 19}; do
    timeout 150 $R $COMMON --data $B/sets/${PRIO_SET:-hard} --epochs ${EPOCHS:-3} --warmup 5 \
      --workers 16 --log-every 1 --decode-nice $nice \
      --metrics "$OUT/prio_nice$nice.jsonl" > "$OUT/prio_nice$nice.log" 2>&1
    say "prio nice $nice exit $?"
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/prio_*.jsonl
fi
if want now; then
  # ResNet-50 at today's defaults (fp16: the fused tail too) on synthetic
  # data and on both sets, three epochs, every step timed; the synthetic
  # step without the tail for reference.
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  say "end to end at the defaults"
  for tail in fused-tail no-fused-tail; do
    timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 --$tail \
      --metrics "$OUT/now_synthetic_$tail.jsonl" > "$OUT/now_synthetic_$tail.log" 2>&1
  done
  for set in photo hard; do
    timeout 150 $R $COMMON --data $B/sets/$set --epochs ${EPOCHS:-3} --warmup 5 --workers 16 \
      --log-every 1 --metrics "$OUT/now_$set.jsonl" > "$OUT/now_$set.log" 2>&1
    say "now $set exit $?"
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/now_*.jsonl
fi
if want alloc; then
  # What nvJPEG allocates while it decodes (its buffers grow; Note [nvJPEG's
  # own memory]): nvJPEG alone, a line per pass over each set (host ms a
  # batch, allocations and their time), then ResNet-50 on the photo set,
  # three epochs, nvJPEG only and every decoder.
  say "nvJPEG's allocations"
  N=$B/benchmarks/nvjpeg_decoder
  for set in photo hard; do
    files=6000
    [ $set = hard ] && files=4000
    timeout 60 $N --data $B/sets/$set/train --decoders 2 --roi --batches 60 \
      --max-files $files --per-pass 2>> "$OUT/alloc.err" |
      sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/alloc.jsonl"
  done
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  for decode in gpu auto; do
    timeout 150 $R $COMMON --data $B/sets/photo --epochs 3 --warmup 5 \
      --workers 16 --log-every 1 --decode $decode \
      --metrics "$OUT/alloc_$decode.jsonl" > "$OUT/alloc_$decode.log" 2>&1
    say "alloc $decode exit $?"
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/alloc_*.jsonl
fi
if want firstpass; then
  # Why nvJPEG's first pass over a set is slower than the next ones, alone
  # and with the files in memory: a set of one frame size (500x375, the
  # photo profile's textures and encodings) against the photo set (sizes
  # from thumbnails to camera originals). The same first-pass cost on both:
  # something per batch or per byte; only on the photo set: per geometry.
  say "nvJPEG's first pass"
  [ -d $B/sets/onesize ] || python3 benchmarks/make_jpegs.py $B/sets/onesize/train \
    --classes 100 --per-class 40 --one-size 500x375 > "$OUT/onesize.log" 2>&1
  N=$B/benchmarks/nvjpeg_decoder
  for set in onesize photo onesize photo; do
    timeout 60 $N --data $B/sets/$set/train --decoders 2 --roi \
      --batches 48 --max-files 4000 --per-pass 2>> "$OUT/firstpass.err" |
      sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/firstpass.jsonl"
  done
fi
if want backends; then
  # What the images nvJPEG's engines refuse (progressive JPEGs, mostly) cost
  # the calling thread: nvjpeg_decoder's cuda_backend_ms_per_batch against
  # its host_ms_per_batch, photo and hard sets.
  say "nvJPEG's CUDA backend's share of the host time"
  N=$B/benchmarks/nvjpeg_decoder
  for set in photo hard photo hard; do
    timeout 60 $N --data $B/sets/$set/train --decoders 2 --roi --batches 40 \
      --max-files 4000 2>> "$OUT/backends.err" |
      sed "s/^{/{\"set\": \"$set\", /" | tee -a "$OUT/backends.jsonl"
  done
fi
if want resize; then
  # The GPU's resize of the decode threads' crops (--gpu-resize) against
  # the threads resizing them (the default), A/B in one call: the
  # loader alone on both sets, then ResNet-50 three epochs on each set,
  # every step timed, RESIZE_REPS interleaved rounds (default 2). (The
  # route step of branch loader-route-by-cost, 2026-12-03, measured this
  # with the other candidates of that branch behind temporary switches.)
  say "loader A/B: GPU resize or CPU resize"
  declare -A ARGS=([gpu]="--gpu-resize" [cpu]="")
  for set in hard photo; do
    for ab in gpu cpu; do
      timeout 60 $L --data $B/sets/$set/train --threads 16 --batches 60 \
        --decode auto ${ARGS[$ab]} 2>> "$OUT/resize.err" |
        sed "s/^{/{\"set\": \"$set\", \"ab\": \"$ab\", /" | tee -a "$OUT/resize.jsonl"
    done
  done
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  for rep in $(seq 1 ${RESIZE_REPS:-2}); do
    timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 \
      --metrics "$OUT/resize_synthetic_$rep.jsonl" > "$OUT/resize_synthetic_$rep.log" 2>&1
    for set in hard photo; do
      for ab in gpu cpu; do
        timeout 150 $R $COMMON --data $B/sets/$set --epochs 3 --warmup 5 \
          --workers 16 ${ARGS[$ab]} --log-every 1 \
          --metrics "$OUT/resize_${set}_${ab}_$rep.jsonl" > "$OUT/resize_${set}_${ab}_$rep.log" 2>&1
        say "resize $rep $set $ab exit $?"
      done
    done
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/resize_*.jsonl
fi
if want workers; then
  # The hard set's gap (the loader alone there, ~8,400 images/s, is slower
  # than the step, ~8,700): how the CPU's cores are best shared under the
  # training step, A/B in one call: decode threads (--workers) 12, 14, 16
  # and 16 with a third stage thread, ResNet-50 three epochs on each set,
  # every step timed, WORKERS_REPS interleaved rounds (default 2).
  say "ResNet-50 A/B: decode and stage threads"
  declare -A WARGS=([w12]="--workers 12" [w14]="--workers 14" [w16]="--workers 16"
    [w16s3]="--workers 16 --stage-threads 3" [w16p4]="--workers 16 --prefetch 4"
    [w16p6]="--workers 16 --prefetch 6" [w16p8]="--workers 16 --prefetch 8")
  R=$B/examples/resnet50_amp
  COMMON="--precision fp16 --batch-size 256 --channels-last --cuda-graph"
  for rep in $(seq 1 ${WORKERS_REPS:-2}); do
    timeout 60 $R $COMMON --steps 60 --warmup 5 --log-every 1 \
      --metrics "$OUT/workers_synthetic_$rep.jsonl" > "$OUT/workers_synthetic_$rep.log" 2>&1
    for set in hard photo; do
      for ab in ${WORKERS_CASES:-w12 w14 w16 w16s3}; do
        timeout 150 $R $COMMON --data $B/sets/$set --epochs 3 --warmup 5 \
          ${WARGS[$ab]} --log-every 1 \
          --metrics "$OUT/workers_${set}_${ab}_$rep.jsonl" > "$OUT/workers_${set}_${ab}_$rep.log" 2>&1
        say "workers $rep $set $ab exit $?"
      done
    done
  done
  python3 tools/gpu/epoch_steps.py "$OUT"/workers_*.jsonl
  # Each run's peak GPU memory (the model's and the loader's) in GiB.
  for f in "$OUT"/workers_*.jsonl; do
    printf '%s ' "$(basename "$f" .jsonl)"
    grep -o '"peak_memory_bytes": *[0-9]*' "$f" | tail -1 | awk '{printf "%.3f GiB\n", $2 / 2^30}'
  done
fi
say "done"
