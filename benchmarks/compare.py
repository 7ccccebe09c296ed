"""Side-by-side benchmark on a GPU host: builds lamp, then runs each case
with lamp's C++ example and its Python twin (benchmarks/resnet50_amp.py,
benchmarks/mlp_amp.py) in this one invocation, and prints one table of
median step times and peak memory with the Python/C++ ratio.

With --ddp it runs ResNet-50 fp16 channels-last instead, data-parallel on 1
and 2 GPUs (torchrun --standalone): lamp's example with --ddp next to
torch.nn.parallel.DistributedDataParallel (resnet50_amp.py --ddp), batch per
GPU, and prints global images/s and the scaling over GPUs.

With --cuda-graph each case also runs lamp's example with --cuda-graph (the
whole step in one CUDA graph, lamp::GraphedStep) and adds its columns.

With --fused-bn it runs ResNet-50 channels-last at batch 256 and 64, fp16 and
bf16, each case seven ways in this one invocation: lamp's example with
--no-fused-bn (torch::nn::BatchNorm2d + add + relu, as torchvision) and with
--fused-bn (lamp::nn::BatchNormAct2d, cuDNN's fused kernels; in fp16 with
each bottleneck's tail as lamp::nn::conv_bn_add_relu too), both eager and
with --cuda-graph, graphed with the tail explicitly off and on
(--no-fused-tail / --fused-tail), and the Python twin (torchvision, eager);
one table of median step times and peak memory.

Usage: python3 benchmarks/compare.py [--build-dir build] [--no-build]
           [--steps 100] [--quick] [--cuda-graph] [--markdown]
       python3 benchmarks/compare.py --ddp [--gpus 1,2]
           [--ddp-batch-sizes 256,64] [--steps 100] [--markdown]
       python3 benchmarks/compare.py --fused-bn [--batch-sizes 256,64]
           [--precisions fp16,bf16] [--steps 100] [--warmup 10] [--markdown]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Set for every child. NOTE: NVLink multicast (NVLS) stays off: on shared
# multi-GPU hosts a program using it can take the GPUs out of service.
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1"}

# (model, precision, batch, channels_last)
CASES = [
    ("resnet50", "fp32", 64, False),
    ("resnet50", "fp16", 64, False),
    ("resnet50", "bf16", 64, False),
    ("resnet50", "fp16", 64, True),
    ("resnet50", "fp32", 256, True),
    ("resnet50", "fp16", 256, True),
    ("mlp", "fp32", 64, False),
    ("mlp", "fp16", 64, False),
]


def run(command):
    print("$", " ".join(command), file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **CHILD_ENV})
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise subprocess.CalledProcessError(done.returncode, command)
    return done.stdout


def summary_from_jsonl(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["kind"] == "summary"][-1]


def cpp_case(build, model, precision, batch, channels_last, args,
             graph=False, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as metrics:
        if model == "resnet50":
            command = [f"{build}/examples/resnet50_amp", "--device", "cuda",
                       "--precision", precision, "--batch-size", str(batch),
                       "--steps", str(args.steps), "--warmup",
                       str(args.warmup), "--metrics", metrics.name]
            if channels_last:
                command.append("--channels-last")
            if args.cudnn_benchmark:
                command.append("--cudnn-benchmark")
        else:
            command = [f"{build}/examples/mlp_amp", "--device", "cuda",
                       "--precision", precision, "--batch-size", str(batch),
                       "--epochs", "1", "--metrics", metrics.name]
        if graph:
            command.append("--cuda-graph")
        command += list(extra)
        run(command)
        return summary_from_jsonl(metrics.name)


def python_case(model, precision, batch, channels_last, args):
    if model == "resnet50":
        command = [sys.executable, "benchmarks/resnet50_amp.py",
                   "--precision", precision, "--batch-size", str(batch),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
        if channels_last:
            command.append("--channels-last")
        if args.cudnn_benchmark:
            command.append("--cudnn-benchmark")
    else:
        command = [sys.executable, "benchmarks/mlp_amp.py", "--precision",
                   precision, "--batch-size", str(batch), "--epochs", "1"]
    return json.loads(run(command).strip().splitlines()[-1])


def step_ms(summary):
    return summary.get("median_step_ms", summary.get("ms_per_step"))


def torchrun(gpus):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={gpus}"]


def ddp_case(build, gpus, batch, args):
    """Global images/s of lamp and of Python DDP on `gpus` GPUs."""
    flags = ["--ddp", "--precision", "fp16", "--channels-last", "--batch-size",
             str(batch), "--steps", str(args.steps), "--warmup", "10"]
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as metrics:
        run(torchrun(gpus) + ["--no-python", f"{build}/examples/resnet50_amp",
                              "--device", "cuda", "--metrics", metrics.name]
            + flags)
        cpp = summary_from_jsonl(metrics.name)
    out = run(torchrun(gpus) + ["benchmarks/resnet50_amp.py"] + flags)
    py = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return cpp["images_per_s"], py["images_per_s"]


def ddp_rows(args):
    import torch  # only here: the children need it anyway

    available = torch.cuda.device_count()
    gpus = [n for n in args.gpus if n <= available]
    for n in sorted(set(args.gpus) - set(gpus)):
        print(f"note: skipping {n} GPUs, this host has {available}",
              file=sys.stderr)
    ips = {(b, n): ddp_case(args.build_dir, n, b, args)
           for b in args.ddp_batch_sizes for n in gpus}

    def scaling(b, n, side):
        one = ips.get((b, 1))
        return f"{100 * ips[b, n][side] / (n * one[side]):.1f} %" if one else ""

    header = ("per-GPU batch", "GPUs", "lamp img/s", "Python img/s",
              "lamp/Python", "lamp scaling", "Python scaling")
    lines = [(str(b), str(n), f"{ips[b, n][0]:,.0f}", f"{ips[b, n][1]:,.0f}",
              f"{ips[b, n][0] / ips[b, n][1]:.2f}x", scaling(b, n, 0),
              scaling(b, n, 1)) for b, n in ips]
    return header, lines


def fused_bn_rows(args):
    """lamp unfused / fused BatchNorm, eager / graphed, and Python eager."""
    header = ("case", "unfused ms", "fused ms", "fused speed-up",
              "unfused graph ms", "fused graph ms", "graph speed-up",
              "graph tail off ms", "graph tail on ms", "tail speed-up",
              "Python ms", "Python/fused", "Python/fused graph",
              "unfused GiB", "fused GiB", "unfused graph GiB",
              "fused graph GiB", "tail on GiB", "Python GiB")

    def attempt(f):
        # NOTE: a failing case leaves its cells empty, not the table.
        try:
            return f()
        except subprocess.CalledProcessError as e:
            print(f"note: {' '.join(e.cmd)} failed ({e.returncode})",
                  file=sys.stderr)
            return None

    ms = lambda r: f"{step_ms(r):.2f}" if r else "failed"
    ratio = lambda a, b: f"{step_ms(a) / step_ms(b):.3f}x" if a and b else ""
    gib = lambda r: (f"{r.get('peak_memory_bytes', 0) / 2**30:.2f}" if r
                     else "")
    lines = []
    for batch in args.batch_sizes:
        for precision in args.precisions:
            def case(graph, *flags):
                return attempt(lambda: cpp_case(
                    args.build_dir, "resnet50", precision, batch, True, args,
                    graph=graph, extra=list(flags)))
            plain = case(False, "--no-fused-bn")
            fused = case(False, "--fused-bn")
            plain_graph = case(True, "--no-fused-bn")
            fused_graph = case(True, "--fused-bn")
            # The bottleneck's fused tail (lamp::nn::conv_bn_add_relu; the
            # default in fp16) off and on, graphed.
            tail_off = case(True, "--fused-bn", "--no-fused-tail")
            tail_on = case(True, "--fused-bn", "--fused-tail")
            py = attempt(lambda: python_case("resnet50", precision, batch,
                                             True, args))
            lines.append((
                f"resnet50 bs{batch} NHWC {precision}", ms(plain), ms(fused),
                ratio(plain, fused), ms(plain_graph), ms(fused_graph),
                ratio(plain_graph, fused_graph), ms(tail_off), ms(tail_on),
                ratio(tail_off, tail_on), ms(py), ratio(py, fused),
                ratio(py, fused_graph), gib(plain), gib(fused),
                gib(plain_graph), gib(fused_graph), gib(tail_on), gib(py)))
            # NOTE: printed as it goes, so a run cut short still says
            # something.
            print("  ".join(lines[-1]), file=sys.stderr, flush=True)
    return header, lines


def print_table(header, lines, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
        for line in [header] + lines:
            print("  ".join(str(x).rjust(w) for x, w in zip(line, widths)))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed steps before the timed ones")
    p.add_argument("--quick", action="store_true", help="bs64 cases only")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also time lamp's examples with --cuda-graph")
    ints = lambda s: [int(x) for x in s.split(",")]
    p.add_argument("--ddp", action="store_true",
                   help="ResNet-50 fp16 channels-last DDP on 1 and 2 GPUs")
    p.add_argument("--gpus", type=ints, default=[1, 2],
                   help="with --ddp: GPU counts (default 1,2)")
    p.add_argument("--ddp-batch-sizes", type=ints, default=[256, 64],
                   help="with --ddp: batch sizes per GPU (default 256,64)")
    p.add_argument("--fused-bn", action="store_true",
                   help="ResNet-50 NHWC: lamp with and without its fused "
                        "BatchNorm+ReLU, eager and graphed, vs Python")
    p.add_argument("--batch-sizes", type=ints, default=[256, 64],
                   help="with --fused-bn: batch sizes (default 256,64)")
    p.add_argument("--precisions", type=lambda s: s.split(","),
                   default=["fp16", "bf16"],
                   help="with --fused-bn: precisions (default fp16,bf16)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="ResNet-50 cases: cuDNN autotuning in lamp "
                        "(--cudnn-benchmark) and Python alike")
    args = p.parse_args()
    if not args.no_build:
        if not os.path.exists(os.path.join(args.build_dir, "CMakeCache.txt")):
            run(["cmake", "-S", ROOT, "-B", args.build_dir, "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=Release"])
        run(["cmake", "--build", args.build_dir, "--target", "resnet50_amp",
             "mlp_amp"])
    if args.ddp:
        print_table(*ddp_rows(args), args.markdown)
        return
    if args.fused_bn:
        print_table(*fused_bn_rows(args), args.markdown)
        return
    cases = [c for c in CASES if not (args.quick and c[2] > 64)]
    rows = []
    for model, precision, batch, channels_last in cases:
        cpp = cpp_case(args.build_dir, model, precision, batch, channels_last,
                       args)
        py = python_case(model, precision, batch, channels_last, args)
        graph = (cpp_case(args.build_dir, model, precision, batch,
                          channels_last, args, graph=True)
                 if args.cuda_graph else None)
        rows.append((model, precision, batch, channels_last, cpp, py, graph))
    fp32 = {(m, b, cl): step_ms(c) for m, p_, b, cl, c, _, _ in rows
            if p_ == "fp32"}
    header = ("case", "C++ ms", "Python ms", "Py/C++", "C++ GiB",
              "Python GiB", "C++ AMP vs fp32")
    if args.cuda_graph:
        header += ("C++ graph ms", "Py/graph")
    lines = []
    for model, precision, batch, cl, cpp, py, graph in rows:
        layout = ("NHWC " if cl else "NCHW ") if model == "resnet50" else ""
        name = f"{model} bs{batch} {layout}{precision}"
        base = fp32.get((model, batch, cl))
        amp = f"{base / step_ms(cpp):.2f}x" if base and precision != "fp32" else ""
        lines.append((name, f"{step_ms(cpp):.2f}", f"{step_ms(py):.2f}",
                      f"{step_ms(py) / step_ms(cpp):.2f}x",
                      f"{cpp.get('peak_memory_bytes', 0) / 2**30:.2f}",
                      f"{py.get('peak_memory_bytes', 0) / 2**30:.2f}", amp)
                     + ((f"{step_ms(graph):.3f}",
                         f"{step_ms(py) / step_ms(graph):.2f}x")
                        if graph else ()))
    print_table(header, lines, args.markdown)


if __name__ == "__main__":
    main()
