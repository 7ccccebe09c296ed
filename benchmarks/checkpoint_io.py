"""Python twin of benchmarks/checkpoint_io.cpp: torch.save / torch.load of
torchvision's ResNet-50, Adam(fused=True) and GradScaler state dicts.

Usage: checkpoint_io.py [--device cuda] [--dir /tmp] [--repeats 5]
"""

import argparse
import os
import statistics
import time
import warnings

warnings.filterwarnings("ignore")

import torch
import torchvision


def median_ms(repeats, f):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(device)
    opt = torch.optim.Adam(model.parameters(), fused=True)
    scaler = torch.amp.GradScaler(device.type)
    loss = model(torch.randn(2, 3, 64, 64, device=device)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    path = os.path.join(args.dir, "python_checkpoint_io.pt")

    def save():
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict(), "step": 1,
                    "rng": torch.get_rng_state()}, path)
        with open(path, "rb+") as f:  # as durable as lamp's (fsync)
            os.fsync(f.fileno())

    def load():
        ckpt = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        if device.type == "cuda":
            torch.cuda.synchronize()

    save_ms = median_ms(args.repeats, save)
    load_ms = median_ms(args.repeats, load)
    size = os.path.getsize(path) / 2**20
    os.remove(path)
    print(f"torch {torch.__version__}")
    print(f"Python ResNet-50 + Adam(fused) + GradScaler on {device}: "
          f"{size:.1f} MiB file, save {save_ms:.1f} ms, load {load_ms:.1f} ms "
          f"(median of {args.repeats})")


if __name__ == "__main__":
    main()
