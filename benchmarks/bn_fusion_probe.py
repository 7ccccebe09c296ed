#!/usr/bin/env python3
"""How much of ResNet-50's BatchNorm forward the cuDNN graph API can fold
into the convolutions, measured layer by layer on this GPU.

Issue 14's remaining goals (batch 64 graphed <= 10 ms, 1.5x torch.compile)
need fewer passes over the activations, not faster ones: lamp's fused
BatchNorm already runs cuDNN's one-kernel NHWC BatchNorm+add+ReLU. MLPerf's
ResNet-50 computes each BatchNorm's statistics in the previous
convolution's epilogue (cuDNN "genstats") and applies scale, bias and ReLU
in the next convolution's prologue, so a BatchNorm+ReLU costs no pass of
its own. This script measures, for every distinct convolution of
torchvision's ResNet-50 (fp16, channels-last), the kernel time of

  conv              the convolution alone (cuDNN graph API)
  conv+stats        the convolution with genstats in its epilogue
  sbr+conv+stats    scale+bias+ReLU prologue, convolution, genstats
                    (only where the input is a BatchNorm+ReLU output)
  bn                today's BatchNorm forward (ATen's, the same cuDNN
                    NHWC kernel lamp's BatchNormAct2d runs) on its output

and sums them over the network with each layer's count. Kernel time is
Kineto's (torch.profiler), so host overhead does not count.

Needs the PyPI package nvidia-cudnn-frontend (its Python module `cudnn`)
and a CUDA GPU. Usage:
  python3 benchmarks/bn_fusion_probe.py --batch-sizes 64,256 [--norms-only]

A first table does the same for the BatchNorms themselves: ATen's kernels
(cuDNN's legacy NHWC API, as lamp's) against the graph API's BatchNorm
training forward (+ add + ReLU) and backward (ReLU backward + BatchNorm
backward), with the forward's largest error against ATen in fp32.
"""

import argparse
import sys

import torch

# (in channels, out channels, kernel, stride, input H=W, count in ResNet-50,
#  whether the input is a BatchNorm+ReLU output: the prologue can apply it)
LAYERS = [
    # layer1 (56x56)
    (64, 64, 1, 1, 56, 1, True),  # block 0 conv1 (after stem pool: no)
    (256, 64, 1, 1, 56, 2, False),  # conv1 of blocks 1-2 (block output)
    (64, 64, 3, 1, 56, 3, True),  # conv2
    (64, 256, 1, 1, 56, 3, True),  # conv3
    (64, 256, 1, 1, 56, 1, False),  # downsample
    # layer2 (28x28)
    (256, 128, 1, 1, 56, 1, False),
    (512, 128, 1, 1, 28, 3, False),
    (128, 128, 3, 2, 56, 1, True),
    (128, 128, 3, 1, 28, 3, True),
    (128, 512, 1, 1, 28, 4, True),
    (256, 512, 1, 2, 56, 1, False),
    # layer3 (14x14)
    (512, 256, 1, 1, 28, 1, False),
    (1024, 256, 1, 1, 14, 5, False),
    (256, 256, 3, 2, 28, 1, True),
    (256, 256, 3, 1, 14, 5, True),
    (256, 1024, 1, 1, 14, 6, True),
    (512, 1024, 1, 2, 28, 1, False),
    # layer4 (7x7)
    (1024, 512, 1, 1, 14, 1, False),
    (2048, 512, 1, 1, 7, 2, False),
    (512, 512, 3, 2, 14, 1, True),
    (512, 512, 3, 1, 7, 2, True),
    (512, 2048, 1, 1, 7, 3, True),
    (1024, 2048, 1, 2, 14, 1, False),
]
# NOTE: layer1 block 0's conv1 reads the max pool's output: no prologue.
LAYERS[0] = LAYERS[0][:6] + (False,)


