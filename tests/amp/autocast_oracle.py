"""Prints the dtype that Python's torch.autocast gives for each case of the
autocast differential test (tests/autocast_test.cpp has the same cases).

Usage: autocast_oracle.py DEVICE:DTYPE [DEVICE:DTYPE ...]
Output: one line per case, "DEVICE DTYPE CASE RESULT_DTYPE", dtypes named as
c10::ScalarType prints them (Float, Half, BFloat16, ...).
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.nn.functional as F

NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def inputs(device, lp):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    return {
        "a": r(8, 16), "b": r(16, 4), "c": r(8, 4),
        "w": r(4, 16), "bias": r(4),
        "a3": r(2, 8, 16), "b3": r(2, 16, 4),
        "img": r(2, 3, 8, 8), "kernel": r(4, 3, 3, 3),
        "ln_w": r(16), "ln_b": r(16),
        "bn_mean": r(3), "bn_var": r(3).abs() + 1, "bn_w": r(3), "bn_b": r(3),
        "logits": r(8, 10),
        "target": torch.arange(8, device=device) % 10,
        "a_lp": r(8, 16).to(lp),
    }


def ops(t):
    a, b = t["a"], t["b"]
    return {
        "mm": lambda: torch.mm(a, b),
        "addmm": lambda: torch.addmm(t["c"], a, b),
        "linear": lambda: F.linear(a, t["w"], t["bias"]),
        "conv2d": lambda: F.conv2d(t["img"], t["kernel"], t["bias"]),
        "bmm": lambda: torch.bmm(t["a3"], t["b3"]),
        "matmul": lambda: torch.matmul(a, b),
        "relu": lambda: torch.relu(a),
        "softmax": lambda: torch.softmax(a, -1),
        "log_softmax": lambda: torch.log_softmax(a, -1),
        "layer_norm": lambda: F.layer_norm(a, [16], t["ln_w"], t["ln_b"]),
        "batch_norm": lambda: F.batch_norm(
            t["img"], t["bn_mean"].clone(), t["bn_var"].clone(), t["bn_w"],
            t["bn_b"], True),
        "sum": lambda: torch.sum(a),
        "mse_loss": lambda: F.mse_loss(a, a.flip(0)),
        "cross_entropy": lambda: F.cross_entropy(t["logits"], t["target"]),
        "bce_with_logits": lambda: F.binary_cross_entropy_with_logits(
            a, torch.sigmoid(a.flip(0))),
        "exp": lambda: torch.exp(a),
        "gelu": lambda: F.gelu(a),
        "vector_norm": lambda: torch.linalg.vector_norm(a),
        "cat_mixed": lambda: torch.cat([a, t["a_lp"]]),
        "stack_mixed": lambda: torch.stack([a, t["a_lp"]]),
        "add_mixed": lambda: a + t["a_lp"],
        "relu_of_mm": lambda: torch.relu(torch.mm(a, b)),
        "softmax_of_lowp": lambda: torch.softmax(t["a_lp"], -1),
        "layer_norm_of_lowp": lambda: F.layer_norm(
            t["a_lp"], [16], t["ln_w"], t["ln_b"]),
        "mm_of_lowp": lambda: torch.mm(t["a_lp"], b),
    }


def run(device, dtype_name):
    lp = DTYPES[dtype_name]
    other = torch.bfloat16 if lp == torch.float16 else torch.float16
    t = inputs(device, lp)
    a, b = t["a"], t["b"]
    out = {}
    with torch.autocast(device, dtype=lp):
        for name, op in ops(t).items():
            out[name] = op().dtype
        with torch.autocast(device, enabled=False):
            out["nested_disabled"] = torch.mm(a, b).dtype
        out["after_nested_disabled"] = torch.mm(a, b).dtype
        with torch.autocast(device, dtype=other):
            out["nested_other_dtype"] = torch.mm(a, b).dtype
        out["after_nested_other_dtype"] = torch.mm(a, b).dtype
    with torch.autocast(device, dtype=other):
        with torch.autocast(device):
            out["nested_inherits_dtype"] = torch.mm(a, b).dtype
    out["outside"] = torch.mm(a, b).dtype
    for name, dtype in out.items():
        print(device, dtype_name, name, NAMES[dtype])


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(*arg.split(":"))
