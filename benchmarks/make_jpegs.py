"""Writes an ImageNet-like ImageFolder for the loader benchmarks: CLASSES
folders of PER_CLASS JPEGs of about 500x375 (sizes vary a little, as
ImageNet's do), quality 90, with natural-looking content (smooth colour
fields, edges and noise, so the files are ~100 KB like ImageNet's).

  python benchmarks/make_jpegs.py OUT [--classes 100] [--per-class 100]
"""

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image, ImageFilter


def one(args):
    path, seed = args
    rng = np.random.default_rng(seed)
    w = int(rng.integers(450, 551))
    h = int(rng.integers(330, 421))
    small = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3),
                         dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    arr = np.asarray(img.filter(ImageFilter.EDGE_ENHANCE)).astype(np.int16)
    arr = arr + rng.integers(-12, 13, size=arr.shape)
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(
        path, quality=90)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--per-class", type=int, default=100)
    a = p.parse_args()
    jobs = []
    for c in range(a.classes):
        d = os.path.join(a.out, f"n{c:08d}")
        os.makedirs(d, exist_ok=True)
        for i in range(a.per_class):
            jobs.append((os.path.join(d, f"img_{i:05d}.JPEG"),
                         c * 100003 + i))
    with ProcessPoolExecutor() as pool:
        list(pool.map(one, jobs, chunksize=64))
    print(f"{len(jobs)} JPEGs in {a.out}")


if __name__ == "__main__":
    main()
