"""Python's side of the checkpoint interop tests (tests/checkpoint_test.cpp).

  checkpoint_oracle.py resnet50 CKPT
      Loads lamp's ResNet-50 checkpoint with torch.load(weights_only=True)
      into torchvision's resnet50 (strict=True) and checks that it computes
      the output lamp saved beside it. Prints "max_abs_diff D".
  checkpoint_oracle.py mlp CKPT OUT
      Loads lamp's checkpoint of an MLP, FusedAdam and GradScaler into
      nn.Sequential, torch.optim.Adam(fused=True) and torch.amp.GradScaler,
      takes one AMP step on the batch saved in it, and writes the result as
      a checkpoint in the same layout (model.state_dict() as it is, an
      OrderedDict) to OUT.
  checkpoint_oracle.py newer OUT
      Writes a checkpoint whose format version is newer than lamp's.
  checkpoint_oracle.py zip64 SRC OUT
      Copies the archive SRC into OUT member by member (stored) with
      zipfile's zip64 limit lowered to 1 KiB, so that sizes and offsets
      above it are in zip64 extra fields, as in a checkpoint over 4 GiB.
  checkpoint_oracle.py summary FILE
      torch.load(FILE, weights_only=True) of a dict of tensors: prints the
      number of tensors and the sum of all their elements (float64).
  checkpoint_oracle.py zipcheck FILE
      Checks FILE with Python's zipfile (every member's CRC) and prints, per
      member, its name, size and its data's offset modulo 64.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch


def resnet50(path):
    import torchvision

    ckpt = torch.load(path, weights_only=True)
    model = torchvision.models.resnet50()
    model.load_state_dict(ckpt["model"], strict=True)
    model.eval()
    with torch.no_grad():
        out = model(ckpt["input"])
    print("max_abs_diff", (out - ckpt["output"]).abs().max().item())


def mlp(path, out):
    ckpt = torch.load(path, weights_only=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.load_state_dict(ckpt["model"], strict=True)
    opt = torch.optim.Adam(model.parameters(), fused=True)
    opt.load_state_dict(ckpt["optimizer"])
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(ckpt["scaler"])
    opt.zero_grad()
    loss = model(ckpt["x"]).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict(), "step": ckpt["step"] + 1,
                "x": ckpt["x"]}, out)


def zip64(src, out):
    import zipfile

    zipfile.ZIP64_LIMIT = 1024
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(
            out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as b:
        for info in a.infolist():
            with b.open(info.filename, "w", force_zip64=True) as f:
                f.write(a.read(info.filename))
    # torch.load reads it too.
    torch.load(out, weights_only=True)
    print("ok")


def summary(path):
    d = torch.load(path, weights_only=True)
    total = sum(t.double().sum().item() for t in d.values())
    print(len(d), repr(total))


def zipcheck(path):
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        bad = z.testzip()
        assert bad is None, f"bad CRC: {bad}"
        for info in z.infolist():
            f.seek(info.header_offset)
            head = f.read(30)
            n, e = struct.unpack("<HH", head[26:30])
            data = info.header_offset + 30 + n + e
            print(info.filename, info.file_size, data % 64)


def newer(out):
    torch.save({"lamp": {"format_version": 99, "step": 1}}, out)


if __name__ == "__main__":
    {"resnet50": resnet50, "mlp": mlp, "newer": newer, "zip64": zip64,
     "zipcheck": zipcheck, "summary": summary}[
        sys.argv[1]](*sys.argv[2:])
