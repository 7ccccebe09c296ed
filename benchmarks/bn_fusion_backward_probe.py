#!/usr/bin/env python3
"""How much of ResNet-50's BatchNorm backward the cuDNN graph API can fold
into the convolutions' backward, measured layer by layer on this GPU.

The backward half of bn_fusion_probe.py. In MLPerf's ResNet-50 the forward
keeps each BatchNorm's input x (a convolution's output) and applies
BatchNorm+ReLU in the next convolution's prologue, so the backward of that
convolution sees x, not the BatchNorm+ReLU output z. It then runs

  dgrad with the ReLU backward and the BatchNorm backward's sums in its
  epilogue ("DBN"): dz = dgrad(dy); dr = dz * (scale*x_hat + bias > 0);
  dbias = sum(dr), dscale = sum(dr * x_hat) over N, H, W; cuDNN's
  Dgrad+Drelu+BNBwdWeight fusion, whose sample (cudnn-frontend
  samples/cpp/convolution/dgrads.cpp) recomputes scale*x_hat + bias from x
  in the epilogue, as here;
  the dx pass: dx = a*dr + b*x + c, a, b, c per channel from the sums
  (BatchNorm's dx = scale*inv_std*(dr - mean(dr) - x_hat*mean(dr*x_hat)));
  wgrad with scale+bias+ReLU in its prologue (z recomputed from x: cudnn-
  frontend's "scale-bias-relu-wgrad", samples/cpp/convolution/wgrads.cpp).

For every distinct convolution of torchvision's ResNet-50 (fp16,
channels-last) this script measures, summed with each layer's count:

  aten dgrad / dgrad     ATen's convolution_backward (input only) and the
                         graph API's conv_dgrad
  aten wgrad / wgrad     the same for the weight (input: z where a
                         BatchNorm+ReLU precedes, else the block's input)
and, for the 32 convolutions whose input is a BatchNorm+ReLU output:
  aten drelu             ATen's ReLU backward (threshold_backward)
  aten bn bwd            ATen's BatchNorm backward (cuDNN's NHWC kernel)
  dgrad+drelu            dgrad -> relu_backward (dgrads.cpp "Dgrad Drelu")
  dbn                    dgrad -> relu_backward -> two ADD reductions (the
                         sums above), with dr written out
  dbn full               dgrad -> relu_backward -> batchnorm_backward in one
                         graph (dx too, no separate pass)
  dx pass                the pointwise dx graph (or, where cuDNN has no
                         engine for it, torch.add of dr and x into dx: one
                         kernel moving the same bytes)
  sbr+wgrad              wgrad with scale+bias+ReLU applied to x in its
                         prologue

NOTE: cuDNN's own Dgrad+Drelu+BNBwdWeight engine is built from the
frontend's dbn_weight node, which is C++ only (Graph::dbn_weight); the
Python package (nvidia-cudnn-frontend 1.32) has no dbn_weight, so "dbn"
states the same sums with generic reductions and leaves it to cuDNN's
runtime fusion engines to find a kernel. Kernel time is Kineto's
(torch.profiler); host overhead does not count.

Needs the PyPI package nvidia-cudnn-frontend (its Python module `cudnn`)
and a CUDA GPU. Usage:
  python3 benchmarks/bn_fusion_backward_probe.py --batch-sizes 64,256
      [--per-layer] [--iters 20] [--check-layer 2]
"""

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bn_fusion_probe import LAYERS, event_us, kernel_us  # noqa: E402

EPS = 1e-5


def cl(t):
    return t.contiguous(memory_format=torch.channels_last)


