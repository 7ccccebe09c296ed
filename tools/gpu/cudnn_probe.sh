#!/usr/bin/env bash
# The standalone cuDNN probes (CUDA runtime + cuDNN + the header-only
# cudnn-frontend; no LibTorch; the shared harness is benchmarks/cudnn_probe.h)
# on a GPU host. PROBE names one or more of them, run in that order:
#
#   dbn_weight_probe   cuDNN's Dgrad+Drelu+BNBwdWeight ("DBN") fusion against
#                      ATen's unfused backward, the 32 convolutions whose
#                      input is a BatchNorm+ReLU output (a few minutes);
#   mlperf_form_probe  ResNet-50 in MLPerf's form (genstats, bn_finalize,
#                      BN+ReLU in the next convolution's prologue, the bn3
#                      pass, wgrad with the prologue) against lamp's path
#                      today (convolution + cuDNN's legacy NHWC BatchNorm
#                      kernels), all 52 convolutions (several minutes a
#                      batch size).
#
# 1. builds each named benchmarks/<probe>.cpp into build-gpu/<probe>, all
#    at once, unless the binary there was built from these very sources (a
#    sha256 of the .cpp and cudnn_probe.h beside the binary);
# 2. runs each probe in turn (its rows so far stay in the log if it is
#    stopped). mlperf_form_probe gets dbn_weight_probe's CSV (--dbn-csv) from
#    DBN_CSV, else from $OUT when a dbn_weight_probe ran before it into the
#    same OUT, so that its MLPerf-form backward is complete;
# 3. after dbn_weight_probe only (ATEN=0 skips it): times ATen's side of the
#    same 32 convolutions (dgrad through aten.convolution_backward, ReLU
#    backward through threshold_backward, BatchNorm backward through
#    cudnn_batch_norm_backward, the operands of
#    benchmarks/bn_fusion_backward_probe.py) the same way (median of 20 runs
#    queued behind a GPU sleep, a CUDA event between runs) and with Kineto
#    (as benchmarks/README.md's tables), and prints both side by side.
#
# Run from the repository root, e.g.
#   PROBE="dbn_weight_probe mlperf_form_probe" ATEN=0 BATCH_SIZES=64 \
#     OUT=<dir> tools/gpu/cudnn_probe.sh
# Env: PROBE (required), BATCH_SIZES (64,256), PROBE_ARGS (more flags for
# every probe), PROBE_TIMEOUT (seconds, for each probe), ATEN=0, DBN_CSV,
# BUILD_ONLY=1 (only build; with one PROBE, BIN=<path> builds there).
# Needs: nvcc's host compiler (g++), python3 with torch and nvidia-cudnn-cu13
# (cuDNN's headers and libraries), and cudnn-frontend's headers in
# .deps/cudnn_frontend/include (PyPI nvidia-cudnn-frontend's wheel ships
# them: unzip its include/ there; pass carry [".deps"]).
# Writes to $OUT, for each probe: build-<probe>.log, <probe>.log,
# <probe>.csv; aten.log after dbn_weight_probe.
set -u
ROOT=$PWD
PROBES=${PROBE:-}
[ -n "$PROBES" ] || { echo "set PROBE to dbn_weight_probe and/or mlperf_form_probe"; exit 2; }
for p in $PROBES; do
  case $p in
    dbn_weight_probe | mlperf_form_probe) ;;
    *) echo "unknown PROBE '$p' (dbn_weight_probe, mlperf_form_probe)"; exit 2 ;;
  esac
done
# shellcheck disable=SC2086 # PROBE is a list of names
set -- $PROBES
[ -z "${BIN:-}" ] || [ $# = 1 ] || { echo "BIN goes with one PROBE"; exit 2; }
OUT=${OUT:-$ROOT/out/$(echo "$@" | tr ' ' '+')}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[cudnn_probe $(($(date +%s) - T0))s] $*"; }

CUDNN=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])" 2>/dev/null)
CUDA=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
FE=$ROOT/.deps/cudnn_frontend/include
if [ ! -f "$FE/cudnn_frontend.h" ]; then
  # The PyPI package, where it is installed, ships the same headers.
  FE=$(python3 -c "import cudnn, os; print(os.path.join(os.path.dirname(cudnn.__file__), 'include'))" 2>/dev/null)
