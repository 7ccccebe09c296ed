"""Plots GPT-2's training loss, lamp (examples/gpt_amp) against its PyTorch
twin (benchmarks/gpt2.py) from the same initial weights, batches and
learning-rate schedule (tools/gpu/gpt2_loss.sh runs both), and prints the
comparison: the loss at a few steps, the mean of the last 100 logged steps of
each and their relative difference, and lamp's validation losses.

Left: the loss against the step, each logged point faint and a moving
average of 5 logged points on top, lamp's validation losses as markers.
Right: lamp's loss minus PyTorch's at the same steps (the same moving
average), to show whether the two drift apart.

Usage (the defaults are the committed files):
  python3 benchmarks/gpt2_loss_plot.py [--lamp L.jsonl] [--pytorch P.jsonl] \
      [--out benchmarks/img/gpt2_loss_lamp_vs_pytorch.png]
Two lamp runs (tools/gpu/gpt2_loss.sh with PRECISIONS="bf16 fp8"): name
them, e.g. --lamp lamp_fp8_loss.jsonl --pytorch lamp_loss.jsonl
--labels "lamp fp8" "lamp bf16".
Needs matplotlib.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SMOOTH = 5  # logged points in the moving average
TAIL = 100  # logged points in the final mean
CHECKPOINTS = (10, 100, 500, 1000, 1500, 2000)


def read(path):
    """(steps, eval rows, summary row) of a --metrics file."""
    steps, evals, summary = {}, [], None
    if not os.path.exists(path):
        print(f"{path}: missing")
        return steps, evals, summary
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row["kind"] == "step":
                steps[row["step"]] = row["loss"]
            elif row["kind"] == "eval":
                evals.append(row)
            elif row["kind"] == "summary":
                summary = row
    return steps, evals, summary


def moving_average(y, n=SMOOTH):
    """Trailing mean of up to n points (the first points over fewer)."""
    c = np.cumsum(np.insert(np.asarray(y, dtype=float), 0, 0.0))
    i = np.arange(1, len(y) + 1)
    lo = np.maximum(i - n, 0)
    return (c[i] - c[lo]) / (i - lo)


def cell(series, step):
    return f"{series[step]:8.4f}" if step in series else f"{'-':>8}"


def report(lamp, torch_, lamp_evals, lamp_sum, torch_sum, labels):
    a_name, b_name = labels
    common = sorted(set(lamp) & set(torch_))
    print(f"logged steps: {a_name} {len(lamp)}, {b_name} {len(torch_)}, common {len(common)}"
          + (f" ({common[0]}..{common[-1]})" if common else ""))
    for name, s in ((a_name, lamp_sum), (b_name, torch_sum)):
        if s:
            print(f"{name:8} summary: {s['ms_per_step']:.2f} ms/step (median), "
                  f"final loss {s['final_loss']:.4f}, device {s.get('device')}")
    print(f"{'step':>6} {a_name[:8]:>8} {b_name[:8]:>8} {'diff':>8}")
    for step in CHECKPOINTS:
        diff = (f"{lamp[step] - torch_[step]:+8.4f}" if step in lamp and step in torch_
                else f"{'-':>8}")
        print(f"{step:>6} {cell(lamp, step)} {cell(torch_, step)} {diff}")
    means = {}
    for name, series in ((a_name, lamp), (b_name, torch_)):
        # The same steps for both where both have them.
        tail = (common or sorted(series))[-TAIL:]
        if tail:
            means[name] = np.mean([series[s] for s in tail])
            print(f"{name}: mean of the last {len(tail)} logged steps ({tail[0]}..{tail[-1]}, "
                  f"every {tail[1] - tail[0] if len(tail) > 1 else 0}): {means[name]:.4f}")
    if len(means) == 2:
        a, b = means[a_name], means[b_name]
        print(f"{a_name} vs {b_name} over those steps: {100 * (a - b) / b:+.2f} %")
    for e in lamp_evals:
        print(f"{a_name} validation loss at step {e['step']}: {e['val_loss']:.4f}")


def plot(lamp, torch_, lamp_evals, lamp_sum, torch_sum, out, labels):
    a_name, b_name = labels
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(12, 4.5),
                                  gridspec_kw={"width_ratios": [3, 2]})
    for name, series, color in ((a_name, lamp, "tab:orange"),
                                (b_name, torch_, "tab:blue")):
        if not series:
            continue
        x = np.array(sorted(series))
        y = np.array([series[s] for s in x])
        ax.plot(x, y, color=color, alpha=0.2, lw=0.8)
        ax.plot(x, moving_average(y), color=color, lw=1.6, label=name)
    if lamp_evals:
        ax.plot([e["step"] for e in lamp_evals], [e["val_loss"] for e in lamp_evals],
                "D", color="tab:red", ms=5, label=f"{a_name} validation loss")
    ax.set(xlabel="step", ylabel="training loss (cross-entropy, nats)",
           title="GPT-2 124M, batch 16x1024, same initial weights and batches")
    ax.grid(alpha=0.3)
    ax.legend()

    common = np.array(sorted(set(lamp) & set(torch_)))
    diff = np.array([lamp[s] - torch_[s] for s in common])
    dax.axhline(0, color="black", lw=0.8)
    dax.plot(common, diff, color="tab:purple", alpha=0.2, lw=0.8)
    dax.plot(common, moving_average(diff), color="tab:purple", lw=1.6)
    dax.set(xlabel="step", ylabel=f"{a_name} loss - {b_name} loss",
            title=f"difference (moving average of {SMOOTH} logged points)")
    dax.grid(alpha=0.3)
    device = (lamp_sum or torch_sum or {}).get("device", "")
    if torch_sum and torch_sum.get("device"):
        device = torch_sum["device"]
    fig.suptitle(f"{a_name} vs {b_name}: training loss every 10 steps, faint: raw  "
                 f"({device})", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(out)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lamp", default=os.path.join(HERE, "data", "gpt2_loss_lamp.jsonl"))
    p.add_argument("--pytorch", default=os.path.join(HERE, "data", "gpt2_loss_pytorch.jsonl"))
    p.add_argument("--out", default=os.path.join(HERE, "img", "gpt2_loss_lamp_vs_pytorch.png"))
    p.add_argument("--labels", nargs=2, metavar=("LAMP", "PYTORCH"),
                   default=["lamp bf16", "PyTorch bf16"],
                   help="the two runs' names in the report and the plot")
    args = p.parse_args()
    lamp, lamp_evals, lamp_sum = read(args.lamp)
    torch_, _, torch_sum = read(args.pytorch)
    report(lamp, torch_, lamp_evals, lamp_sum, torch_sum, args.labels)
    plot(lamp, torch_, lamp_evals, lamp_sum, torch_sum, args.out, args.labels)


if __name__ == "__main__":
    main()