class Case:
    """One convolution's backward operands. x: the forward input (for a
    layer after a BatchNorm+ReLU, that BatchNorm's input); z: what the
    convolution read (relu(scale*x_hat + bias) there, else x)."""

    def __init__(self, n, layer):
        cin, cout, k, stride, hw, _, self.bn = layer
        self.stride, self.pad = stride, k // 2
        ho = (hw + 2 * self.pad - k) // stride + 1
        h16 = dict(device="cuda", dtype=torch.half)
        f32 = dict(device="cuda", dtype=torch.float32)
        # A convolution's output: per-channel offsets and spreads, so that
        # the centring and the scaling both matter.
        x = torch.randn(n, cin, hw, hw, **f32) * (torch.rand(1, cin, 1, 1, **f32) + 0.5)
        self.x = cl((x + torch.randn(1, cin, 1, 1, **f32)).half())
        self.w = cl(torch.randn(cout, cin, k, k, **h16) * (cin * k * k) ** -0.5)
        self.dy = cl(torch.randn(n, cout, ho, ho, **h16))
        xf = self.x.float()
        self.mean = cl(xf.mean((0, 2, 3), keepdim=True))
        self.inv = cl((xf.var((0, 2, 3), unbiased=False, keepdim=True) + EPS).rsqrt())
        self.scale = cl(torch.rand(1, cin, 1, 1, **f32) + 0.5)
        self.bias = cl(torch.randn(1, cin, 1, 1, **f32) * 0.2)
        # The normalisation as one scale and bias (fp16, as MLPerf's
        # prologue and cuDNN's sbr-wgrad test take them).
        self.eq_scale = cl((self.scale * self.inv).half())
        self.eq_bias = cl((self.bias - self.mean * self.scale * self.inv).half())
        if self.bn:
            z = (xf * self.eq_scale.float() + self.eq_bias.float()).relu()
            self.z = cl(z.half())
        else:
            self.z = self.x
        self.dz = torch.randn_like(self.x)  # for ATen's ReLU/BN backward

    def conv_args(self):
        return dict(padding=[self.pad] * 2, stride=[self.stride] * 2, dilation=[1, 1])

    def dx_coeffs(self, dscale, dbias):
        """a, b, c of dx = a*dr + b*x + c, from the BatchNorm backward's sums."""
        m = self.x.numel() // self.x.size(1)
        a = self.scale * self.inv
        b = -a * self.inv * dscale / m
        return cl(a), cl(b), cl(-a * dbias / m - b * self.mean)


def new_graph(handle):
    import cudnn

    return cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )


def output(T, t, pack):
    """Marks graph tensor T an output written into torch tensor t."""
    import cudnn

    dt = cudnn.data_type.HALF if t.dtype == torch.half else cudnn.data_type.FLOAT
    T.set_output(True).set_dim(list(t.size())).set_stride(list(t.stride())).set_data_type(dt)
    pack[T] = t
    return t


class Plan:
    """A built graph run with the fastest of its heuristic's first plans
    (as bn_fusion_probe.ConvGraph, like cudnn.benchmark)."""

    def __init__(self, handle, g, pack, plans=8):
        import cudnn

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
        best = None
        for i in range(min(plans, g.get_execution_plan_count())):
            try:
                ws = g.get_workspace_size_plan_at_index(i)
                if ws > self.ws.numel():
                    self.ws = torch.empty(ws, device="cuda", dtype=torch.uint8)
                run = lambda: g.execute_plan_at_index(pack, self.ws, i, handle=handle)
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


