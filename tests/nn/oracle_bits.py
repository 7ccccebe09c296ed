"""The bits of a tensor as the C++ tests print them (lamp::test::hex_bits):
each element's 4 or 2 bytes as a hex word, separated by spaces. Shared by
the oracles of this folder (their own folder is first on sys.path, when run
directly and on the oracle server)."""

import torch


def hex_bits(t):
    t = t.detach().contiguous()
    view = torch.int32 if t.element_size() == 4 else torch.int16
    mask = 0xFFFFFFFF if t.element_size() == 4 else 0xFFFF
    width = 8 if t.element_size() == 4 else 4
    bits = t.view(view).flatten().tolist()
    return " ".join(f"{b & mask:0{width}x}" for b in bits)
