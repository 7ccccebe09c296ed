"""The Python twin of build/benchmarks/add_layer_norm: a pre-LN block's
residual add and LayerNorm at GPT-2's shapes, as PyTorch runs them:
``s = x + r; y = F.layer_norm(s, (C,), w, b)`` under bf16 autocast, y cast
to bf16 for the next GEMM (with ``--residual-bias``, ``s = x + (r + r_bias)``),
eager and under ``torch.compile`` (default mode), forward and forward +
backward (``torch.autograd.grad`` of the sum and y, as the C++ side). Each
figure: the median of ``--repeats`` of the mean GPU time of one call over
``--steps`` calls replayed from a CUDA graph. One JSON line a shape and
implementation, in the C++ side's fields.

    python3 benchmarks/add_layer_norm.py [--columns 768,1024,1280,1600]
        [--rows 16384] [--steps 100] [--repeats 7] [--residual-bias]
        [--impl eager,compile]
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def add_norm(x, r, r_bias, w, b):
    if r_bias is not None:
        r = r.float() + r_bias.float()
    s = x + r
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = F.layer_norm(s, (s.shape[-1],), w, b)
    return s, y.to(torch.bfloat16)


def time_ms(args, device, call):
    def run():
        for _ in range(args.steps):
            call()

    if device.type == "cuda":
        # A capture on a side stream after warm-up calls there, as the C++
        # side's.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        run = graph.replay  # noqa: F811
    run()
    per_call = []
    for _ in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) * 1e3 / args.steps)
    return statistics.median(per_call)


def run_shape(args, device, impl, c):
    torch.manual_seed(0)
    x = torch.randn(args.rows, c, device=device, requires_grad=True)
    r = torch.randn(args.rows, c, device=device, dtype=torch.bfloat16, requires_grad=True)
    r_bias = torch.randn(c, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(c, device=device)).requires_grad_()
    b = (0.1 * torch.randn(c, device=device)).requires_grad_()
    dsum = torch.randn(args.rows, c, device=device)
    dy = torch.randn(args.rows, c, device=device, dtype=torch.bfloat16)
    bias = r_bias if args.residual_bias else None
    inputs = [x, r, w, b] + ([r_bias] if args.residual_bias else [])
    fn = torch.compile(add_norm) if impl == "compile" else add_norm

    def forward():
        with torch.no_grad():
            fn(x, r, bias, w, b)

    def forward_backward():
        s, y = fn(x, r, bias, w, b)
        torch.autograd.grad([s, y], inputs, [dsum, dy])

    for call in (forward, forward_backward):  # compiles outside the capture
        call()
    fwd = time_ms(args, device, forward)
    fwd_bwd = time_ms(args, device, forward_backward)
    n = args.rows * c
    bwd = fwd_bwd - fwd
    print(json.dumps({
        "impl": f"pytorch-{impl}",
        "op": "bias_add_layer_norm" if args.residual_bias else "add_layer_norm",
        "device": str(device), "rows": args.rows, "columns": c,
        "forward_ms": round(fwd, 4), "forward_tb_s": round(12 * n / 1e9 / fwd, 3),
        # The backward as the difference of two timings: null where noise
        # makes it nothing (tiny CPU runs).
        "forward_backward_ms": round(fwd_bwd, 4),
        "backward_ms": round(bwd, 4) if bwd > 0 else None,
        "backward_tb_s": round(16 * n / 1e9 / bwd, 3) if bwd > 0 else None,
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--columns", default="768,1024,1280,1600")
    p.add_argument("--rows", type=int, default=16 * 1024)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--residual-bias", action="store_true")
    p.add_argument("--impl", default="eager,compile")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("add_layer_norm.py: --device cuda but no CUDA device is available")
    for impl in args.impl.split(","):
        for c in (int(v) for v in args.columns.split(",")):
            run_shape(args, device, impl, c)


if __name__ == "__main__":
    main()
