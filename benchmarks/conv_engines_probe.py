#!/usr/bin/env python3
"""Are ResNet-50's bf16 convolutions slow because of cuDNN's kernels or
because of the plans ATen picks? Layer by layer on this GPU.

bf16 ResNet-50 runs ~11 % slower a step than fp16 in lamp (issue 26's goal
is 10 %); traces put 1.5 ms of the difference in forward convolutions for
which cuDNN's heuristics pick sm80 CUTLASS kernels, and cudnn.benchmark
(which times the plans of heuristics mode INSTANT and the fallback list)
recovers 0.2 ms. This script times, for the stem and every distinct
bottleneck convolution of torchvision's ResNet-50 (channels-last), in fp16
and bf16, forward (fprop), input gradient (dgrad) and weight gradient
(wgrad):

  aten      ATen's convolution with cudnn.benchmark on (what lamp runs);
  first     the cuDNN graph API's first plan of heuristics mode A;
  best      the fastest of the first --max-plans plans of heuristics
            modes A, B and the fallback list (each built, run and timed);

and sums each column over the network with each layer's count. Times are
Kineto kernel time (host overhead does not count), the mean of --iters
calls. A last table gives the bf16 / fp16 ratio of the sums.

Needs the PyPI package nvidia-cudnn-frontend (its Python module `cudnn`)
and a CUDA GPU. Usage:
  python3 benchmarks/conv_engines_probe.py [--batch-size 256] [--iters 20]
      [--ops fprop,wgrad,dgrad] [--max-plans 16]
  python3 benchmarks/conv_engines_probe.py --stem [--iters 20]
(--stem: the stem alone, ATen only, its input with 3, 4 or 8 channels.)
"""

import argparse
import sys

import torch

sys.path.insert(0, "benchmarks")
from bn_fusion_probe import LAYERS, event_us, kernel_us  # noqa: E402

# The stem (3 -> 64, 7x7, stride 2, padding 3, 224x224 input) first; then
# bn_fusion_probe's 23 bottleneck shapes (their padding is kernel // 2).
STEM = (3, 64, 7, 2, 224, 1, False)
SHAPES = [STEM] + LAYERS
DTYPES = {"fp16": torch.half, "bf16": torch.bfloat16}


def cudnn_type(dtype):
    import cudnn

    return cudnn.data_type.HALF if dtype == torch.half else cudnn.data_type.BFLOAT16


