#!/usr/bin/env python3
"""Per-epoch step times of resnet50_amp --metrics files (--log-every 1).

Usage: epoch_steps.py FILE.jsonl...  For each file: the steps per epoch
(from its `epoch` records), then per epoch the number of timed steps, the
mean and median step (ms) and the first three steps' times (and, where the
records have the loader's `gpu_decoded` / `cpu_decoded` counts, the GPU's
share of the first steps' images and of the epoch's); a file without epochs
(synthetic data) is one group. Files named NAME_SET_CASE_REP.jsonl
(image_pipeline.sh resize) also get a table at the end: per set and case, the
whole-run means of its rounds and their mean against NAME_synthetic_REP's.
"""
import json
import os
import re
import statistics
import sys


def rounds_table(means):
    """means: {path: whole-run mean}; prints the cases of NAME_SET_CASE_REP files."""
    cases, synthetic = {}, {}
    for path, mean in means.items():
        m = re.match(r"(.+)_(\d+)\.jsonl$", os.path.basename(path))
        if not m:
            continue
        parts = m.group(1).split("_")
        if parts[-1] == "synthetic":
            synthetic[m.group(2)] = mean
        elif len(parts) >= 3:
            cases.setdefault((parts[-2], parts[-1]), []).append((m.group(2), mean))
    if not cases or not synthetic:
        return
    print("rounds (whole-run mean ms, each round's; mean; over synthetic):")
    for (dataset, case), runs in sorted(cases.items()):
        runs.sort()
        over = [mean / synthetic[r] - 1 for r, mean in runs if r in synthetic]
        print(f"  {dataset:6} {case:8} "
              + ", ".join(f"{mean:.2f}" for _, mean in runs)
              + f"; {statistics.mean(m for _, m in runs):.2f}"
              + (f"; {100 * statistics.mean(over):+.1f} %" if over else ""))


def main(paths):
    means = {}
    for path in paths:
        steps, epoch_ends = [], []
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") == "step":
                    steps.append(r)
                elif r.get("kind") == "epoch":
                    epoch_ends.append(r["step"])
        if not steps:
            print(f"{path}: no steps")
            continue
        # `step` in step records counts timed steps (after --warmup); epoch
        # records count all steps. Warm-up = first epoch end - timed steps in it.
        total = len(steps)
        warmup = (epoch_ends[-1] - steps[-1]["step"]) if epoch_ends else 0
        groups, shares = {}, {}
        for r in steps:
            s = r["step"] + warmup  # steps done after this one
            e = sum(1 for end in epoch_ends if s > end)
            groups.setdefault(e, []).append(r["step_ms"])
            if "gpu_decoded" in r:  # resnet50_amp --data
                n = r["gpu_decoded"] + r["cpu_decoded"]
                shares.setdefault(e, []).append(r["gpu_decoded"] / max(n, 1))
        allms = [r["step_ms"] for r in steps]
        means[path] = statistics.mean(allms)
        print(f"{path}: {total} timed steps, mean {statistics.mean(allms):.2f} "
              f"median {statistics.median(allms):.2f} ms")
        for e, ms in sorted(groups.items()):
            print(f"  epoch {e}: {len(ms)} steps, mean {statistics.mean(ms):.2f}, "
                  f"median {statistics.median(ms):.2f}, first "
                  + " ".join(f"{m:.1f}" for m in ms[:3])
                  + f", max {max(ms):.1f}"
                  + (", GPU's share of the images, first steps "
                     + " ".join(f"{g:.2f}" for g in shares[e][:4])
                     + f", mean {statistics.mean(shares[e]):.2f}"
                     if e in shares else ""))


    rounds_table(means)


if __name__ == "__main__":
    main(sys.argv[1:])
