"""Python's fused optimizers on the scripted runs of tests/optim_test.cpp.

Usage: optim_oracle.py STEPS SCENARIO...
Prints, for each scenario, "scenario NAME" and then "param I BITS..." for
every parameter after STEPS steps, each value as the hex of its float32
bits. Parameters and gradients come from
torch.manual_seed(0) and torch.randn, which LibTorch reproduces.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch


def make_params():
    torch.manual_seed(0)
    return [torch.randn(8, 4), torch.randn(4), torch.randn(3, 8),
            torch.randn(3)]


def make_optimizer(scenario, params):
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 0.05}]
    return {
        "adam": lambda: torch.optim.Adam(groups, lr=0.01, fused=True),
        "adam_amsgrad_wd": lambda: torch.optim.Adam(
            groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
            amsgrad=True, fused=True),
        "adamw": lambda: torch.optim.AdamW(groups, lr=0.01, fused=True),
        "adamw_amsgrad": lambda: torch.optim.AdamW(
            groups, lr=0.01, weight_decay=0.05, amsgrad=True, fused=True),
        "sgd": lambda: torch.optim.SGD(groups, lr=0.1, fused=True),
        "sgd_momentum_wd": lambda: torch.optim.SGD(
            groups, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01,
            fused=True),
        "sgd_nesterov": lambda: torch.optim.SGD(
            groups, lr=0.1, momentum=0.9, nesterov=True, fused=True),
    }[scenario]()


def main():
    steps = int(sys.argv[1])
    for scenario in sys.argv[2:]:
        params = make_params()
        opt = make_optimizer(scenario, params)
        for _ in range(steps):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        print("scenario", scenario)
        for i, p in enumerate(params):
            bits = p.detach().contiguous().view(torch.int32).flatten().tolist()
            print("param", i, " ".join(f"{b & 0xffffffff:08x}" for b in bits))


if __name__ == "__main__":
    main()
