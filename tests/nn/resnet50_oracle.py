"""Writes torchvision's ResNet-50 (random weights, random BatchNorm running
statistics), an input and its outputs in eval and train mode to a file that
tests/resnet50_test.cpp loads with torch::pickle_load.

Usage: resnet50_oracle.py OUT_FILE
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.resnet50()
with torch.no_grad():
    for name, buffer in model.named_buffers():
        if name.endswith("running_mean"):
            buffer.normal_(0, 0.1)
        elif name.endswith("running_var"):
            buffer.uniform_(0.5, 1.5)
x = torch.randn(2, 3, 64, 64)
state = {k: v.clone() for k, v in model.state_dict().items()}
with torch.no_grad():
    eval_out = model.eval()(x)
    train_out = model.train()(x)
torch.save({"state": state, "input": x, "eval": eval_out, "train": train_out,
            "parameters": sum(p.numel() for p in model.parameters())},
           sys.argv[1])
