"""Python twin of examples/mlp_amp's training loop, for timing: MLP
784-512-10 on Fashion-MNIST held on the device, batch 64, Adam (fused) with a
linear learning-rate decay, autocast + GradScaler for fp16. Prints one JSON
summary line like the C++ example's --metrics.

Usage: mlp_amp.py --precision fp16 [--epochs 1] [--data DIR]
"""

import argparse
import gzip
import json
import time
import warnings

warnings.filterwarnings("ignore")

import torch


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()[offset:]), dtype=torch.uint8)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    x = ((idx(f"{args.data}/train-images-idx3-ubyte.gz", 16).view(-1, 784)
          .float() / 255 - 0.2860) / 0.3530).to(device)
    y = idx(f"{args.data}/train-labels-idx1-ubyte.gz", 8).long().to(device)
    tx = ((idx(f"{args.data}/t10k-images-idx3-ubyte.gz", 16).view(-1, 784)
           .float() / 255 - 0.2860) / 0.3530).to(device)
    ty = idx(f"{args.data}/t10k-labels-idx1-ubyte.gz", 8).long().to(device)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    amp = args.precision != "fp32"
    dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    n = x.shape[0]
    total = args.epochs * ((n + args.batch_size - 1) // args.batch_size)
    step, elapsed = 0, 0.0
    for _ in range(args.epochs):
        order = torch.randperm(n, device=device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(0, n, args.batch_size):
            index = order[i:i + args.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = args.lr * (1 - step / total)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=dtype, enabled=amp):
                loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
        if cuda:
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=amp):
        accuracy = (model(tx).argmax(1) == ty).float().mean().item()
    print(json.dumps({
        "kind": "summary", "model": "mlp", "precision": args.precision,
        "batch_size": args.batch_size, "epochs": args.epochs,
        "ms_per_step": elapsed * 1000 / step, "test_accuracy": accuracy,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
    }))


if __name__ == "__main__":
    main()
