"""Python's torch.nn.functional.linear for tests/nn/linear_test.cpp.

Usage: linear_oracle.py CASE...   where CASE is DTYPE:RANK:BIAS[:autocast]
(DTYPE f32|bf16|f16, RANK 2..4, BIAS 0|1). For each case, after
torch.manual_seed(0): x = randn(shape) (shape (3, 5) for rank 2, (2, 3, 5)
for rank 3, (2, 2, 3, 5) for rank 4), w = randn(7, 5), b = randn(7), g =
randn(output shape), all float32, then cast to DTYPE (not with autocast,
where F.linear runs under torch.autocast("cpu", bfloat16) on the float32
tensors). Prints "case CASE", then "y BITS...", "gx BITS...", "gw BITS...",
"gb BITS..." (gb only with a bias) as the hex of each element's bits, after
y.backward(g).
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
from oracle_bits import hex_bits

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SHAPES = {2: (3, 5), 3: (2, 3, 5), 4: (2, 2, 3, 5)}


def run(case):
    parts = case.split(":")
    dtype, rank, bias = DTYPES[parts[0]], int(parts[1]), parts[2] == "1"
    autocast = len(parts) > 3 and parts[3] == "autocast"
    torch.manual_seed(0)
    x = torch.randn(SHAPES[rank])
    w = torch.randn(7, 5)
    b = torch.randn(7)
    g = torch.randn(SHAPES[rank][:-1] + (7,))
    if not autocast:
        x, w, b, g = x.to(dtype), w.to(dtype), b.to(dtype), g.to(dtype)
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = torch.nn.functional.linear(x, w, b if bias else None)
    y.backward(g.to(y.dtype))
    print("case", case)
    print("y", hex_bits(y))
    print("gx", hex_bits(x.grad))
    print("gw", hex_bits(w.grad))
    if bias:
        print("gb", hex_bits(b.grad))


def main():
    for case in sys.argv[1:]:
        run(case)


if __name__ == "__main__":
    main()
