"""Turns the JSON lines that lamp's examples write with --metrics into PNGs.

Usage: python3 tools/plot_metrics.py METRICS.jsonl [MORE.jsonl ...] --out DIR

Writes, per model found in the files:
  <model>_curves.png  loss, loss scale and throughput (images/s or tokens/s,
                      where the records have it) over steps, one line per
                      precision
  <model>_bars.png    step time and peak memory per precision (from the
                      summary lines), fp32 / fp16 / bf16 side by side
Needs matplotlib.
"""

import argparse
import json
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["fp32", "fp16", "bf16"]
COLORS = {"fp32": "tab:gray", "fp16": "tab:blue", "bf16": "tab:orange"}


def read(paths):
    steps = defaultdict(lambda: defaultdict(list))  # model -> precision -> rows
    summaries = defaultdict(dict)  # model -> precision -> row
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                model, precision = row.get("model", "model"), row["precision"]
                if row["kind"] == "step":
                    steps[model][precision].append(row)
                elif row["kind"] == "summary":
                    summaries[model][precision] = row
    return steps, summaries


def throughput_key(per_precision):
    """The records' throughput field (images_per_s or tokens_per_s), if any."""
    for rows in per_precision.values():
        for key in ("images_per_s", "tokens_per_s"):
            if any(key in r for r in rows):
                return key
    return None


def plot_curves(model, per_precision, out):
    rate = throughput_key(per_precision)
    fig, axes = plt.subplots(1, 3 if rate else 2, figsize=(16 if rate else 11, 4))
    loss_ax, scale_ax = axes[0], axes[1]
    for precision in sorted(per_precision, key=ORDER.index):
        rows = per_precision[precision]
        x = [r["step"] for r in rows]
        loss_ax.plot(x, [r["loss"] for r in rows], label=precision,
                     color=COLORS[precision])
        scale_ax.plot(x, [r["scale"] for r in rows], label=precision,
                      color=COLORS[precision])
        if rate:
            timed = [r for r in rows if rate in r]
            axes[2].plot([r["step"] for r in timed], [r[rate] for r in timed],
                         label=precision, color=COLORS[precision])
    loss_ax.set(title=f"{model}: training loss", xlabel="step", ylabel="loss")
    scale_ax.set(title=f"{model}: loss scale (GradScaler)", xlabel="step",
                 ylabel="scale", yscale="log")
    if rate:
        unit = rate.replace("_per_s", "")
        axes[2].set(title=f"{model}: throughput", xlabel="step",
                    ylabel=f"{unit} / s")
        axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_bars(model, per_precision, out):
    precisions = sorted(per_precision, key=ORDER.index)
    rows = [per_precision[p] for p in precisions]
    time_key = "median_step_ms" if "median_step_ms" in rows[0] else "ms_per_step"
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(10, 4))
    colors = [COLORS[p] for p in precisions]
    times = [r[time_key] for r in rows]
    time_ax.bar(precisions, times, color=colors)
    time_ax.set(title=f"{model}: step time", ylabel="ms / step")
    for i, t in enumerate(times):
        time_ax.annotate(f"{t:.1f}", (i, t), ha="center", va="bottom")
    memory = [r.get("peak_memory_bytes", 0) / 2**30 for r in rows]
    mem_ax.bar(precisions, memory, color=colors)
    mem_ax.set(title=f"{model}: peak device memory", ylabel="GiB")
    for i, m in enumerate(memory):
        mem_ax.annotate(f"{m:.2f}", (i, m), ha="center", va="bottom")
    setup = rows[0]
    fig.suptitle(
        f"batch {setup.get('batch_size')}, {setup.get('device', '')}"
        + (", channels-last" if setup.get("channels_last") else ""))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("metrics", nargs="+", help="JSON-lines files")
    parser.add_argument("--out", default=".", help="folder for the PNGs")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    steps, summaries = read(args.metrics)
    for model, per_precision in steps.items():
        path = os.path.join(args.out, f"{model}_curves.png")
        plot_curves(model, per_precision, path)
        print(path)
    for model, per_precision in summaries.items():
        path = os.path.join(args.out, f"{model}_bars.png")
        plot_bars(model, per_precision, path)
        print(path)


if __name__ == "__main__":
    main()
