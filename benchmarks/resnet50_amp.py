"""Python twin of examples/resnet50_amp: torchvision ResNet-50, synthetic
data, Adam (fused, as lamp's FusedAdam), cross-entropy, autocast + GradScaler
for fp16. Prints one JSON summary line like the C++ example's --metrics.
With --ddp (under torchrun): torch.nn.parallel.DistributedDataParallel over
NCCL, one GPU a process, --batch-size per GPU, images/s over all GPUs, rank 0
prints.

With --compile MODE the model is torch.compile'd (its compilation happens in
the warm-up steps and is not timed).

Usage: resnet50_amp.py --precision fp16 [--batch-size 64] [--channels-last]
           [--compile default] ...
       torchrun --nproc_per_node=2 resnet50_amp.py --ddp --precision fp16 ...
"""

import argparse
import json
import os
import time
import warnings

warnings.filterwarnings("ignore")

import torch
import torchvision


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ddp", action="store_true",
                   help="DistributedDataParallel over torchrun's processes")
    p.add_argument("--compile", choices=["default", "reduce-overhead",
                                         "max-autotune-no-cudagraphs"],
                   help="torch.compile the model with this mode")
    args = p.parse_args()
    rank, world_size = 0, 1
    device = torch.device(args.device)
    if args.ddp:
        if "LOCAL_RANK" not in os.environ:
            p.error("--ddp needs torchrun's environment: "
                    "torchrun --nproc_per_node=N resnet50_amp.py --ddp ...")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
        world_size = torch.distributed.get_world_size()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50().to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index], bucket_cap_mb=25)
        torch.manual_seed(args.seed + rank)  # each rank its own data
    if args.compile:
        model = torch.compile(model, mode=args.compile)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    amp = args.precision != "fp32"
    dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                         device=device).contiguous(memory_format=fmt)
    labels = torch.randint(1000, (args.batch_size,), device=device)
    times = []
    for step in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1000)
    median = sorted(times)[len(times) // 2]
    if rank == 0:
        print(json.dumps({
            "kind": "summary", "model": "resnet50", "precision": args.precision,
            "world_size": world_size, "batch_size": args.batch_size,
            "channels_last": args.channels_last, "compile": args.compile,
            "cudnn_benchmark": args.cudnn_benchmark,
            "median_step_ms": median,
            "images_per_s": world_size * args.batch_size * 1000 / median,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
            "final_loss": loss.item(), "final_scale": scaler.get_scale(),
        }), flush=True)
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