def kernel_us(fn, iters):
    """Mean GPU kernel time of fn() in microseconds (Kineto)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.device_time
    return total / iters


def event_us(fn, iters):
    """Mean wall time of fn() between CUDA events, in microseconds."""
    fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


class ConvGraph:
    """One cuDNN graph: [scale+bias+ReLU] -> conv -> [genstats]."""

    def __init__(self, handle, x, w, stride, pad, prologue, stats):
        import cudnn

        c = x.size(1)
        k = w.size(0)
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        self.x, self.w = x, w
        X = g.tensor_like(x)
        W = g.tensor_like(w)
        pack = {X: x, W: w}
        inp = X
        if prologue:
            # NOTE: fp16 scale and bias, as MLPerf's and cuDNN's samples.
            self.s = torch.rand(1, c, 1, 1, device="cuda", dtype=x.dtype)
            self.b = torch.randn(1, c, 1, 1, device="cuda", dtype=x.dtype)
            self.s = self.s.contiguous(memory_format=torch.channels_last)
            self.b = self.b.contiguous(memory_format=torch.channels_last)
            S = g.tensor_like(self.s)
            B = g.tensor_like(self.b)
            pack.update({S: self.s, B: self.b})
            inp = g.relu(
                name="relu",
                input=g.bias(name="bias", input=g.scale(name="scale", input=X, scale=S), bias=B),
            )
        Y = g.conv_fprop(
            image=inp, weight=W, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1]
        )
        Y.set_output(True)
        h = (x.size(2) + 2 * pad - w.size(2)) // stride + 1
        self.y = torch.empty(
            x.size(0), k, h, h, device="cuda", dtype=x.dtype
        ).contiguous(memory_format=torch.channels_last)
        pack[Y] = self.y
        if stats:
            SUM, SQ = g.genstats(name="genstats", input=Y)
            SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
            SQ.set_output(True).set_data_type(cudnn.data_type.FLOAT)
            self.sum = torch.empty(1, k, 1, 1, device="cuda")
            self.sq = torch.empty(1, k, 1, 1, device="cuda")
            pack.update({SUM: self.sum, SQ: self.sq})
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        try:
            g.build_plans(cudnn.build_plan_policy.ALL)
        except Exception:  # noqa: BLE001 - then the heuristic's first plan
            g.build_plans()
        self.g, self.pack, self.handle = g, pack, handle
        self.ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
        self.best_plan()

    def best_plan(self, plans=8):
        """Time the heuristic's first plans (like cudnn.benchmark) and keep
        the fastest."""
        best = None
        for i in range(min(plans, self.g.get_execution_plan_count())):
            try:
                ws = self.g.get_workspace_size_plan_at_index(i)
                if ws > self.ws.numel():
                    self.ws = torch.empty(ws, device="cuda", dtype=torch.uint8)
                run = lambda: self.g.execute_plan_at_index(self.pack, self.ws, i, handle=self.handle)
                t = event_us(run, 5)
            except Exception:  # noqa: BLE001 - a plan that fails is skipped
                continue
            if best is None or t < best[0]:
                best = (t, i)
        if best is None:
            raise RuntimeError("no plan ran")
        self.plan = best[1]

    def __call__(self):
        self.g.execute_plan_at_index(self.pack, self.ws, self.plan, handle=self.handle)


def probe(handle, n, layer, iters):
    cin, cout, k, stride, hw, count, prologue_ok = layer
    pad = k // 2
    x = torch.randn(n, cin, hw, hw, device="cuda", dtype=torch.half)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, cin, k, k, device="cuda", dtype=torch.half) * (cin * k * k) ** -0.5
    w = w.contiguous(memory_format=torch.channels_last)
    row = {}
    variants = [("conv", False, False), ("conv+stats", False, True)]
    if prologue_ok:
        variants.append(("sbr+conv+stats", True, True))
    for name, prologue, stats in variants:
        try:
            g = ConvGraph(handle, x, w, stride, pad, prologue, stats)
            row[name] = kernel_us(g, iters)
        except Exception as e:  # noqa: BLE001 - unsupported graphs are data
            row[name] = None
            print(f"  {name} {layer}: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    row["torch conv"] = kernel_us(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad), iters)
    bn = torch.nn.BatchNorm2d(cout).cuda()
    row["bn"] = kernel_us(lambda: bn(y), iters)
    return row


# The BatchNorms of ResNet-50: (channels, H=W, what follows it, count).
# r: ReLU; ar: residual add + ReLU; bn: nothing (the downsample's).
NORMS = [
    (64, 112, "r", 1),
    (64, 56, "r", 6),
    (256, 56, "ar", 3),
    (256, 56, "bn", 1),
    (128, 56, "r", 1),
    (128, 28, "r", 7),
    (512, 28, "ar", 4),
    (512, 28, "bn", 1),
    (256, 28, "r", 1),
    (256, 14, "r", 11),
    (1024, 14, "ar", 6),
    (1024, 14, "bn", 1),
    (512, 14, "r", 1),
    (512, 7, "r", 5),
    (2048, 7, "ar", 3),
    (2048, 7, "bn", 1),
]


def build(g):
    import cudnn

    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)


class NormGraphs:
    """cuDNN graph-API BatchNorm training forward (+ add, + ReLU) and its
    backward (ReLU backward from y, then the BatchNorm backward)."""

    def __init__(self, handle, x, kind):
        import cudnn

        c = x.size(1)
        f32 = dict(device="cuda", dtype=torch.float32)
        self.handle = handle
        self.scale = torch.rand(1, c, 1, 1, **f32) + 0.5
        self.bias = torch.randn(1, c, 1, 1, **f32)
        self.rm = torch.zeros(1, c, 1, 1, **f32)
        self.rv = torch.ones(1, c, 1, 1, **f32)
        self.mean = torch.empty(1, c, 1, 1, **f32)
        self.inv = torch.empty(1, c, 1, 1, **f32)
        self.y = torch.empty_like(x)
        eps = torch.full((1, 1, 1, 1), 1e-5)
        mom = torch.full((1, 1, 1, 1), 0.1)
        io = cudnn.data_type.HALF
        kw = dict(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                  compute_data_type=cudnn.data_type.FLOAT, handle=handle)

        g = cudnn.pygraph(**kw)
        X, S, B = g.tensor_like(x), g.tensor_like(self.scale), g.tensor_like(self.bias)
        RM, RV = g.tensor_like(self.rm), g.tensor_like(self.rv)
        E, M = g.tensor_like(eps), g.tensor_like(mom)
        y, sm, si, orm, orv = g.batchnorm(
            name="bn", input=X, scale=S, bias=B, in_running_mean=RM,
            in_running_var=RV, epsilon=E, momentum=M)
        pack = {X: x, S: self.scale, B: self.bias, RM: self.rm, RV: self.rv,
                E: eps, M: mom, orm: self.rm, orv: self.rv, sm: self.mean, si: self.inv}
        if kind == "ar":
            self.z = torch.randn_like(x)
            Z = g.tensor_like(self.z)
            y = g.add(name="add", a=y, b=Z)
            pack[Z] = self.z
        relu = kind in ("r", "ar")
        if relu:
            # The ReLU mask for backward, one bit an element (cuDNN's
            # BOOLEAN is bit-packed), compared against a scalar zero.
            y = g.relu(name="relu", input=y)
            self.zero = torch.zeros(1, 1, 1, 1)
            ZERO = g.tensor_like(self.zero)
            mask = g.cmp_gt(name="mask", input=y, comparison=ZERO)
            pack[ZERO] = self.zero
            mask.set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
            self.mask = torch.empty((x.numel() + 7) // 8, device="cuda", dtype=torch.uint8)
            pack[mask] = self.mask
        y.set_output(True).set_data_type(io)
        for t in (sm, si, orm, orv):
            t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
        pack[y] = self.y
        try:
            self.fwd_ws = build(g)
        except Exception as e:
            raise RuntimeError(f"forward: {e}") from e
        self.fwd, self.fwd_pack = g, pack

        g = cudnn.pygraph(**kw)
        self.dy = torch.randn_like(x)
        self.dx = torch.empty_like(x)
        self.ds = torch.empty_like(self.scale)
        self.db = torch.empty_like(self.scale)
        DY, X, S = g.tensor_like(self.dy), g.tensor_like(x), g.tensor_like(self.scale)
        MEAN, INV = g.tensor_like(self.mean), g.tensor_like(self.inv)
        pack = {DY: self.dy, X: x, S: self.scale, MEAN: self.mean, INV: self.inv}
        grad = DY
        if relu:
            MASK = g.tensor(name="mask", dim=list(x.size()), stride=list(x.stride()),
                            data_type=cudnn.data_type.BOOLEAN)
            grad = g.mul(name="drelu", a=DY, b=MASK)
            grad.set_data_type(io)
            pack[MASK] = self.mask
            if kind == "ar":
                self.dz = torch.empty_like(x)
                grad.set_output(True)
                pack[grad] = self.dz
        dx, ds, db = g.batchnorm_backward(
            name="dbn", grad=grad, input=X, scale=S, mean=MEAN, inv_variance=INV)
        dx.set_output(True).set_data_type(io)
        ds.set_output(True).set_data_type(cudnn.data_type.FLOAT)
        db.set_output(True).set_data_type(cudnn.data_type.FLOAT)
        pack.update({dx: self.dx, ds: self.ds, db: self.db})
        try:
            self.bwd_ws = build(g)
        except Exception as e:
            raise RuntimeError(f"backward: {e}") from e
        self.bwd, self.bwd_pack = g, pack

    def forward(self):
        self.fwd.execute(self.fwd_pack, self.fwd_ws, handle=self.handle)

    def backward(self):
        self.bwd.execute(self.bwd_pack, self.bwd_ws, handle=self.handle)


def probe_norm(handle, n, norm, iters):
    c, hw, kind, _ = norm
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.half)
    x = x.contiguous(memory_format=torch.channels_last)
    row = {}
    # Today's kernels for the plain BatchNorm (ATen -> cuDNN's NHWC
    # semi-persistent kernels; lamp's BN+ReLU and BN+add+ReLU variants of
    # them are in the ResNet-50 traces).
    bn = torch.nn.BatchNorm2d(c).cuda()
    xg = x.detach().requires_grad_()
    row["aten bn fwd"] = kernel_us(lambda: bn(xg), iters)
    out = bn(xg)
    dy = torch.randn_like(out)
    # NOTE: autograd.grad, not backward: backward would also add each
    # call's dx into xg.grad (a pass that is not the BatchNorm's).
    row["aten bn bwd"] = kernel_us(
        lambda: torch.autograd.grad(out, xg, dy, retain_graph=True), iters)
    try:
        g = NormGraphs(handle, x, kind)
        row["graph fwd"] = kernel_us(g.forward, iters)
        row["graph bwd"] = kernel_us(g.backward, iters)
        # The graph's results against ATen's, so the times are of real work.
        ref = torch.nn.functional.batch_norm(
            x.float(), None, None, g.scale.flatten(), g.bias.flatten(), True)
        if kind == "ar":
            ref = ref + g.z.float()
        if kind != "bn":
            ref = ref.relu()
        row["max err"] = (ref - g.y.float()).abs().max().item()
        # dx against autograd's, through the same ReLU mask.
        xr = x.float().requires_grad_()
        out = torch.nn.functional.batch_norm(
            xr, None, None, g.scale.flatten(), g.bias.flatten(), True)
        if kind == "ar":
            out = out + g.z.float()
        if kind != "bn":
            out = out.relu()
        out.backward(g.dy.float())
        # NOTE: relative (Frobenius) error: an element at the ReLU's edge
        # may be on the other side in fp16, so a maximum says little.
        row["dx err"] = ((xr.grad - g.dx.float()).norm() / xr.grad.norm()).item()
    except Exception as e:  # noqa: BLE001 - unsupported graphs are data
        print(f"  norm {norm}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="64,256")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--norms-only", action="store_true", help="skip the convolution table")
    args = p.parse_args()
    import cudnn

    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {cudnn.backend_version_string()}"
          f" frontend {cudnn.__version__}")
    ncols = ["aten bn fwd", "graph fwd", "aten bn bwd", "graph bwd", "max err", "dx err"]
    for n in [int(b) for b in args.batch_sizes.split(",")]:
        print(f"\n## BatchNorm, batch {n} (us per call; totals x count in ms)")
        print("| C | H=W | then | count | " + " | ".join(ncols) + " |")
        print("|" + " --- |" * (4 + len(ncols)))
        totals = {c: 0.0 for c in ncols}
        for norm in NORMS:
            r = probe_norm(handle, n, norm, args.iters)
            cells = [(f"{r[c]:.3g}" if "err" in c else f"{r[c]:.1f}") if c in r else "-" for c in ncols]
            print(f"| {' | '.join(str(v) for v in norm)} | " + " | ".join(cells) + " |", flush=True)
            for c in ncols[:4]:
                totals[c] += r.get(c, 0.0) * norm[3] / 1000
        print("| total ms | | | | " + " | ".join(f"{totals[c]:.2f}" for c in ncols[:4]) + " | | |")
    if args.norms_only:
        return
    cols = ["torch conv", "conv", "conv+stats", "sbr+conv+stats", "bn"]
    for n in [int(b) for b in args.batch_sizes.split(",")]:
        totals = {c: 0.0 for c in cols}
        best = 0.0  # the forward with every fusion that ran
        today = 0.0  # torch conv + bn
        print(f"\n## batch {n} (us per call; totals x count in ms)")
        print("| cin | cout | k | s | hw | count | " + " | ".join(cols) + " |")
        print("|" + " --- |" * (6 + len(cols)))
        for layer in LAYERS:
            r = probe(handle, n, layer, args.iters)
            cnt = layer[5]
            cells = [f"{r[c]:.1f}" if r.get(c) is not None else "-" for c in cols]
            print(f"| {' | '.join(str(v) for v in layer[:6])} | " + " | ".join(cells) + " |", flush=True)
            for c in cols:
                totals[c] += (r.get(c) or 0.0) * cnt / 1000
            today += (r["torch conv"] + r["bn"]) * cnt / 1000
            # NOTE: where the prologue ran, it does the previous
            # BatchNorm's normalisation too: that layer's fused figure.
            fused = r.get("sbr+conv+stats") or r.get("conv+stats")
            best += (fused if fused is not None else r["torch conv"] + r["bn"]) * cnt / 1000
        print("| total ms | | | | | | " + " | ".join(f"{totals[c]:.2f}" for c in cols) + " |")
        print(f"\nbatch {n}: convolutions + ATen's BatchNorm forward {today:.2f} ms; the "
              f"convolutions with the statistics in every epilogue and the previous BatchNorm+ReLU "
              f"in the prologue where the input allows {best:.2f} ms. Not in either: a finalize per "
              f"BatchNorm and, for each block's bn3, the normalise + residual add + ReLU pass.")


if __name__ == "__main__":
    main()
