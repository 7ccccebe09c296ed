"""torchvision's ImageFolder + DataLoader, the Python twin of
benchmarks/image_loader.cpp: RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize on PIL images in worker processes, pinned batches copied
to the GPU and cast to fp16 channels-last there.

  python benchmarks/image_loader.py --data DIR [--workers 16]
  python benchmarks/image_loader.py --data DIR --decode-jpeg-cuda

Prints one JSON line (images/s, CPU cores busy per 1,000 images/s counting
the worker processes). --decode-jpeg-cuda times decoding alone instead:
torchvision.io.decode_jpeg(device="cuda") on batches of the folder's RGB
and greyscale JPEGs, read into memory first (no crop, resize or copy).
"""

import argparse
import json
import resource
import time

import torch
from torchvision import datasets, transforms


def cpu_seconds():
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        u = resource.getrusage(who)
        total += u.ru_utime + u.ru_stime
    return total


def decode_jpeg_cuda(a):
    from PIL import Image
    from torchvision.io import decode_jpeg, read_file

    files = [path for path, _ in datasets.ImageFolder(a.data).samples]
    data = []
    for path in files:
        with Image.open(path) as img:
            if img.format == "JPEG" and img.mode in ("RGB", "L"):
                data.append(read_file(path))
    batches = [data[i:i + a.batch_size]
               for i in range(0, len(data) - a.batch_size + 1, a.batch_size)]
    for k in range(a.warmup):
        decode_jpeg(batches[k % len(batches)], device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for k in range(a.batches):
        decode_jpeg(batches[k % len(batches)], device="cuda")
    torch.cuda.synchronize()
    s = time.perf_counter() - start
    print(json.dumps({"impl": "torchvision.io.decode_jpeg", "decode": "cuda",
                      "batch_size": a.batch_size, "decode_only": True,
                      "images_per_s":
                          round(a.batches * a.batch_size / s, 1)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=256)
    # NOTE: the workers fill workers * prefetch_factor batches ahead before
    # the clock starts; time many more than that, or the queue's head start
    # reads as throughput (2026-11-30 run: 30 timed batches against 64
    # queued gave an inflated rate and almost no worker CPU time).
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--decode-jpeg-cuda", action="store_true")
    a = p.parse_args()
    if a.decode_jpeg_cuda:
        return decode_jpeg_cuda(a)
    t = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(a.data, transform=t)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
        pin_memory=True, drop_last=True, persistent_workers=True,
        prefetch_factor=2)
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        return x.cuda(non_blocking=True).to(
            torch.half, memory_format=torch.channels_last)

    for _ in range(a.warmup):
        next_batch()
    torch.cuda.synchronize()
    # Children's CPU time is counted when they exit: measure the workers'
    # through /proc instead.
    import os

    def tree_cpu():
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    cpu0 = tree_cpu()
    start = time.perf_counter()
    for _ in range(a.batches):
        x = next_batch()
    torch.cuda.synchronize()
    s = time.perf_counter() - start
    cpu = tree_cpu() - cpu0
    ips = a.batches * a.batch_size / s
    print(json.dumps({"impl": "torchvision", "decode": "cpu (PIL)",
                      "threads": a.workers, "batch_size": a.batch_size,
                      "images_per_s": round(ips, 1),
                      "cores_per_1000_images_per_s":
                          round(cpu / s / (ips / 1000), 2)}))


if __name__ == "__main__":
    main()
