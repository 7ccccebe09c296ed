"""Python's attention over packed q/k/v for tests/nn/qkv_attention_test.cpp.

Usage: qkv_attention_oracle.py CASE...   where CASE is DTYPE:CAUSAL[:autocast]
(DTYPE f32|bf16, CAUSAL 0|1). For each case, after torch.manual_seed(0):
qkv = randn(2, 6, 3 * 8), g = randn(2, 6, 8), float32, then cast to DTYPE
(not with autocast, where the lines run under torch.autocast("cpu",
bfloat16) on the float32 tensors); two heads of 4. Runs the lines that
lamp/nn/qkv_attention.h names as its Python twin, backward with g, and
prints "case CASE", then "y BITS..." and "g BITS..." (qkv's gradient) as
the hex of each element's bits.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.nn.functional as F
from oracle_bits import hex_bits

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
B, T, H, D = 2, 6, 2, 4
C = H * D


def run(case):
    parts = case.split(":")
    dtype, causal = DTYPES[parts[0]], parts[1] == "1"
    autocast = len(parts) > 2 and parts[2] == "autocast"
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * C)
    g = torch.randn(B, T, C)
    if not autocast:
        qkv, g = qkv.to(dtype), g.to(dtype)
    qkv.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        y = y.transpose(1, 2).reshape(B, T, C)
    y.backward(g.to(y.dtype))
    print("case", case)
    print("y", hex_bits(y))
    print("g", hex_bits(qkv.grad))


def main():
    for case in sys.argv[1:]:
        run(case)


if __name__ == "__main__":
    main()
