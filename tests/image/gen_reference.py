#!/usr/bin/env python3
"""Test pictures and PIL/NumPy reference outputs for tests/test_image.c.

Regenerate with:  python3 tests/image/gen_reference.py   (needs pillow, numpy)
run from the repository root. It rewrites every file in tests/image/ except
itself; the pictures and the reference are made together, so a newer Pillow
or libjpeg may change bytes but never makes them disagree.

What the reference computes (the contract of data/image.h, done independently
with PIL and NumPy):
  centre:  img.resize((rw, rh), Image.BILINEAR) with the shorter side = size
           and the longer round(long * size / short), then the size x size
           window at (round((rw - size) / 2), round((rh - size) / 2)).
           round() is Python's (half to even), as torchvision.
  random:  torchvision RandomResizedCrop.get_params (scale [0.08, 1], ratio
           [3/4, 4/3], 10 attempts, centre fallback) with mmp_rng draws
           (xoshiro256**, re-implemented below), img.crop(box).resize((size,
           size), BILINEAR), then FLIP_LEFT_RIGHT when uniform() < 0.5.
  then     (np.float32(pixels) / 255 - mean) / std in float32, as (3, S, S).
PIL's BILINEAR is an antialiasing triangle filter (support scaled by the
shrink factor) with 8-bit rounding after each of its two passes; data/image.c
reimplements exactly that, so the stated tolerance is 1 level of 8 bits
(1 / (255 * std) after normalisation); on these pictures the C code matches
bit for bit, the level of slack is for other libjpeg builds decoding the JPEG
cases.

reference.bin: ASCII header lines, the line "data", then per case 3*S*S
little-endian float32. Header: "MMPIMGREF <version>", '#' comments,
"tolerance_levels N", "jpeg_error PNG JPG mean_abs M max_abs X" (what PIL's
own decode of the JPEG differs from the PNG, in 8-bit levels), and one
"case FILE MODE SIZE SEED STREAM MEAN*3 STD*3 X Y W H RW RH OX OY FLIP" per
case (the expected geometry, as mmp_image_geometry).
"""
import io
import math
import os
import sys

import numpy as np
from PIL import Image, ImageFilter, features

import pictures  # tests/image/pictures.py, beside this script

VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TOLERANCE_LEVELS = 1
# PNG vs JPEG q95 (PIL's default 4:2:0) of the same picture, in 8-bit levels:
# the bounds the C test states for its own decode. Quantisation at q95 costs
# about a level on average; halved chroma resolution costs tens of levels at
# sharp colour edges, hence the max. PIL's decode must meet them too.
JPEG_MEAN_ABS_BOUND = 2.5
JPEG_MAX_ABS_BOUND = 48

M64 = (1 << 64) - 1


