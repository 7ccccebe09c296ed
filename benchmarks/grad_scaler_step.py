"""Python twin of grad_scaler_step.cpp: one AMP step of an MLP 784-512-10 with
torch.amp.GradScaler, torch.optim.Adam (default, foreach) vs fused=True.

Usage: python3 grad_scaler_step.py [--batch-size 64] [--steps 200] [--repeats 7]
"""

import argparse
import time

import torch


def time_ms(args, device, step):
    for _ in range(args.warmup):
        step()
    per_step = []
    for _ in range(args.repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        per_step.append((time.perf_counter() - start) * 1000 / args.steps)
    return sorted(per_step)[len(per_step) // 2]


def run(args, device, fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), fused=fused or None)
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device)
    x = torch.randn(args.batch_size, 784, device=device)
    y = torch.randint(10, (args.batch_size,), device=device)

    def step():
        optimizer.zero_grad()
        with torch.autocast(device, dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return time_ms(args, device, step)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}")
    adam = run(args, args.device, False)
    fused = run(args, args.device, True)
    print(f"{'optimizer':32} {'ms/step':>8}")
    print(f"{'Python torch.optim.Adam':32} {adam:8.3f}")
    print(f"{'Python Adam(fused=True)':32} {fused:8.3f}")


if __name__ == "__main__":
    main()