fi
for d in "$CUDNN/include/cudnn.h" "$CUDA/include/cuda_runtime.h" "$FE/cudnn_frontend.h"; do
  [ -f "$d" ] || { echo "missing $d (cuDNN: '$CUDNN', CUDA: '$CUDA', frontend: '$FE')"; exit 1; }
done
CUDART=$CUDA/lib64
[ -d "$CUDART" ] || CUDART=$CUDA/lib
export LD_LIBRARY_PATH="$CUDNN/lib:$CUDART:${LD_LIBRARY_PATH:-}"

bin_of() { echo "${BIN:-$ROOT/build-gpu/$1}"; }
src_sum() { cat "$ROOT/benchmarks/$1.cpp" "$ROOT/benchmarks/cudnn_probe.h" | sha256sum | cut -d' ' -f1; }
# NOTE: -isystem: the frontend's own headers are not ours to warn about.
build() {
  local bin
  bin=$(bin_of "$1")
  mkdir -p "$(dirname "$bin")"
  echo "building $bin (cuDNN $CUDNN, CUDA $CUDA, frontend $FE)"
  g++ -std=c++17 -O2 -Wall -Wextra -isystem "$FE" -I"$CUDNN/include" -I"$CUDA/include" \
    "$ROOT/benchmarks/$1.cpp" -o "$bin" \
    -L"$CUDNN/lib" -l:libcudnn.so.9 -L"$CUDART" -lcudart -lnvrtc -ldl -pthread \
    -Wl,-rpath,"$CUDNN/lib" && src_sum "$1" > "$bin.src-sha256"
}

# Builds what is out of date, in parallel (each compile takes a core and a
# minute or two).
pids=()
for p in "$@"; do
  if [ "${BUILD_ONLY:-0}" != 1 ] && [ -x "$(bin_of "$p")" ] &&
    [ "$(cat "$(bin_of "$p").src-sha256" 2>/dev/null)" = "$(src_sum "$p")" ]; then
    say "up to date: $(bin_of "$p")"
    continue
  fi
  say "building $p"
  build "$p" > "$OUT/build-$p.log" 2>&1 &
  pids+=("$!:$p")
done
failed=0
for pp in ${pids[@]+"${pids[@]}"}; do
  wait "${pp%%:*}" || { cat "$OUT/build-${pp#*:}.log"; failed=1; }
done
[ "$failed" = 0 ] || exit 1
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

for p in "$@"; do
  say "$p"
  args=(--batch-sizes "${BATCH_SIZES:-64,256}" --csv "$OUT/$p.csv")
  if [ "$p" = mlperf_form_probe ]; then
    dbn_csv=${DBN_CSV:-}
    [ -n "$dbn_csv" ] || [ ! -f "$OUT/dbn_weight_probe.csv" ] || dbn_csv=$OUT/dbn_weight_probe.csv
    [ -z "$dbn_csv" ] || { say "with --dbn-csv $dbn_csv"; args+=(--dbn-csv "$dbn_csv"); }
  fi
  # shellcheck disable=SC2086 # PROBE_ARGS is a list of flags
  ${PROBE_TIMEOUT:+timeout "$PROBE_TIMEOUT"} "$(bin_of "$p")" "${args[@]}" ${PROBE_ARGS:-} \
    2>&1 | tee "$OUT/$p.log"
  if [ "$p" != dbn_weight_probe ] || [ "${ATEN:-1}" = 0 ]; then
    continue
  fi

  say "ATen"
  PYTHONUNBUFFERED=1 python3 - "$OUT/dbn_weight_probe.csv" "${BATCH_SIZES:-64,256}" <<'EOF' 2>&1 | tee "$OUT/aten.log"
import csv, statistics, sys, warnings

import torch

sys.path.insert(0, "benchmarks")
from bn_fusion_probe import LAYERS, kernel_us  # noqa: E402
from bn_fusion_backward_probe import Case, aten_bn_bwd, aten_conv_bwd  # noqa: E402

warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
torch.backends.cudnn.benchmark = True
ITERS = 20


def gated_us(fn):
    """Median us of ITERS runs queued behind a GPU sleep, an event between
    runs (as dbn_weight_probe times its graphs)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS + 1)]
    torch.cuda._sleep(20_000_000)  # about 10 ms: the host queues every run meanwhile
    ev[0].record()
    for i in range(ITERS):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) * 1000 for i in range(ITERS))


cpp = {}
try:
    for r in csv.DictReader(open(sys.argv[1])):
        key = tuple(int(r[k]) for k in ("batch", "cin", "cout", "k", "stride", "hw"))
        cpp.setdefault(key, {})[r["graph"]] = float(r["us"])
except OSError as e:
    print("no probe csv:", e)
nan = float("nan")
print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}")
for n in [int(b) for b in sys.argv[2].split(",")]:
    print(f"\n## batch {n}: us a call, median of {ITERS} gated runs (Kineto kernel time in brackets)")
    print("| cin | cout | k | s | hw | count | ATen dgrad | ATen drelu | ATen BN bwd | ATen all three "
          "| C++ dgrad | C++ dbn | C++ dx pass | C++ dbn + dx | C++ / ATen |")
    print("|" + " --- |" * 6 + " ---: |" * 9)
    tot = dict.fromkeys(["dgrad", "drelu", "bn", "kdgrad", "kdrelu", "kbn"], 0.0)
    same = [0.0, 0.0, 0]  # ATen all three and C++ dbn + dx, where both ran
    for layer in LAYERS:
        if not layer[6]:
            continue
        c = Case(n, layer)
        bn_fn, _ = aten_bn_bwd(c)
        fns = {"dgrad": aten_conv_bwd(c, [True, False, False]),
               "drelu": lambda: torch.ops.aten.threshold_backward(c.dz, c.z, 0), "bn": bn_fn}
        ev = {k: gated_us(f) for k, f in fns.items()}
        kin = {k: kernel_us(f, ITERS) for k, f in fns.items()}
        for k in fns:
            tot[k] += ev[k] * layer[5] / 1000
            tot["k" + k] += kin[k] * layer[5] / 1000
        aten = sum(ev.values())
        g = cpp.get((n,) + tuple(layer[:5]), {})
        dbn_dx = g.get("dbn", nan) + g.get("dx_pass", nan)
        if dbn_dx == dbn_dx:
            same[0] += aten * layer[5] / 1000
            same[1] += dbn_dx * layer[5] / 1000
            same[2] += layer[5]
        cells = [f"{ev[k]:.1f} ({kin[k]:.1f})" for k in fns] + [f"{aten:.1f}"]
        cells += [f"{g.get(k, nan):.1f}" for k in ("dgrad", "dbn", "dx_pass")] + [f"{dbn_dx:.1f}", f"{dbn_dx / aten:.2f}"]
        print(f"| {' | '.join(str(v) for v in layer[:6])} | " + " | ".join(cells) + " |")
        del c, fns
    print(f"\nbatch {n}, ATen over the 32 convolutions, ms a step (gated events; Kineto): dgrad "
          f"{tot['dgrad']:.3f} ({tot['kdgrad']:.3f}), ReLU backward {tot['drelu']:.3f} ({tot['kdrelu']:.3f}), "
          f"BatchNorm backward {tot['bn']:.3f} ({tot['kbn']:.3f}); dgrad + ReLU backward "
          f"{tot['dgrad'] + tot['drelu']:.3f} ({tot['kdgrad'] + tot['kdrelu']:.3f}); all three "
          f"{tot['dgrad'] + tot['drelu'] + tot['bn']:.3f} ({tot['kdgrad'] + tot['kdrelu'] + tot['kbn']:.3f})")
    print(f"batch {n}, over the {same[2]} convolutions where C++ dbn and dx pass ran: ATen dgrad + ReLU bwd + "
          f"BN bwd {same[0]:.3f} ms, C++ dbn + dx pass {same[1]:.3f} ms")
EOF
done
say "done"