# ---- mmp_rng (common/rng.c), bit for bit -----------------------------------
def hash64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Rng:
    def __init__(self, seed, stream):
        x = hash64(seed) ^ hash64((stream * 0xD1B54A32D192ED03 + 1) & M64)
        self.s = []
        for i in range(4):
            x = hash64((x + i) & M64)
            self.s.append(x)

    def u64(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.u64()
            if x < limit:
                return x % n

    def uniform(self):
        return (self.u64() >> 40) / 16777216.0


# ---- geometry (torchvision's rules) -----------------------------------------
def centre_geometry(W, H, size):
    if W <= H:
        rw, rh = size, round(H * size / W)
    else:
        rw, rh = round(W * size / H), size
    return dict(x=0, y=0, w=W, h=H, rw=rw, rh=rh,
                ox=round((rw - size) / 2.0), oy=round((rh - size) / 2.0), flip=0)


def random_geometry(W, H, size, rng):
    area = float(W) * H
    log_lo, log_hi = math.log(3.0 / 4.0), math.log(4.0 / 3.0)
    crop = None
    for _ in range(10):
        u1 = rng.uniform()
        u2 = rng.uniform()
        target = area * (0.08 + (1.0 - 0.08) * u1)
        ratio = math.exp(log_lo + (log_hi - log_lo) * u2)
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= W and 0 < h <= H:
            y = rng.below(H - h + 1)
            x = rng.below(W - w + 1)
            crop = (x, y, w, h)
            break
    if crop is None:
        in_ratio = W / H
        w, h = W, H
        if in_ratio < 3.0 / 4.0:
            h = round(w / (3.0 / 4.0))
        elif in_ratio > 4.0 / 3.0:
            w = round(h * (4.0 / 3.0))
        crop = ((W - w) // 2, (H - h) // 2, w, h)
    flip = 1 if rng.uniform() < 0.5 else 0
    x, y, w, h = crop
    return dict(x=x, y=y, w=w, h=h, rw=size, rh=size, ox=0, oy=0, flip=flip)


def apply(img, g, size, mean, std):
    img = img.convert("RGB")
    if g["rw"] == size and g["rh"] == size and g["ox"] == 0 and g["oy"] == 0:
        out = img.crop((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
        out = out.resize((size, size), Image.BILINEAR)
    else:
        assert (g["x"], g["y"], g["w"], g["h"]) == (0, 0) + img.size
        out = img.resize((g["rw"], g["rh"]), Image.BILINEAR)
        out = out.crop((g["ox"], g["oy"], g["ox"] + size, g["oy"] + size))
    if g["flip"]:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    a = np.asarray(out, dtype=np.uint8).astype(np.float32) / np.float32(255.0)
    a = (a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    assert a.shape == (size, size, 3)
    return np.ascontiguousarray(a.transpose(2, 0, 1)).astype("<f4")


# ---- pictures ----------------------------------------------------------------
def picture(W, H, seed, noise=6.0):
    """Photo-like: smooth colour gradients, a few shapes, mild noise."""
    return pictures.picture(W, H, seed, (40, 180, 30, 190, 200, 150), noise, rectangles=True,
                            diagonal=True)


def save(img, name, **kw):
    path = os.path.join(HERE, name)
    img.save(path, **kw)
    return path


def main():
    os.chdir(HERE)
    made = {}
    made["grad_64x48.png"] = picture(64, 48, 1)
    made["odd_37x53.png"] = picture(37, 53, 2)
    made["half_33x20.png"] = picture(33, 20, 3)
    made["up_20x13.png"] = picture(20, 13, 4)
    made["thin_120x7.png"] = picture(120, 7, 5)
    for name, img in made.items():
        save(img, name, optimize=True)

    # Slightly blurred, as a camera's optics would: JPEG's error on this is
    # its quantisation plus 4:2:0 chroma subsampling at the shapes' edges.
    same = picture(96, 64, 6, noise=3.0).filter(ImageFilter.GaussianBlur(1.0))
    save(same, "same_96x64.png", optimize=True)
    save(same, "same_96x64_q95.jpg", quality=95)
    gray = picture(40, 30, 7).convert("L")
    save(gray, "gray_40x30.jpg", quality=90)
    save(picture(48, 40, 8), "progressive_48x40.jpg", quality=85, progressive=True)
    save(picture(16, 16, 9).convert("CMYK"), "cmyk_16x16.jpg", quality=90)
    baseline = io.BytesIO()
    picture(48, 40, 10).save(baseline, "JPEG", quality=90)
    whole = baseline.getvalue()
    with open("truncated.jpg", "wb") as f:
        f.write(whole[: len(whole) * 6 // 10])

    # Checks on what was made: the properties the C test relies on.
    assert Image.open("gray_40x30.jpg").mode == "L"
    assert Image.open("progressive_48x40.jpg").info.get("progressive")
    assert Image.open("cmyk_16x16.jpg").mode == "CMYK"
    assert 33 * 10 / 20 == 16.5 and round(16.5) == 16  # long side rounds half to even
    assert centre_geometry(37, 53, 21)["oy"] == 4       # (30 - 21) / 2 = 4.5 -> 4
    png = np.asarray(Image.open("same_96x64.png").convert("RGB")).astype(np.int32)
    jpg = np.asarray(Image.open("same_96x64_q95.jpg").convert("RGB")).astype(np.int32)
    jpeg_mean = float(np.abs(png - jpg).mean())
    jpeg_max = int(np.abs(png - jpg).max())
    assert jpeg_mean <= JPEG_MEAN_ABS_BOUND and jpeg_max <= JPEG_MAX_ABS_BOUND, (jpeg_mean, jpeg_max)

    half = (0.5, 0.5, 0.5)
    odd_mean, odd_std = (0.25, 0.5, 0.75), (0.5, 0.25, 0.125)
    # (file, mode, size, seed, stream, mean, std)
    cases = [
        ("grad_64x48.png", "centre", 32, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("odd_37x53.png", "centre", 21, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("half_33x20.png", "centre", 10, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("up_20x13.png", "centre", 32, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("thin_120x7.png", "centre", 16, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("thin_120x7.png", "random", 16, 5, 1, IMAGENET_MEAN, IMAGENET_STD),
        ("gray_40x30.jpg", "centre", 24, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("progressive_48x40.jpg", "centre", 32, 0, 0, half, half),
        ("same_96x64_q95.jpg", "centre", 64, 0, 0, IMAGENET_MEAN, IMAGENET_STD),
        ("same_96x64.png", "centre", 40, 0, 0, odd_mean, odd_std),
    ]
    # Random crops of grad_64x48: pick seeds so that both flips and a
    # shrinking and an enlarging crop are covered.
    want = {"flip0": None, "flip1": None, "shrink": None, "grow": None}
    for seed in range(1, 200):
        g = random_geometry(64, 48, 24, Rng(seed, 7))
        keys = ["flip%d" % g["flip"], "shrink" if g["w"] > 24 and g["h"] > 24 else
                "grow" if g["w"] < 24 and g["h"] < 24 else None]
        for k in keys:
            if k and want[k] is None:
                want[k] = seed
        if all(want.values()):
            break
    assert all(want.values()), want
    for seed in sorted(set(want.values())):
        cases.append(("grad_64x48.png", "random", 24, seed, 7, IMAGENET_MEAN, IMAGENET_STD))

    header = [
        "MMPIMGREF %d" % VERSION,
        "# regenerate with: python3 tests/image/gen_reference.py (pillow, numpy)",
        "# made by Pillow %s (libjpeg-turbo %s), numpy %s"
        % (Image.__version__, features.version("libjpeg_turbo"), np.__version__),
        "# resize: PIL Image.resize BILINEAR (antialiased triangle, 8-bit rounding"
        " after each pass); geometry and normalisation as data/image.h",
        "# tolerance: %d level(s) of 8 bits before normalisation, i.e."
        " %d / (255 * std[c]) after" % (TOLERANCE_LEVELS, TOLERANCE_LEVELS),
        "tolerance_levels %d" % TOLERANCE_LEVELS,
        "jpeg_error same_96x64.png same_96x64_q95.jpg mean_abs %.4f max_abs %d"
        % (jpeg_mean, jpeg_max),
    ]
    blobs = []
    for name, mode, size, seed, stream, mean, std in cases:
        img = Image.open(name)
        W, H = img.size
        if mode == "centre":
            g = centre_geometry(W, H, size)
        else:
            g = random_geometry(W, H, size, Rng(seed, stream))
        blobs.append(apply(img, g, size, mean, std).tobytes())
        header.append(
            "case %s %s %d %d %d %s %s %d %d %d %d %d %d %d %d %d"
            % (name, mode, size, seed, stream,
               " ".join("%.9g" % m for m in mean), " ".join("%.9g" % s for s in std),
               g["x"], g["y"], g["w"], g["h"], g["rw"], g["rh"], g["ox"], g["oy"], g["flip"]))
        print(header[-1])
    header.append("data")
    with open("reference.bin", "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        for b in blobs:
            f.write(b)
    total = sum(os.path.getsize(p) for p in os.listdir(".") if not p.endswith(".py"))
    print("jpeg vs png: mean_abs %.4f max_abs %d levels" % (jpeg_mean, jpeg_max))
    print("tests/image: %d bytes of data" % total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
