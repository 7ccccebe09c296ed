"""Writes the JPEG files of the GPU JPEG decoding tests
(tests/nvjpeg_decoder_test.cpp, tests/jpeg_markers_test.cpp) with Pillow.

Usage: nvjpeg_oracle.py OUTDIR
Output: one line per file, "NAME WIDTH HEIGHT PATH".

The pictures are smooth (gradients and low-frequency waves, as most of a
photograph is) with a few hard-edged coloured boxes and mild noise, so that
decoders that upsample chroma differently still agree closely on most pixels
and the edges show how far they can differ. Quality 90, libjpeg-turbo's
defaults otherwise (Pillow writes JFIF files with the accurate integer DCT).
"""

import io
import sys

import numpy as np
from PIL import Image

# name: (mode, width, height, save options)
CASES = {
    "rgb420_500x375": ("RGB", 500, 375, dict(subsampling=2)),
    "rgb420_edges_500x375": ("RGB", 500, 375, dict(subsampling=2)),
    "rgb422_500x375": ("RGB", 500, 375, dict(subsampling=1)),
    "rgb444_500x375": ("RGB", 500, 375, dict(subsampling=0)),
    "gray_500x375": ("L", 500, 375, {}),
    "rgb420_progressive_500x375": (
        "RGB", 500, 375, dict(subsampling=2, progressive=True)),
    "gray_progressive_333x250": ("L", 333, 250, dict(progressive=True)),
    "rgb420_optimized_640x480": (
        "RGB", 640, 480, dict(subsampling=2, optimize=True)),
    "rgb420_17x33": ("RGB", 17, 33, dict(subsampling=2)),
    "rgb422_33x17": ("RGB", 33, 17, dict(subsampling=1)),
    "rgb444_17x33": ("RGB", 17, 33, dict(subsampling=0)),
    "gray_17x33": ("L", 17, 33, {}),
    "rgb420_1x1": ("RGB", 1, 1, dict(subsampling=2)),
    "gray_1x1": ("L", 1, 1, {}),
    "rgb420_1023x769": ("RGB", 1023, 769, dict(subsampling=2)),
    # Not for nvJPEG: 4 components (Adobe CMYK), and 3 components stored as
    # RGB rather than YCbCr (Adobe transform 0).
    "cmyk_64x48": ("CMYK", 64, 48, {}),
    "rgb_colorspace_64x48": ("RGB", 64, 48, dict(keep_rgb=True)),
}


def picture(mode, width, height, seed, boxes=False):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / 500, y / 375  # the same waves on every size
    channels = []
    for c in range(4):
        phase = rng.uniform(0, 2 * np.pi)
        wave = np.sin(2 * np.pi * (1.5 + c) * u + phase) * np.cos(
            2 * np.pi * (1 + 0.5 * c) * v)
        channels.append(128 + 60 * wave + 50 * (u - v) * (1 if c % 2 else -1))
    img = np.stack(channels, axis=-1)
    for _ in range(6 if boxes else 0):  # hard-edged boxes
        x0, y0 = rng.integers(0, max(width, 1)), rng.integers(0, max(height, 1))
        w, h = rng.integers(1, width // 3 + 2), rng.integers(1, height // 3 + 2)
        img[y0:y0 + h, x0:x0 + w, :] = rng.uniform(20, 235, size=4)
    img += rng.normal(0, 3, size=img.shape)
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    bands = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    return Image.fromarray(img[:, :, 0] if bands == 1 else img[:, :, :bands],
                           mode)


def main():
    out = sys.argv[1]
    for seed, (name, (mode, width, height, options)) in enumerate(
            sorted(CASES.items())):
        path = f"{out}/{name}.jpg"
        picture(mode, width, height, seed, boxes="edges" in name).save(
            path, quality=90, **options)
        print(name, width, height, path)

    # A baseline file whose EXIF segment holds a complete little JPEG (a
    # thumbnail, as cameras write), end marker included: cutting the main
    # image short must still read as truncated.
    thumb = io.BytesIO()
    picture("RGB", 16, 16, 99).save(thumb, format="JPEG", quality=75)
    name = "rgb420_exif_thumbnail_160x120"
    path = f"{out}/{name}.jpg"
    exif = b"Exif\x00\x00" + thumb.getvalue()
    picture("RGB", 160, 120, 100).save(
        path, quality=90, subsampling=2, exif=exif)
    print(name, 160, 120, path)


if __name__ == "__main__":
    main()
