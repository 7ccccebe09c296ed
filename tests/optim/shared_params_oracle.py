"""Python's side of tests/optim/shared_params_test.cpp: a model whose output
layer shares the token embedding's weight (tied, as GPT-2's LM head), so
that model.parameters() lists it once.

  shared_params_oracle.py step OPTIMIZER STEPS
      STEPS steps of torch.optim's fused OPTIMIZER (adam, adamw, sgd) on the
      tied model; prints "param NAME BITS..." for each parameter.
  shared_params_oracle.py unscale
      One backward of the loss scaled by 1024 and GradScaler("cpu").unscale_
      of SGD over the parameters; prints "grad NAME BITS...".
  shared_params_oracle.py clip
      torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5) after one
      backward; prints "norm BITS" and "grad NAME BITS...".
  shared_params_oracle.py load CKPT
      torch.load(CKPT, weights_only=True) of lamp's checkpoint of the tied
      model and a FusedAdamW; prints what Python sees: "keys ...", "shared
      0|1" (the two names one storage), "same_as_python 0|1" (the model
      entry laid out as Python's own torch.save of the tied state_dict
      loads), "optimizer_params N" and "max_abs_diff D" against Python's
      own model after the same steps.

Every tensor comes from torch.manual_seed(0) and torch.randn in the order
the C++ test draws them, which LibTorch reproduces.
"""

import io
import sys
import warnings

warnings.filterwarnings("ignore")

import torch

TOKENS = [1, 3, 5, 7, 9, 0]
TARGETS = [2, 4, 6, 8, 0, 1]


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight
        torch.manual_seed(0)
        with torch.no_grad():
            self.wte.weight.copy_(torch.randn(10, 4))
            self.fc.weight.copy_(torch.randn(4, 4))
            self.fc.bias.copy_(torch.randn(4))

    def forward(self, tokens):
        return self.head(torch.tanh(self.fc(self.wte(tokens))))


def loss_of(model, scale=1.0):
    logits = model(torch.tensor(TOKENS))
    return torch.nn.functional.cross_entropy(
        logits, torch.tensor(TARGETS)) * scale


def hex_bits(t):
    bits = t.detach().contiguous().view(torch.int32).flatten().tolist()
    return " ".join(f"{b & 0xffffffff:08x}" for b in bits)


def make_optimizer(name, params):
    return {
        "adam": lambda: torch.optim.Adam(params, lr=0.01, fused=True),
        "adamw": lambda: torch.optim.AdamW(
            params, lr=0.01, weight_decay=0.1, fused=True),
        "sgd": lambda: torch.optim.SGD(
            params, lr=0.1, momentum=0.9, fused=True),
    }[name]()


def train(model, name, steps):
    opt = make_optimizer(name, model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model).backward()
        opt.step()
    return opt


def step(name, steps):
    model = Tied()
    train(model, name, steps)
    for n, p in model.named_parameters():
        print("param", n, hex_bits(p))


def unscale():
    model = Tied()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(loss_of(model)).backward()
    scaler.unscale_(opt)
    for n, p in model.named_parameters():
        print("grad", n, hex_bits(p.grad))


def clip():
    model = Tied()
    loss_of(model).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    print("norm", hex_bits(norm))
    for n, p in model.named_parameters():
        print("grad", n, hex_bits(p.grad))


def load(path):
    ckpt = torch.load(path, weights_only=True)
    state = ckpt["model"]
    print("keys", " ".join(sorted(state.keys())))
    wte, head = state["wte.weight"], state["head.weight"]
    print("shared", int(wte.untyped_storage().data_ptr()
                        == head.untyped_storage().data_ptr()))
    # Python's own save of the same tied model, loaded back.
    ours = Tied()
    train(ours, "adamw", 2)
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    theirs = torch.load(buffer, weights_only=True)
    same = sorted(theirs.keys()) == sorted(state.keys()) and (
        theirs["wte.weight"].untyped_storage().data_ptr()
        == theirs["head.weight"].untyped_storage().data_ptr())
    print("same_as_python", int(same))
    print("optimizer_params",
          sum(len(g["params"]) for g in ckpt["optimizer"]["param_groups"]))
    print("max_abs_diff", max(
        (state[k] - theirs[k]).abs().max().item() for k in theirs))


def main():
    mode = sys.argv[1]
    if mode == "step":
        step(sys.argv[2], int(sys.argv[3]))
    elif mode == "unscale":
        unscale()
    elif mode == "clip":
        clip()
    elif mode == "load":
        load(sys.argv[2])
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
