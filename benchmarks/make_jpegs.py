"""Writes an ImageNet-like ImageFolder for the loader benchmarks: CLASSES
folders of PER_CLASS images named *.JPEG, and OUT/stats.json with what a
decoder sees in them (mean pixels and bytes a file, how many of each kind).

Profiles (--profile):
  photo   (default) what ImageNet's training set looks like to a decoder:
          sides about 470 x 390 on average with a long tail (100 to 2,400
          px), ~110 kB a file at quality 75-95 (1/f texture, hard edges and
          grain, not smooth gradients), 4:2:0 mostly, some 4:4:4 and 4:2:2,
          ~2 % greyscale, ~1 % progressive, and a few CMYK JPEGs and PNGs
          named .JPEG (ImageNet has both).
  hard    the photo profile with twice the pixels.
  smooth  the older set: about 500 x 375, quality 90, smooth colour fields
          (~70 kB a file; easier than photographs).

  python benchmarks/make_jpegs.py OUT [--profile photo] [--classes 100]
                                      [--per-class 100] [--seed 0]
"""

import argparse
import io
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image, ImageDraw, ImageFile, ImageFilter

# NOTE: Pillow sizes its output buffer for progressive files at about a byte
# a pixel; textured files at quality 95 need more ("Suspension not allowed
# here").
ImageFile.MAXBLOCK = 1 << 26


def smooth(rng):
    w = int(rng.integers(450, 551))
    h = int(rng.integers(330, 421))
    small = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3),
                         dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    arr = np.asarray(img.filter(ImageFilter.EDGE_ENHANCE)).astype(np.int16)
    arr = arr + rng.integers(-12, 13, size=arr.shape)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)), {
        "quality": 90}


def photo_size(rng, area_scale):
    # Most ImageNet photos are 500 px on their long side; the rest spread
    # log-normally around it, from thumbnails to camera originals.
    if rng.random() < 0.55:
        long_side = 500.0
    else:
        long_side = float(np.clip(rng.lognormal(math.log(400), 0.5), 100,
                                  2400))
    ratio = rng.choice([0.75, 0.75, 0.75, 0.667, 0.5625, 1.0,
                        float(rng.uniform(0.5, 1.0))])
    long_side *= math.sqrt(area_scale)
    short_side = max(16, int(round(long_side * ratio)))
    long_side = max(16, int(round(long_side)))
    if rng.random() < 0.75:
        return long_side, short_side  # landscape: w, h
    return short_side, long_side


def texture(rng, h, w):
    # 1/f noise: octaves of upsampled random fields, mostly luminance, each
    # finer one a little weaker; then hard-edged shapes and sensor grain.
    img = np.zeros((h, w, 3), np.float32)
    amp = 70.0
    cell = max(h, w) // 2
    while cell >= 1:
        gh, gw = h // cell + 2, w // cell + 2
        field = 0.4 * rng.normal(0, 1, size=(gh, gw, 3)) + rng.normal(
            0, 1, size=(gh, gw, 1))
        img += amp * np.stack([
            np.asarray(Image.fromarray(field[..., c].astype(np.float32))
                       .resize((w, h), Image.BICUBIC)) for c in range(3)], -1)
        amp *= 0.85
        cell //= 2
    img += rng.uniform(60, 190, size=3)
    out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(out)
    for _ in range(int(rng.integers(3, 12))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1 = x0 + int(rng.integers(10, w // 2 + 11))
        y1 = y0 + int(rng.integers(10, h // 2 + 11))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1, y1), fill=fill)
    arr = np.asarray(out).astype(np.float32)
    arr += rng.normal(0, rng.uniform(18, 36), size=arr.shape)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def photo(rng, area_scale, size=None):
    w, h = size or photo_size(rng, area_scale)
    img = texture(rng, h, w)
    save = {"quality": int(rng.integers(75, 96)),
            "subsampling": int(rng.choice([2] * 16 + [0] * 2 + [1] * 2))}
    if rng.random() < 0.02:
        img = img.convert("L")
    if rng.random() < 0.01:
        save["progressive"] = True
    return img, save


def one(args):
    path, seed, profile, special, size = args
    rng = np.random.default_rng(seed)
    if profile == "smooth":
        img, save = smooth(rng)
    else:
        img, save = photo(rng, 2.0 if profile == "hard" else 1.0, size)
    kind = "jpeg"
    if special == "cmyk":
        img, kind = img.convert("RGB").convert("CMYK"), "cmyk"
    if special == "png":
        img.save(path, format="PNG")
        kind = "png"
    else:
        img.save(path, format="JPEG", **save)
        if kind == "jpeg" and img.mode == "L":
            kind = "grey"
        elif kind == "jpeg" and save.get("progressive"):
            kind = "progressive"
    return img.size[0] * img.size[1], os.path.getsize(path), kind


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--profile", choices=["photo", "hard", "smooth"],
                   default="photo")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one-size", metavar="WxH",
                   help="every photo this size (one frame geometry for the "
                   "whole set: what a decoder does the first time it meets "
                   "a size, measured apart)")
    a = p.parse_args()
    size = tuple(int(v) for v in a.one_size.split("x")) if a.one_size else None
    total = a.classes * a.per_class
    # A few files of the kinds ImageNet has a handful of (22 CMYK JPEGs and
    # one PNG among 1.28 M): here at least 2 of each, spread over classes.
    specials = {}
    if a.profile != "smooth":
        every = max(total // max(2, total // 2000), 1)
        for k in range(0, total, every):
            specials[k] = "cmyk"
            specials[(k + every // 2) % total] = "png"
    jobs = []
    for c in range(a.classes):
        d = os.path.join(a.out, f"n{c:08d}")
        os.makedirs(d, exist_ok=True)
        for i in range(a.per_class):
            k = c * a.per_class + i
            jobs.append((os.path.join(d, f"img_{i:05d}.JPEG"),
                         a.seed * 1000003 + c * 100003 + i, a.profile,
                         specials.get(k), size))
    with ProcessPoolExecutor() as pool:
        results = list(pool.map(one, jobs, chunksize=16))
    pixels = np.array([r[0] for r in results], dtype=np.float64)
    sizes = np.array([r[1] for r in results], dtype=np.float64)
    kinds = {}
    for r in results:
        kinds[r[2]] = kinds.get(r[2], 0) + 1
    stats = {"profile": a.profile, "files": len(results),
             "mean_pixels": round(pixels.mean()),
             "median_pixels": round(float(np.median(pixels))),
             "max_pixels": int(pixels.max()),
             "mean_bytes": round(sizes.mean()), "kinds": kinds}
    with open(os.path.join(a.out, "stats.json"), "w") as f:
        json.dump(stats, f)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
