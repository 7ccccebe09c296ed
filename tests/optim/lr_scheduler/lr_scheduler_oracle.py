"""Runs the learning-rate schedules of tests/lr_scheduler_test.cpp with
Python's torch.optim.lr_scheduler and prints what the C++ test compares.

Usage:
  lr_scheduler_oracle.py run DIR STEPS SAVE_AT
      For every scenario: "traj NAME I V..." after construction (I = 0) and
      after each of STEPS steps, V the param groups' lrs (then momentum or
      beta1 where OneCycleLR cycles it) as hex floats; "state NAME SIG" with
      the scheduler's state_dict() after SAVE_AT steps (see sig()), which is
      also written to DIR/NAME.py.pt with torch.save. Then "error NAME TYPE
      MESSAGE" for each bad-argument case.
  lr_scheduler_oracle.py resume DIR STEPS SAVE_AT
      For every DIR/NAME.cpp.pt (a state dict written by C++ after SAVE_AT
      steps): a fresh optimizer and scheduler, the optimizer's lrs set to the
      state's _last_lr (what loading the optimizer would restore),
      load_state_dict, steps up to STEPS; "cont NAME I V..." for each step.
"""

import math
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.jit._pickle
from torch.optim import lr_scheduler as L

LRS = (0.1, 0.01)  # the two param groups' learning rates


def make_optimizer(kind):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr}
              for lr in LRS]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=LRS[0])
    if kind == "sgd_momentum":
        return torch.optim.SGD(groups, lr=LRS[0], momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=LRS[0])
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=LRS[0])
    if kind == "rmsprop":
        return torch.optim.RMSprop(groups, lr=LRS[0], momentum=0.5)
    if kind == "adagrad":
        return torch.optim.Adagrad(groups, lr=LRS[0])
    raise SystemExit(f"unknown optimizer {kind}")


