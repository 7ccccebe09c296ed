"""Sums the GPU kernel time of a Kineto Chrome trace (resnet50_amp --trace,
torch.profiler's export_chrome_trace) per category: convolution, BatchNorm,
elementwise, pooling, optimizer, memcpy/memset and other; prints one table
per trace, per step when --steps says how many steps the trace holds, and
the largest kernels of each category with --top.

Usage: python3 tools/trace_summary.py TRACE.json [TRACE2.json ...]
           [--steps 5] [--top 5] [--markdown]
"""

import argparse
import collections
import gzip
import json
import re

# First match wins; names are lower-cased first. ATen's elementwise kernels
# come before the convolution patterns (a cast kernel may say "convert").
CATEGORIES = [
    ("batchnorm", re.compile(r"batch_?norm|(^|[^a-z])bn_(fw|bw|fwd|bwd)|"
                             r"bn_.*kernel")),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled")),
    ("conv", re.compile(r"fprop|dgrad|wgrad|conv|implicit_gemm|"
                        r"implicit_convolve|nchwtonhwc|nhwctonchw")),
    ("pooling", re.compile(r"pool")),
    ("optimizer", re.compile(r"multi_tensor|fused_adam|fusedadam|adam|"
                             r"_amp_|foreach|non_finite")),
    ("elementwise", re.compile(r"threshold|relu|fill|copy")),
    ("gemm", re.compile(r"gemm|cublas|cutlass")),
]


def category(event):
    cat = event.get("cat", "")
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy/memset"
    name = event.get("name", "").lower()
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and
            e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def summarize(path, steps, top):
    kernels = load(path)
    total = collections.Counter()
    count = collections.Counter()
    by_name = collections.defaultdict(collections.Counter)
    for e in kernels:
        label = category(e)
        dur = float(e.get("dur", 0)) / 1000.0  # us -> ms
        total[label] += dur
        count[label] += 1
        by_name[label][e.get("name", "?")] += dur
    return total, count, by_name


def table(header, rows, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header] + rows:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--steps", type=int, default=0,
                   help="steps in each trace: also print ms per step")
    p.add_argument("--top", type=int, default=0,
                   help="list the largest kernels of each category")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    order = ["conv", "batchnorm", "elementwise", "pooling", "optimizer",
             "gemm", "memcpy/memset", "other"]
    for path in args.traces:
        total, count, by_name = summarize(path, args.steps, args.top)
        all_ms = sum(total.values())
        print(f"\n{path}: {sum(count.values())} GPU kernels/copies, "
              f"{all_ms:.2f} ms GPU time"
              + (f" ({all_ms / args.steps:.2f} ms per step)"
                 if args.steps else ""))
        if not all_ms:
            print("  no GPU kernels in this trace (a CPU run?)")
            continue
        header = ["category", "kernels", "ms", "share"]
        if args.steps:
            header.append("ms/step")
        rows = []
        for label in order:
            if not count[label]:
                continue
            row = [label, str(count[label]), f"{total[label]:.2f}",
                   f"{100 * total[label] / all_ms:.1f} %"]
            if args.steps:
                row.append(f"{total[label] / args.steps:.3f}")
            rows.append(row)
        table(header, rows, args.markdown)
        if args.top:
            for label in order:
                if not count[label]:
                    continue
                print(f"\n  largest {label} kernels:")
                for name, ms in by_name[label].most_common(args.top):
                    per = f" ({ms / args.steps:.3f} ms/step)" if args.steps \
                        else ""
                    print(f"    {ms:9.3f} ms{per}  {name[:140]}")


if __name__ == "__main__":
    main()
