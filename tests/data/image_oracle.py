"""Pillow and torchvision as the oracle of lamp::data's decoding and
transforms (tests/image_decoder_test.cpp, tests/transforms_test.cpp).

Usage:
  image_oracle.py images DIR   write test images into DIR and, in
                               DIR/expected.pt, Pillow's RGB pixels of each
  image_oracle.py crops SEED   print RandomResizedCrop.get_params boxes and
                               RandomHorizontalFlip draws for several image
                               sizes, from torch.manual_seed(SEED)
  image_oracle.py folder DIR CLASSES PER_CLASS SIZE SEED
                               an ImageFolder of learnable JPEGs (and one PNG
                               per class): class k is a colour and a stripe
                               direction, under noise
  image_oracle.py pipeline DIR OUT  torchvision's ImageFolder with the eval
                               transform (Resize, CenterCrop, ToTensor,
                               Normalize) of every sample, stacked, in OUT
  image_oracle.py resize FILE OUT  torchvision's train and eval transforms of
                               FILE with fixed boxes, as tensors in OUT
"""

import io
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import numpy as np
import torch
from PIL import Image
from torchvision import transforms
from torchvision.transforms import functional as F


def pattern(h, w, seed):
    # Smooth gradients plus noise: realistic for JPEG, exercises every value.
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                    (x + y) * 255 // max(h + w - 2, 1)], axis=-1)
    img = img + rng.integers(-20, 21, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def images(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rgb = Image.fromarray(pattern(375, 500, 0))
    files = {}

    def save(name, img, **kw):
        path = os.path.join(out_dir, name)
        img.save(path, **kw)
        files[name] = path

    save("q90_420.jpg", rgb, quality=90)
    save("q75_444.jpg", rgb, quality=75, subsampling=0)
    save("q95_422.jpg", rgb, quality=95, subsampling=1)
    save("progressive.jpg", rgb, quality=90, progressive=True)
    save("odd_17x33.jpg", Image.fromarray(pattern(17, 33, 1)), quality=90)
    save("one_pixel.jpg", Image.fromarray(pattern(1, 1, 2)), quality=90)
    save("gray.jpg", rgb.convert("L"), quality=90)
    # Pillow writes CMYK JPEGs inverted, with an Adobe marker (as Photoshop).
    save("cmyk.jpg", rgb.convert("CMYK"), quality=90)
    save("wide_4000.jpg", Image.fromarray(pattern(300, 4000, 4)), quality=85)
    save("rgb.png", rgb)
    save("rgba.png", rgb.convert("RGBA"))
    save("gray.png", rgb.convert("L"))
    save("gray_alpha.png", rgb.convert("LA"))
    save("palette.png", rgb.convert("P", palette=Image.ADAPTIVE, colors=50))
    save("bilevel.png", rgb.convert("1"))
    # 16-bit grey: Pillow opens it as I;16 and converts to RGB through L.
    save("gray16.png", Image.fromarray(
        (pattern(40, 30, 3)[..., 0].astype(np.uint16) * 257)))
    expected = {}
    for name, path in files.items():
        with Image.open(path) as img:
            arr = np.asarray(img.convert("RGB")).copy()
        expected[name] = torch.from_numpy(arr)
    # Pillow's draft(): the JPEG reduced 2, 4 and 8 times in the DCT domain.
    for name in ["q90_420.jpg", "q75_444.jpg", "q95_422.jpg",
                 "progressive.jpg", "odd_17x33.jpg", "gray.jpg", "cmyk.jpg",
                 "wide_4000.jpg"]:
        for s in (2, 4, 8):
            with Image.open(files[name]) as img:
                w, h = img.size
                img.draft("RGB", (w // s, h // s))
                assert img.size == ((w + s - 1) // s, (h + s - 1) // s), name
                arr = np.asarray(img.convert("RGB")).copy()
            expected[f"{name}@{s}"] = torch.from_numpy(arr)
    torch.save(expected, os.path.join(out_dir, "expected.pt"))
    print(" ".join(sorted(files)))


def crops(seed):
    torch.manual_seed(seed)
    flip = transforms.RandomHorizontalFlip()
    sizes = [(375, 500), (500, 375), (224, 224), (1, 1), (10, 1000),
             (1000, 10), (3, 4), (2000, 1500)]
    for h, w in sizes * 4:
        img = torch.empty(3, h, w)
        i, j, hh, ww = transforms.RandomResizedCrop.get_params(
            img, [0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0])
        flipped = int(torch.rand(1) < flip.p)
        print(h, w, i, j, hh, ww, flipped)
    # Other scale and ratio ranges.
    for h, w in sizes:
        img = torch.empty(3, h, w)
        print(h, w, *transforms.RandomResizedCrop.get_params(
            img, [0.5, 0.9], [0.5, 2.0]), 0)


def resize(path, out):
    with Image.open(path) as img:
        pil = img.convert("RGB")
    tensor = torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1)
    result = {}
    for k, (i, j, h, w) in enumerate([(10, 20, 300, 400), (0, 0, 375, 500),
                                      (100, 50, 30, 40), (5, 7, 200, 100)]):
        # What torchvision's RandomResizedCrop does to a PIL image.
        pil_out = F.resized_crop(pil, i, j, h, w, [224, 224])
        result[f"train{k}_pil"] = torch.from_numpy(np.asarray(pil_out).copy())
        result[f"train{k}_tensor"] = F.resized_crop(
            tensor, i, j, h, w, [224, 224], antialias=True).permute(1, 2, 0)
    evaluate = transforms.Compose([transforms.Resize(256),
                                   transforms.CenterCrop(224)])
    result["eval_pil"] = torch.from_numpy(np.asarray(evaluate(pil)).copy())
    result["eval_tensor"] = evaluate(tensor).permute(1, 2, 0).contiguous()
    torch.save(result, out)


def folder(out_dir, classes, per_class, size, seed, progressive=0):
    # progressive > 0: every progressive-th JPEG is a progressive one.
    rng = np.random.default_rng(seed)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40),
               (200, 40, 200), (40, 200, 200), (230, 230, 230), (30, 30, 30)]
    for k in range(classes):
        d = os.path.join(out_dir, f"class_{k:02d}")
        os.makedirs(d, exist_ok=True)
        for n in range(per_class):
            h = int(rng.integers(size * 3 // 4, size * 5 // 4))
            w = int(rng.integers(size * 3 // 4, size * 5 // 4))
            y, x = np.mgrid[0:h, 0:w]
            stripes = ((x if k % 2 else y) // 4) % 2
            img = np.array(colours[k % len(colours)], dtype=np.int32) * (
                0.6 + 0.4 * stripes[..., None])
            img = img + rng.integers(-40, 41, size=(h, w, 3))
            img = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
            if n == 0:
                img.save(os.path.join(d, f"img_{n:04d}.png"))
            else:
                img.save(os.path.join(d, f"img_{n:04d}.jpg"), quality=90,
                         progressive=progressive > 0 and n % progressive == 0)


def pipeline(root, out, resize, crop):
    from torchvision import datasets
    t = transforms.Compose([
        transforms.Resize(resize), transforms.CenterCrop(crop),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(root, transform=t)
    images = torch.stack([ds[i][0] for i in range(len(ds))])
    targets = torch.tensor(ds.targets)
    torch.save({"images": images, "targets": targets}, out)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "images":
        images(sys.argv[2])
    elif command == "crops":
        crops(int(sys.argv[2]))
    elif command == "folder":
        folder(sys.argv[2], *(int(a) for a in sys.argv[3:8]))
    elif command == "pipeline":
        pipeline(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif command == "resize":
        resize(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command}")