def dgrad_graph(handle, c, mode):
    """mode: "dgrad", "dgrad+drelu", "dbn" (+ the two sums) or "dbn full"
    (+ batchnorm_backward). Returns (Plan, {name: output tensor})."""
    import cudnn

    g = new_graph(handle)
    DY, W = g.tensor_like(c.dy), g.tensor_like(c.w)
    pack, res = {DY: c.dy, W: c.w}, {}
    DX = g.conv_dgrad(name="dgrad", loss=DY, filter=W, **c.conv_args())
    # NOTE: dims, not strides: the dgrad output's dims are ambiguous for a
    # strided convolution; its NHWC strides cuDNN infers from dy.
    DX.set_dim(list(c.x.size()))
    if mode == "dgrad":
        output(DX, torch.empty_like(c.x), pack)
        res["dx"] = pack[DX]
        return Plan(handle, g, pack), res
    X, M, V = g.tensor_like(c.x), g.tensor_like(c.mean), g.tensor_like(c.inv)
    S, B = g.tensor_like(c.scale), g.tensor_like(c.bias)
    pack.update({X: c.x, M: c.mean, V: c.inv, S: c.scale, B: c.bias})
    # The forward's BatchNorm output recomputed from x, as dgrads.cpp's
    # "Dgrad Drelu DBNweight" graph: only its sign is used (the ReLU mask).
    XHAT = g.mul(name="norm", a=g.sub(name="center", a=X, b=M), b=V)
    Y = g.bias(name="bn_bias", input=g.scale(name="bn_scale", input=XHAT, scale=S), bias=B)
    DR = g.relu_backward(name="drelu", loss=DX, input=Y)
    if mode == "dbn full":
        dx, dscale, dbias = g.batchnorm_backward(
            name="dbn", grad=DR, input=X, scale=S, mean=M, inv_variance=V)
        res["dx"] = output(dx, torch.empty_like(c.x), pack)
        res["dscale"] = output(dscale, torch.empty_like(c.scale), pack)
        res["dbias"] = output(dbias, torch.empty_like(c.scale), pack)
        return Plan(handle, g, pack), res
    res["dr"] = output(DR, torch.empty_like(c.x), pack)
    if mode == "dbn":
        add = cudnn.reduction_mode.ADD
        dbias = g.reduction(name="dbias", input=DR, mode=add)
        dscale = g.reduction(name="dscale", input=g.mul(name="dr_xhat", a=DR, b=XHAT), mode=add)
        res["dbias"] = output(dbias, torch.empty_like(c.scale), pack)
        res["dscale"] = output(dscale, torch.empty_like(c.scale), pack)
    return Plan(handle, g, pack), res


def dx_graph(handle, c, dr, a, b, cc):
    """dx = a*dr + b*x + c, one pointwise graph."""
    g = new_graph(handle)
    DR, X = g.tensor_like(dr), g.tensor_like(c.x)
    A, Bx, C = g.tensor_like(a), g.tensor_like(b), g.tensor_like(cc)
    pack = {DR: dr, X: c.x, A: a, Bx: b, C: cc}
    xterm = g.bias(name="x_bias", input=g.scale(name="x_scale", input=X, scale=Bx), bias=C)
    DX = g.add(name="dx", a=g.scale(name="dr_scale", input=DR, scale=A), b=xterm)
    res = {"dx": output(DX, torch.empty_like(c.x), pack)}
    return Plan(handle, g, pack), res


def wgrad_graph(handle, c, prologue):
    """wgrad of the convolution; with prologue, its input relu(scale*x +
    bias) recomputed from x (wgrads.cpp's scale-bias-relu-wgrad)."""
    g = new_graph(handle)
    DY = g.tensor_like(c.dy)
    pack = {DY: c.dy}
    if prologue:
        X, S, B = g.tensor_like(c.x), g.tensor_like(c.eq_scale), g.tensor_like(c.eq_bias)
        pack.update({X: c.x, S: c.eq_scale, B: c.eq_bias})
        image = g.relu(name="relu", input=g.bias(
            name="bias", input=g.scale(name="scale", input=X, scale=S), bias=B))
    else:
        image = g.tensor_like(c.z)
        pack[image] = c.z
    DW = g.conv_wgrad(name="wgrad", image=image, loss=DY, **c.conv_args())
    res = {"dw": output(DW, torch.empty_like(c.w), pack)}
    return Plan(handle, g, pack), res


def aten_conv_bwd(c, mask):
    """ATen's convolution backward for the input ([True, False, False]) or
    the weight ([False, True, False])."""
    return lambda: torch.ops.aten.convolution_backward(
        c.dy, c.z, c.w, None, [c.stride] * 2, [c.pad] * 2, [1, 1], False, [0, 0], 1, mask)


