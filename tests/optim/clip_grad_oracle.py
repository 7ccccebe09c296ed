"""Runs the gradient clipping cases of tests/clip_grad_test.cpp with Python's
torch.nn.utils and prints what the C++ test compares, values as hex floats.

Usage:
  clip_grad_oracle.py cases CASE...
    CASE is OP:NORM_TYPE:FOREACH:MAX:LAYOUT:ERROR_IF_NONFINITE with OP one
    of norm (clip_grad_norm_), split (get_total_norm, then
    clip_grads_with_norm_) or value (clip_grad_value_ with MAX as
    clip_value); FOREACH none, true or false; LAYOUT a key of LAYOUTS.
    Prints "case I", then "norm HEX DTYPE" (norm and split), one
    "grad K HEX..." per parameter (after clipping; "grad K none" without a
    gradient), or "error MESSAGE" when Python raises.
  clip_grad_oracle.py amp STEPS
    The mixed-precision recipe: GradScaler, unscale_, clip_grad_norm_ and
    fused Adam, with inf/NaN injected at some steps. Prints
    "step I SCALE FOUND_INF NORM" per step, then "param K V0 V1 ...".
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.nn.functional as F
from torch.nn.utils import (clip_grad_norm_, clip_grad_value_,
                            clip_grads_with_norm_, get_total_norm)

F32, F64 = torch.float32, torch.float64
F16, BF16 = torch.float16, torch.bfloat16
# (shape, dtype, has_grad) per parameter; kept in sync with the C++ test.
LAYOUTS = {
    "f32": [((16, 8), F32, True), ((16,), F32, True), ((60, 50), F32, True),
            ((4,), F32, True)],
    "mixed": [((16, 8), F32, True), ((16,), F64, True), ((4, 16), BF16, True),
              ((3,), F32, False), ((60, 50), F32, True), ((7, 5), BF16, True),
              ((2, 3), F64, True), ((9,), F64, False)],
    # Three groups whose order (Python's, not first seen) decides the last
    # bit of the 2- and 0.5-norms.
    "lowp": [((16, 8), F32, True), ((4, 16), BF16, True),
             ((60, 50), F32, True), ((7, 5), BF16, True), ((7,), F16, True),
             ((5,), F16, True)],
    "nograd": [((16, 8), F32, False), ((16,), F32, True),
               ((60, 50), F32, False), ((4,), F32, True)],
    "allnograd": [((16, 8), F32, False), ((4,), F32, False)],
    "empty": [],
}
# Layout suffixes that write one gradient element: inf, nan or -inf.
INJECT = {"inf": float("inf"), "nan": float("nan"), "neginf": float("-inf")}


def make_params(layout):
    base, _, inject = layout.partition("+")
    torch.manual_seed(1234)
    params = []
    for shape, dtype, has_grad in LAYOUTS[base]:
        p = torch.randn(*shape).to(dtype).requires_grad_()
        if has_grad:
            p.grad = (torch.randn(*shape) * 0.3).to(dtype)
        params.append(p)
    if inject:
        params[1].grad.view(-1)[0] = INJECT[inject]
    return params


def hexes(t):
    return " ".join(v.hex() for v in t.detach().double().view(-1).tolist())


def run_case(spec):
    op, norm_type, foreach, limit, layout, error = spec.split(":")
    norm_type, limit = float(norm_type), float(limit)
    foreach = {"none": None, "true": True, "false": False}[foreach]
    error = error == "1"
    params = make_params(layout)
    try:
        if op == "norm":
            norm = clip_grad_norm_(params, limit, norm_type, error, foreach)
        elif op == "split":
            grads = [p.grad for p in params if p.grad is not None]
            norm = get_total_norm(grads, norm_type, error, foreach)
            clip_grads_with_norm_(params, limit, norm, foreach)
        elif op == "value":
            norm = None
            clip_grad_value_(params, limit, foreach)
        else:
            raise SystemExit(f"unknown op {op}")
    except RuntimeError as e:
        print("error", e)
        return
    if norm is not None:
        assert norm.dim() == 0
        dtype = str(norm.dtype).removeprefix("torch.")
        print("norm", norm.item().hex(), dtype)
    for k, p in enumerate(params):
        print("grad", k, "none" if p.grad is None else hexes(p.grad))


# The AMP recipe; the model and data are those of grad_scaler_oracle.py.
AMP_INJECT = {3: float("inf"), 4: float("nan"), 17: float("inf"),
              18: float("-inf"), 40: float("nan")}
AMP_MAX_NORM = 0.4


def amp(steps):
    torch.manual_seed(0)
    shapes = [((16, 8), 0.25), ((16,), 0.1), ((4, 16), 0.25), ((4,), 0.1)]
    params = [(torch.randn(*s) * k).requires_grad_() for s, k in shapes]
    opt = torch.optim.Adam(params, lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    for i in range(steps):
        x = torch.randn(32, 8)
        target = torch.randn(32, 4)
        opt.zero_grad()
        w1, b1, w2, b2 = params
        out = F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
        scaler.scale(F.mse_loss(out, target)).backward()
        if i in AMP_INJECT:
            params[i % 4].grad.view(-1)[0] = AMP_INJECT[i]
        scaler.unscale_(opt)
        norm = clip_grad_norm_(params, AMP_MAX_NORM)
        scaler.step(opt)
        found = sum(v.item()
                    for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        print("step", i, scaler.get_scale().hex(), int(found != 0),
              norm.item().hex())
    for k, p in enumerate(params):
        print("param", k, hexes(p))


if __name__ == "__main__":
    if sys.argv[1] == "cases":
        for i, spec in enumerate(sys.argv[2:]):
            print("case", i)
            run_case(spec)
    elif sys.argv[1] == "amp":
        amp(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")
