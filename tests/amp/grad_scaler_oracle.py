"""Runs the scripted mixed-precision training of tests/grad_scaler_test.cpp
with Python's torch.amp.GradScaler and prints what the C++ test compares.

Usage: grad_scaler_oracle.py SCENARIO DEVICE STEPS
Output: "step I SCALE FOUND_INF" per step (scale after update(), as a hex
float; found_inf 1 when that step's gradients had inf/NaN), then
"param K V0 V1 ..." with every parameter value as a hex float.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.nn.functional as F

SCALER = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
              growth_interval=7)
# Scripted overflow: step -> value written into one gradient element.
INJECT = {3: float("inf"), 4: float("inf"), 5: float("nan"),
          40: float("inf"), 41: float("nan"),
          120: float("inf"), 121: float("inf"), 122: float("-inf"),
          199: float("nan")}


def make_params(device):
    torch.manual_seed(0)
    shapes = [((16, 8), 0.25), ((16,), 0.1), ((4, 16), 0.25), ((4,), 0.1)]
    return [(torch.randn(*s) * k).to(device).requires_grad_() for s, k in shapes]


def make_optimizers(scenario, params):
    fused = scenario.startswith("fused_")
    kind = scenario.removeprefix("fused_").removesuffix("_unscale")
    if kind == "sgd":
        return [torch.optim.SGD(params, lr=0.05, fused=fused or None)]
    if kind == "sgd_momentum":
        return [torch.optim.SGD(params, lr=0.05, momentum=0.9,
                                fused=fused or None)]
    if kind == "sgd_two_optimizers":
        return [torch.optim.SGD(params[:2], lr=0.05),
                torch.optim.SGD(params[2:], lr=0.05)]
    if kind == "adam":
        return [torch.optim.Adam(params, lr=1e-3, fused=fused or None)]
    if kind == "adamw":
        return [torch.optim.AdamW(params, lr=1e-3, fused=fused or None)]
    raise SystemExit(f"unknown scenario {scenario}")


def main(scenario, device, steps):
    params = make_params(device)
    optimizers = make_optimizers(scenario, params)
    scaler = torch.amp.GradScaler(device, **SCALER)
    for i in range(steps):
        x = torch.randn(32, 8).to(device)
        target = torch.randn(32, 4).to(device)
        for opt in optimizers:
            opt.zero_grad()
        w1, b1, w2, b2 = params
        out = F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
        loss = F.mse_loss(out, target)
        scaler.scale(loss).backward()
        if i in INJECT:
            params[i % 4].grad.view(-1)[0] = INJECT[i]
        if scenario.endswith("_unscale"):
            for opt in optimizers:
                scaler.unscale_(opt)
        for opt in optimizers:
            scaler.step(opt)
        found = sum(v.item() for opt in optimizers
                    for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        print("step", i, scaler.get_scale().hex(), int(found != 0))
    for k, p in enumerate(params):
        values = p.detach().cpu().double().view(-1).tolist()
        print("param", k, " ".join(v.hex() for v in values))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