class Graph:
    """One convolution (fprop, dgrad or wgrad) on the cuDNN graph API with
    the plans of heuristics A, B and FALLBACK (each built when first run)."""

    def __init__(self, handle, op, x, w, dy, stride, pad):
        import cudnn

        g = cudnn.pygraph(
            io_data_type=cudnn_type(x.dtype),
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        conv = dict(padding=[pad, pad], stride=[stride, stride], dilation=[1, 1])
        if op == "fprop":
            X, W = g.tensor_like(x), g.tensor_like(w)
            out = g.conv_fprop(image=X, weight=W, **conv)
            self.out = torch.empty_like(dy)
            pack = {X: x, W: w}
        elif op == "dgrad":
            DY, W = g.tensor_like(dy), g.tensor_like(w)
            out = g.conv_dgrad(loss=DY, filter=W, **conv)
            # NOTE: dims only (ambiguous for a strided convolution); cuDNN
            # infers the NHWC strides from dy, as bn_fusion_backward_probe.
            out.set_dim(list(x.shape))
            self.out = torch.empty_like(x)
            pack = {DY: dy, W: w}
        else:
            X, DY = g.tensor_like(x), g.tensor_like(dy)
            out = g.conv_wgrad(image=X, loss=DY, **conv)
            out.set_dim(list(w.shape)).set_stride(list(w.stride()))
            self.out = torch.empty_like(w)
            pack = {X: x, DY: dy}
        out.set_output(True)
        pack[out] = self.out
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(
            [cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK]
        )
        g.check_support()
        self.g, self.pack, self.handle = g, pack, handle
        self.ws = torch.empty(1, device="cuda", dtype=torch.uint8)
        self.built = set()

    def plans(self):
        return self.g.get_execution_plan_count()

    def runner(self, i):
        if i not in self.built:
            self.g.build_plan_at_index(i)
            self.built.add(i)
        ws = self.g.get_workspace_size_plan_at_index(i)
        if ws > self.ws.numel():
            self.ws = torch.empty(ws, device="cuda", dtype=torch.uint8)
        return lambda: self.g.execute_plan_at_index(self.pack, self.ws, i, handle=self.handle)

    def name(self, i):
        try:
            return self.g.get_plan_name_at_index(i)
        except Exception:  # noqa: BLE001 - older frontends
            return f"plan {i}"


def aten_fn(op, x, w, dy, stride, pad):
    f = torch.ops.aten.convolution_backward
    if op == "fprop":
        return lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    mask = [True, False, False] if op == "dgrad" else [False, True, False]
    return lambda: f(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask)


def probe(handle, n, shape, dtype, op, iters, max_plans):
    cin, cout, k, stride, hw, _count, _ = shape
    pad = k // 2
    cl = torch.channels_last
    x = torch.randn(n, cin, hw, hw, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    w = torch.randn(cout, cin, k, k, device="cuda", dtype=dtype) * (cin * k * k) ** -0.5
    w = w.contiguous(memory_format=cl)
    ho = (hw + 2 * pad - k) // stride + 1
    dy = torch.randn(n, cout, ho, ho, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    row = {"aten": kernel_us(aten_fn(op, x, w, dy, stride, pad), iters)}
    row["first"] = row["best"] = None
    try:
        g = Graph(handle, op, x, w, dy, stride, pad)
    except Exception as e:  # noqa: BLE001 - an unsupported graph is data
        print(f"  {op} {shape} {dtype}: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
        return row
    timed = []
    for i in range(min(g.plans(), max_plans)):
        try:
            run = g.runner(i)
            timed.append((event_us(run, 5), i))
        except Exception:  # noqa: BLE001 - a plan that does not build or run
            continue
    if not timed:
        return row
    first = min(i for _, i in timed)
    row["first"] = kernel_us(g.runner(first), iters)
    best = min(timed)[1]
    row["best"] = kernel_us(g.runner(best), iters)
    row["plans"] = len(timed)
    row["best_name"] = g.name(best)
    return row


def space_to_depth(x, channels):
    """The stem's input padded by 3 and rearranged 2x2 into channels
    (c, r, s), zero channels up to `channels`; channels-last."""
    y = torch.nn.functional.pixel_unshuffle(torch.nn.functional.pad(x, (3, 3, 3, 3)), 2)
    if channels > y.size(1):
        y = torch.nn.functional.pad(y, (0, 0, 0, 0, 0, channels - y.size(1)))
    return y.contiguous(memory_format=torch.channels_last)


def weight_to_depth(w, channels):
    """The 7x7 kernel padded to 8x8 and rearranged like the input: 4x4."""
    o, c = w.size(0), w.size(1)
    w8 = torch.nn.functional.pad(w, (0, 1, 0, 1))
    w2 = w8.reshape(o, c, 4, 2, 4, 2).permute(0, 1, 3, 5, 2, 4).reshape(o, 4 * c, 4, 4)
    if channels > w2.size(1):
        w2 = torch.nn.functional.pad(w2, (0, 0, 0, 0, 0, channels - w2.size(1)))
    return w2.contiguous(memory_format=torch.channels_last)


def stem_variants(iters):
    """The stem alone, ATen with cudnn.benchmark: its 3-channel NHWC input
    as it is, padded with zero channels to 4 or 8 (the weight too: the same
    output), NCHW, and rearranged 2x2 space-to-depth; forward and weight
    gradient, fp16 and bf16."""
    cl = torch.channels_last
    print("| dtype | input | fprop us | wgrad us |")
    print("| --- | --- | ---: | ---: |")
    for dn, dt in DTYPES.items():
        dy = torch.randn(256, 64, 112, 112, device="cuda", dtype=dt).contiguous(memory_format=cl)
        for c, fmt in ((3, cl), (4, cl), (8, cl), (3, torch.contiguous_format)):
            x = torch.randn(256, c, 224, 224, device="cuda", dtype=dt).contiguous(memory_format=fmt)
            w = (torch.randn(64, c, 7, 7, device="cuda", dtype=dt) * 0.05).contiguous(memory_format=fmt)
            f = lambda: torch.nn.functional.conv2d(x, w, stride=2, padding=3)
            g = lambda: torch.ops.aten.convolution_backward(
                dy, x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [False, True, False])
            name = f"{c} channels, {'NHWC' if fmt is cl else 'NCHW'}"
            print(f"| {dn} | {name} | {kernel_us(f, iters):.1f} | {kernel_us(g, iters):.1f} |", flush=True)
        # The 2x2 space-to-depth form (lamp::nn::space_to_depth_conv2d):
        # a 4x4 stride-1 convolution over 12 channels, or 16 with zeros,
        # and the rearrangement as pad + pixel_unshuffle (+ pad).
        x = torch.randn(256, 3, 224, 224, device="cuda", dtype=dt).contiguous(memory_format=cl)
        w = (torch.randn(64, 3, 7, 7, device="cuda", dtype=dt) * 0.05).contiguous(memory_format=cl)
        for c in (12, 16):
            s2d = lambda: space_to_depth(x, c)
            xs, ws = s2d(), weight_to_depth(w, c)
            f = lambda: torch.nn.functional.conv2d(xs, ws)
            g = lambda: torch.ops.aten.convolution_backward(
                dy, xs, ws, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False])
            print(f"| {dn} | space-to-depth, {c} channels, 4x4 | {kernel_us(f, iters):.1f}"
                  f" | {kernel_us(g, iters):.1f} |", flush=True)
            print(f"| {dn} | (the rearrangement, {c} channels) | {kernel_us(s2d, iters):.1f} | |",
                  flush=True)
    # Zero channels change nothing: the padded convolution's output equals
    # the 3-channel one's.
    x = torch.randn(8, 3, 64, 64, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
    w = torch.randn(64, 3, 7, 7, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, 0, 0, 1)).contiguous(memory_format=cl)
    y3 = torch.nn.functional.conv2d(x, w, stride=2, padding=3)
    y4 = torch.nn.functional.conv2d(pad(x), pad(w), stride=2, padding=3)
    print(f"\npadded against 3 channels, fp16: largest difference {(y3 - y4).abs().max().item()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--ops", default="fprop,wgrad,dgrad")
    p.add_argument("--max-plans", type=int, default=16)
    p.add_argument("--stem", action="store_true", help="only the stem's variants (ATen)")
    a = p.parse_args()
    if a.stem:
        torch.backends.cudnn.benchmark = True
        stem_variants(a.iters)
        return
    import cudnn

    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    sums = {}
    print("| op | shape (cin, cout, k, s, hw) | count | dtype | aten us | first us | best us | plans | best plan |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for op in a.ops.split(","):
        for shape in SHAPES:
            if op == "dgrad" and shape is STEM:
                continue  # the stem's input needs no gradient
            for dn, dtype in DTYPES.items():
                r = probe(handle, a.batch_size, shape, dtype, op, a.iters, a.max_plans)
                count = shape[5]
                for col in ("aten", "first", "best"):
                    key = (op, dn, col)
                    v = r[col] if r[col] is not None else r["aten"]
                    sums[key] = sums.get(key, 0.0) + v * count
                f = lambda v: "–" if v is None else f"{v:.1f}"
                print(
                    f"| {op} | {shape[:5]} | {count} | {dn} | {f(r['aten'])} | {f(r['first'])}"
                    f" | {f(r['best'])} | {r.get('plans', 0)} | {r.get('best_name', '')} |",
                    flush=True,
                )
    print()
    print("| op | dtype | aten ms a step | first ms | best ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for op in a.ops.split(","):
        for dn in DTYPES:
            s = [sums[(op, dn, c)] / 1000 for c in ("aten", "first", "best")]
            print(f"| {op} | {dn} | {s[0]:.3f} | {s[1]:.3f} | {s[2]:.3f} |")
    print()
    for col in ("aten", "first", "best"):
        tot = {dn: sum(sums[(op, dn, col)] for op in a.ops.split(",")) / 1000 for dn in DTYPES}
        print(f"{col}: fp16 {tot['fp16']:.3f} ms, bf16 {tot['bf16']:.3f} ms, bf16/fp16 {tot['bf16'] / tot['fp16']:.3f}")
    # (a missing graph-API time counts as ATen's in the sums)


if __name__ == "__main__":
    main()