def plateau_metric(i, mode):
    """The scripted metric of step i (i >= 1): plateaus with noise."""
    value = 1.0 / (1 + i // 20) + 0.001 * ((i * 7) % 5)
    return value if mode == "min" else 1.0 - value


# name -> (optimizer kind, factory(optimizer) -> scheduler, momentum key)
# momentum key: None, "momentum" or "beta1".
SCENARIOS = {
    "lambda_one": ("sgd", lambda o: L.LambdaLR(o, lambda e: 0.97 ** e), None),
    "lambda_list": ("adam", lambda o: L.LambdaLR(
        o, [lambda e: 0.97 ** e, lambda e: 1.0 / (1.0 + 0.05 * e)]), None),
    "multiplicative": ("sgd", lambda o: L.MultiplicativeLR(
        o, lambda e: 0.99 if e % 2 else 0.995), None),
    "step": ("adam", lambda o: L.StepLR(o, 30, gamma=0.5), None),
    "multistep": ("sgd", lambda o: L.MultiStepLR(
        o, [30, 80, 80, 150], gamma=0.3), None),
    "exponential": ("rmsprop", lambda o: L.ExponentialLR(o, 0.98), None),
    "linear": ("adamw", lambda o: L.LinearLR(
        o, start_factor=0.1, end_factor=0.9, total_iters=100), None),
    "constant": ("sgd", lambda o: L.ConstantLR(
        o, factor=0.25, total_iters=40), None),
    "polynomial": ("adagrad", lambda o: L.PolynomialLR(
        o, total_iters=200, power=2.0), None),
    "cosine": ("adamw", lambda o: L.CosineAnnealingLR(
        o, T_max=70, eta_min=0.001), None),
    "warm_restarts_2": ("sgd", lambda o: L.CosineAnnealingWarmRestarts(
        o, T_0=10, T_mult=2, eta_min=1e-4), None),
    "warm_restarts_1": ("adam", lambda o: L.CosineAnnealingWarmRestarts(
        o, T_0=25), None),
    "one_cycle_sgd": ("sgd_momentum", lambda o: L.OneCycleLR(
        o, max_lr=[0.5, 0.05], total_steps=300), "momentum"),
    "one_cycle_adam": ("adam", lambda o: L.OneCycleLR(
        o, max_lr=0.01, total_steps=320, three_phase=True,
        anneal_strategy="linear", base_momentum=[0.8, 0.85],
        max_momentum=0.95), "beta1"),
    "one_cycle_fused_adamw": ("adamw", lambda o: L.OneCycleLR(
        o, max_lr=0.02, epochs=10, steps_per_epoch=31, pct_start=0.25,
        div_factor=10.0, final_div_factor=100.0), "beta1"),
    "one_cycle_fused_sgd": ("sgd_momentum", lambda o: L.OneCycleLR(
        o, max_lr=0.3, total_steps=305), "momentum"),
    "one_cycle_rmsprop": ("rmsprop", lambda o: L.OneCycleLR(
        o, max_lr=0.05, total_steps=300, cycle_momentum=False), None),
    "warmup_cosine": ("adamw", lambda o: L.SequentialLR(
        o, [L.LinearLR(o, start_factor=0.01, total_iters=50),
            L.CosineAnnealingLR(o, T_max=250, eta_min=1e-5)],
        milestones=[50]), None),
    "sequential_3": ("sgd", lambda o: L.SequentialLR(
        o, [L.ConstantLR(o, factor=0.5, total_iters=20),
            L.ExponentialLR(o, 0.99), L.StepLR(o, 30, 0.5)],
        milestones=[40, 150]), None),
    "chained": ("sgd", lambda o: L.ChainedScheduler(
        [L.ConstantLR(o, factor=0.5, total_iters=25),
         L.ExponentialLR(o, 0.99)]), None),
    "plateau_min_rel": ("sgd", lambda o: L.ReduceLROnPlateau(
        o, mode="min", factor=0.8, patience=5, threshold=0.01,
        threshold_mode="rel", cooldown=3, min_lr=[0.001, 0.0005]), None),
    "plateau_max_abs": ("adam", lambda o: L.ReduceLROnPlateau(
        o, mode="max", factor=0.7, patience=3, threshold=0.05,
        threshold_mode="abs", min_lr=1e-4, eps=1e-6), None),
}


def values(optimizer, momentum):
    out = [g["lr"] for g in optimizer.param_groups]
    if momentum == "momentum":
        out += [g["momentum"] for g in optimizer.param_groups]
    elif momentum == "beta1":
        out += [g["betas"][0] for g in optimizer.param_groups]
    return " ".join(float(v).hex() for v in out)


def step(scheduler, i):
    if isinstance(scheduler, L.ReduceLROnPlateau):
        scheduler.step(plateau_metric(i, scheduler.mode))
    else:
        scheduler.step()


def sig(v):
    """Type and value of a state dict entry, as the C++ test writes it."""
    if isinstance(v, bool):
        return f"bool={v}"
    if isinstance(v, int):
        return f"int={v}"
    if isinstance(v, float):
        return f"float={v.hex()}"
    if isinstance(v, str):
        return f"str={v}"
    if v is None:
        return "None"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{sig(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(sig(x) for x in v) + "]"
    raise TypeError(type(v))


def for_cpp(state):
    """LibTorch's unpickler reads no collections.Counter (MultiStepLR)."""
    state = dict(state)
    if "milestones" in state:
        state["milestones"] = dict(state["milestones"])
    if "_schedulers" in state:
        state["_schedulers"] = [for_cpp(s) for s in state["_schedulers"]]
    return state


ERRORS = {
    "constant_factor": lambda o: L.ConstantLR(o, factor=1.5),
    "linear_start": lambda o: L.LinearLR(o, start_factor=0.0),
    "linear_end": lambda o: L.LinearLR(o, end_factor=1.5),
    "warm_restarts_T_0": lambda o: L.CosineAnnealingWarmRestarts(o, T_0=0),
    "warm_restarts_T_mult": lambda o: L.CosineAnnealingWarmRestarts(
        o, T_0=5, T_mult=0),
    "one_cycle_no_steps": lambda o: L.OneCycleLR(o, max_lr=0.1),
    "one_cycle_total_steps": lambda o: L.OneCycleLR(
        o, max_lr=0.1, total_steps=0),
    "one_cycle_epochs": lambda o: L.OneCycleLR(
        o, max_lr=0.1, epochs=-2, steps_per_epoch=3),
    "one_cycle_pct_start": lambda o: L.OneCycleLR(
        o, max_lr=0.1, total_steps=10, pct_start=1.5),
    "one_cycle_anneal": lambda o: L.OneCycleLR(
        o, max_lr=0.1, total_steps=10, anneal_strategy="exp"),
    "one_cycle_max_lr": lambda o: L.OneCycleLR(
        o, max_lr=[0.1, 0.2, 0.3], total_steps=10),
    "one_cycle_no_momentum": lambda o: L.OneCycleLR(
        make_optimizer("adagrad"), max_lr=0.1, total_steps=10),
    "plateau_factor": lambda o: L.ReduceLROnPlateau(o, factor=1.0),
    "plateau_mode": lambda o: L.ReduceLROnPlateau(o, mode="foo"),
    "plateau_threshold_mode": lambda o: L.ReduceLROnPlateau(
        o, threshold_mode="x"),
    "plateau_min_lr": lambda o: L.ReduceLROnPlateau(o, min_lr=[0.1]),
    "lambda_count": lambda o: L.LambdaLR(o, [lambda e: 1.0] * 3),
    "sequential_empty": lambda o: L.SequentialLR(o, [], []),
    "sequential_milestones": lambda o: L.SequentialLR(
        o, [L.StepLR(o, 3), L.StepLR(o, 4)], milestones=[]),
    "sequential_plateau": lambda o: L.SequentialLR(
        o, [L.StepLR(o, 3), L.ReduceLROnPlateau(o)], milestones=[5]),
    "chained_empty": lambda o: L.ChainedScheduler([]),
}


def overstep(o):
    s = L.OneCycleLR(o, max_lr=0.1, total_steps=10)
    for _ in range(11):
        s.step()


ERRORS["one_cycle_overstep"] = overstep


def run(directory, steps, save_at):
    for name, (kind, factory, momentum) in SCENARIOS.items():
        optimizer = make_optimizer(kind)
        scheduler = factory(optimizer)
        print("traj", name, 0, values(optimizer, momentum))
        for i in range(1, steps + 1):
            step(scheduler, i)
            print("traj", name, i, values(optimizer, momentum))
            if i == save_at:
                state = scheduler.state_dict()
                print("state", name, sig(state))
                torch.save(for_cpp(state),
                           os.path.join(directory, name + ".py.pt"))
    for name, make in ERRORS.items():
        try:
            make(make_optimizer("sgd"))
            print("error", name, "none")
        except Exception as e:  # noqa: BLE001
            print("error", name, type(e).__name__, str(e).replace("\n", " "))


def resume(directory, steps, save_at):
    for name, (kind, factory, momentum) in SCENARIOS.items():
        path = os.path.join(directory, name + ".cpp.pt")
        if not os.path.exists(path):
            continue
        # LibTorch's pickler tags dicts and lists with restore_type_tag.
        with torch.serialization.safe_globals(
                [torch.jit._pickle.restore_type_tag]):
            state = torch.load(path, weights_only=True)
        optimizer = make_optimizer(kind)
        scheduler = factory(optimizer)
        for group, lr in zip(optimizer.param_groups, state["_last_lr"]):
            group["lr"] = lr
        scheduler.load_state_dict(state)
        for i in range(save_at + 1, steps + 1):
            step(scheduler, i)
            print("cont", name, i, values(optimizer, momentum))


if __name__ == "__main__":
    mode, directory, steps, save_at = sys.argv[1:5]
    {"run": run, "resume": resume}[mode](directory, int(steps), int(save_at))