def aten_bn_bwd(c):
    """ATen's BatchNorm training backward on x (fp16 NHWC, fp32 weight),
    through cuDNN as a BatchNorm2d's, else the native kernel: (fn, which)."""
    w, b = c.scale.flatten(), c.bias.flatten()
    rm, rv = torch.zeros_like(w), torch.ones_like(w)
    try:
        _, sm, sv, reserve = torch.ops.aten.cudnn_batch_norm(c.x, w, b, rm, rv, True, 0.1, EPS)
        return lambda: torch.ops.aten.cudnn_batch_norm_backward(
            c.x, c.dz, w, rm, rv, sm, sv, EPS, reserve), "cudnn_batch_norm_backward"
    except (RuntimeError, AttributeError, NotImplementedError):
        _, sm, si = torch.ops.aten.native_batch_norm(c.x, w, b, rm, rv, True, 0.1, EPS)
        return lambda: torch.ops.aten.native_batch_norm_backward(
            c.dz, c.x, w, rm, rv, sm, si, True, EPS, [True, True, True]), "native_batch_norm_backward"


def probe(handle, n, layer, iters, failed):
    """One layer's row: us per call for each key; None where no engine ran."""
    c = Case(n, layer)
    row = {}

    def measure(key, make):
        try:
            row[key] = kernel_us(make(), iters)
        except Exception as e:  # noqa: BLE001 - unsupported graphs are data
            row[key] = None
            failed.setdefault(key, []).append(layer)
            print(f"  {key} {layer[:5]}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)

    measure("aten dgrad", lambda: aten_conv_bwd(c, [True, False, False]))
    measure("aten wgrad", lambda: aten_conv_bwd(c, [False, True, False]))
    measure("dgrad", lambda: dgrad_graph(handle, c, "dgrad")[0])
    measure("wgrad", lambda: wgrad_graph(handle, c, False)[0])
    if not c.bn:
        return row
    measure("aten drelu", lambda: lambda: torch.ops.aten.threshold_backward(c.dz, c.z, 0))

    def bn_bwd():
        fn, row["bn kind"] = aten_bn_bwd(c)
        return fn

    measure("aten bn bwd", bn_bwd)
    for mode in ("dgrad+drelu", "dbn", "dbn full"):
        measure(mode, lambda: dgrad_graph(handle, c, mode)[0])
    measure("sbr+wgrad", lambda: wgrad_graph(handle, c, True)[0])
    ones = cl(torch.ones_like(c.scale))
    try:  # NOTE: the values of a, b, c do not change the time
        row["dx pass"] = kernel_us(dx_graph(handle, c, c.dz, ones, ones, ones)[0], iters)
        row["dx kind"] = "graph"
    except Exception as e:  # noqa: BLE001 - then the bandwidth proxy
        failed.setdefault("dx pass (graph)", []).append(layer)
        print(f"  dx pass {layer[:5]}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        out = torch.empty_like(c.x)
        row["dx pass"] = kernel_us(lambda: torch.add(c.dz, c.x, out=out), iters)
        row["dx kind"] = "proxy"
    return row


def errors(ref, got):
    """Largest absolute error, largest |ref| and the relative (Frobenius)
    error of got against an fp32 reference."""
    ref, got = ref.float(), got.float()
    d = (ref - got).abs().max().item()
    rel = ((ref - got).norm() / ref.norm().clamp_min(1e-30)).item()
    return f"{d:.3g} | {ref.abs().max().item():.3g} | {rel:.3g}"


def check(handle, n, layer):
    """Each fused graph's results against fp32 PyTorch on one layer."""
    import torch.nn.grad as tg

    c = Case(n, layer)
    print(f"\n## numerics, layer {layer[:5]}, batch {n}: graph API against fp32 PyTorch")
    print("| graph | output | max abs err | max abs ref | rel err |\n| --- | --- | ---: | ---: | ---: |")
    conv = dict(stride=c.stride, padding=c.pad)
    dz = tg.conv2d_input(c.x.shape, c.w.float(), c.dy.float(), **conv)
    xf = c.x.float()
    xhat = (xf - c.mean) * c.inv
    dr = dz * ((xhat * c.scale + c.bias) > 0)
    dbias, dscale = dr.sum((0, 2, 3), keepdim=True), (dr * xhat).sum((0, 2, 3), keepdim=True)
    # dx through autograd of an fp32 BatchNorm (batch statistics), from dr.
    xr = xf.clone().requires_grad_()
    y = torch.nn.functional.batch_norm(xr, None, None, c.scale.flatten(), c.bias.flatten(), True, eps=EPS)
    y.backward(dr)
    dx = xr.grad
    dw = tg.conv2d_weight(c.z.float(), c.w.shape, c.dy.float(), **conv)
    zf = (xf * c.eq_scale.float() + c.eq_bias.float()).relu()
    dw_sbr = tg.conv2d_weight(zf, c.w.shape, c.dy.float(), **conv)
    refs = {"dx": dz, "dr": dr, "dbias": dbias, "dscale": dscale}

    def row(name, build, outs):
        try:
            g, res = build()
            g()
            torch.cuda.synchronize()
            for key, ref in outs.items():
                print(f"| {name} | {key} | {errors(ref, res[key])} |")
            return res
        except Exception as e:  # noqa: BLE001 - unsupported graphs are data
            print(f"| {name} | not supported: {type(e).__name__}: {str(e)[:120]} | | | |")
            return None

    row("dgrad", lambda: dgrad_graph(handle, c, "dgrad"), {"dx": dz})
    row("wgrad", lambda: wgrad_graph(handle, c, False), {"dw": dw})
    if not c.bn:
        return
    row("dgrad+drelu", lambda: dgrad_graph(handle, c, "dgrad+drelu"), {"dr": dr})
    res = row("dbn", lambda: dgrad_graph(handle, c, "dbn"), {k: refs[k] for k in ("dr", "dbias", "dscale")})
    if res is not None:
        a, b, cc = c.dx_coeffs(res["dscale"], res["dbias"])
        row("dx pass", lambda: dx_graph(handle, c, res["dr"], a, b, cc), {"dx": dx})
    row("dbn full", lambda: dgrad_graph(handle, c, "dbn full"),
        {"dx": dx, "dbias": dbias, "dscale": dscale})
    row("sbr+wgrad", lambda: wgrad_graph(handle, c, True), {"dw": dw_sbr})


# Each comparison: its label, the fused keys, the unfused keys they replace.
COMPARE = [
    ("dgrad alone", ["dgrad"], ["aten dgrad"]),
    ("wgrad alone", ["wgrad"], ["aten wgrad"]),
    ("dgrad + ReLU bwd", ["dgrad+drelu"], ["aten dgrad", "aten drelu"]),
    ("DBN (dgrad + ReLU bwd + sums) + dx pass", ["dbn", "dx pass"], ["aten dgrad", "aten drelu", "aten bn bwd"]),
    ("dgrad + ReLU bwd + BN bwd, one graph", ["dbn full"], ["aten dgrad", "aten drelu", "aten bn bwd"]),
    ("wgrad with the BN+ReLU prologue (against wgrad of the saved z)", ["sbr+wgrad"], ["aten wgrad"]),
    ("the DBN's dx pass alone", ["dx pass"], []),
    ("ATen's BN backward alone", [], ["aten bn bwd"]),
]
COLS = ["aten dgrad", "dgrad", "aten wgrad", "wgrad", "aten drelu", "aten bn bwd",
        "dgrad+drelu", "dbn", "dbn full", "dx pass", "sbr+wgrad"]


def report(n, rows, failed):
    """The batch's summary table (ms a step, each layer times its count)."""
    print(f"\n## batch {n}: backward, ms a step (kernel time x count, summed over the layers where the fused side ran)")
    print("| what | fused / graph | unfused / ATen | layer shapes that ran |\n| --- | ---: | ---: | --- |")
    for label, fused, unfused in COMPARE:
        keys = fused + unfused
        applicable = [(l, r) for l, r in rows if all(k in r for k in keys)]
        ran = [(l, r) for l, r in applicable if all(r[k] is not None for k in keys)]
        f = sum(sum(r[k] for k in fused) * l[5] for l, r in ran) / 1000
        u = sum(sum(r[k] for k in unfused) * l[5] for l, r in ran) / 1000
        cells = [f"{v:.2f}" if side and ran else "-" for v, side in ((f, fused), (u, unfused))]
        print(f"| {label} | {' | '.join(cells)} | {len(ran)} of {len(applicable)} "
              f"({sum(l[5] for l, _ in ran)} of {sum(l[5] for l, _ in applicable)} convolutions) |")
    today = best = 0.0
    for l, r in rows:
        aten = lambda *ks: sum(r[k] or 0.0 for k in ks)
        t = aten("aten dgrad", "aten wgrad") + (aten("aten drelu", "aten bn bwd") if l[6] else 0.0)
        b = t
        if l[6]:
            dbn = r["dbn"] + r["dx pass"] if r["dbn"] is not None else None
            full = min(v for v in (dbn, r["dbn full"], aten("aten dgrad", "aten drelu", "aten bn bwd"))
                       if v is not None)
            b = full + (r["sbr+wgrad"] if r["sbr+wgrad"] is not None else aten("aten wgrad"))
        today += t * l[5] / 1000
        best += b * l[5] / 1000
    kinds = sorted({r["dx kind"] for _, r in rows if "dx kind" in r})
    bn = sorted({r["bn kind"] for _, r in rows if "bn kind" in r})
    print(f"\nbatch {n}: every convolution's dgrad + wgrad, and the ReLU + BatchNorm backward before the "
          f"32 that follow a BatchNorm+ReLU, ATen {today:.2f} ms; with the fastest DBN form that ran and "
          f"wgrad recomputing z in its prologue where it ran {best:.2f} ms (dx pass: {', '.join(kinds)}; "
          f"the per-channel a, b, c of the dx pass are not counted; ATen's BN backward: {', '.join(bn)}). "
          f"Not supported: " + ("; ".join(f"{k} on {len(v)} layer shapes" for k, v in failed.items()) or "none") + ".")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="64,256")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--per-layer", action="store_true", help="print a line per layer too")
    p.add_argument("--check-layer", type=int, default=2,
                   help="index into LAYERS of the layer whose results are checked (-1: none)")
    args = p.parse_args()
    import cudnn

    # NOTE: kernel_us profiles one cycle a call; this warning says so.
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {cudnn.backend_version_string()}"
          f" frontend {cudnn.__version__}")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.check_layer >= 0:
        try:
            check(handle, sizes[0], LAYERS[args.check_layer])
        except Exception as e:  # noqa: BLE001 - the timings still count
            print(f"numerics check failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    for n in sizes:
        rows, failed = [], {}
        if args.per_layer:
            print(f"\n## batch {n}, per layer (us per call; dx pass: g graph, p torch proxy)")
            print("| cin | cout | k | s | hw | count | " + " | ".join(COLS) + " |")
            print("|" + " --- |" * (6 + len(COLS)))
        for layer in LAYERS:
            r = probe(handle, n, layer, args.iters, failed)
            rows.append((layer, r))
            if args.per_layer:
                cells = [f"{r[k]:.1f}" if r.get(k) is not None else "-" for k in COLS]
                if "dx kind" in r:
                    cells[COLS.index("dx pass")] += r["dx kind"][0]
                print(f"| {' | '.join(str(v) for v in layer[:6])} | " + " | ".join(cells) + " |", flush=True)
        report(n, rows, failed)


if __name__ == "__main__":
    main()
