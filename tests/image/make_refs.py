#!/usr/bin/env python3
"""Pictures in every format mmpipe decodes, and what PIL decodes them to.

Regenerate with:  /usr/bin/python3 tests/image/make_refs.py
(Debian's python3-pil and python3-numpy; a C compiler and libjpeg-turbo's
headers for the YCCK file, which PIL cannot write). Run from anywhere; it
rewrites tests/image/formats/. tests/test_formats.c checks that mmpipe's
decode of each file equals the reference below within the tolerance stated
per case; it needs no Python.

The reference of a file is np.asarray(Image.open(p).convert("RGB")), i.e.
what a torchvision/PIL pipeline trains on, with one deliberate exception:
16-bit grayscale PNG, which PIL opens as mode "I" and converts to RGB by
clipping each 16-bit value to 255 (almost every pixel white). For that case
the reference is the high byte (value >> 8), as PIL does for 16-bit RGB PNGs;
the script checks that PIL really does clip, so the note stays true.

formats.ref: ASCII header lines, the line "data", then per case H*W*3 RGB
bytes. Header: "MMPFMTREF <version>", '#' comments, and one
"case FILE WIDTH HEIGHT TOLERANCE PIL_MODE" per case. TOLERANCE is the
largest difference allowed in any channel, in 8-bit levels: 0 for lossless
formats (PNG, GIF: integer conversions that must match exactly) and for
CMYK (exact integer arithmetic on libjpeg's output); JPEG and lossy WebP
allow 1 level for a libjpeg-turbo / libwebp build other than the one that
made the file (their SIMD paths round like their C paths, but we do not
promise it for every version).
"""
import io
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image, features

import pictures  # tests/image/pictures.py, beside this script

VERSION = 1
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formats")

YCCK_WRITER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
/* ycck OUT W H < raw 4-channel bytes: writes them as an Adobe YCCK JPEG. */
int main(int argc, char **argv)
{
    int w = atoi(argv[2]), h = atoi(argv[3]);
    unsigned char *px = malloc((size_t)w * h * 4);
    if (fread(px, 4, (size_t)w * h, stdin) != (size_t)w * h) return 1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    FILE *f = fopen(argv[1], "wb");
    jpeg_stdio_dest(&c, f);
    c.image_width = w; c.image_height = h;
    c.input_components = 4; c.in_color_space = JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_colorspace(&c, JCS_YCCK); /* writes the Adobe marker, transform 2 */
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = px + (size_t)c.next_scanline * w * 4;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    fclose(f);
    return 0;
}
"""


def picture(W, H, seed, mode="RGB"):
    """Smooth gradients, a few shapes, mild noise: photo-like enough for JPEG."""
    return pictures.picture(W, H, seed, (30, 200, 20, 210, 220, 170), 4.0)


def alpha_ramp(W, H):
    yy, xx = np.mgrid[0:H, 0:W]
    a = (xx * 255 // max(W - 1, 1)).astype(np.uint8)
    a[: H // 3, : W // 3] = 0  # fully transparent corner: its colour must still come through
    return Image.fromarray(a, "L")


# ---- a hand-made GIF writer: what PIL's writer never produces --------------
def lzw_uncompressed(indices, min_code_size):
    """LZW data that only ever emits literal codes: a clear code before the
    table would grow past the code size, so every code has min+1 bits."""
    clear, end = 1 << min_code_size, (1 << min_code_size) + 1
    width = min_code_size + 1
    per_clear = (1 << width) - (1 << min_code_size) - 2
    codes, n = [clear], 0
    for i in indices:
        if n == per_clear:
            codes.append(clear)
            n = 0
        codes.append(int(i))
        n += 1
    codes.append(end)
    bits, nbits, out = 0, 0, bytearray()
    for c in codes:
        bits |= c << nbits
        nbits += width
        while nbits >= 8:
            out.append(bits & 0xFF)
            bits >>= 8
            nbits -= 8
    if nbits:
        out.append(bits & 0xFF)
    blocks = bytearray([min_code_size])
    for i in range(0, len(out), 255):
        chunk = out[i:i + 255]
        blocks += bytes([len(chunk)]) + chunk
    return bytes(blocks + b"\x00")


def gif_file(screen, palette, frames, background=0):
    """frames: dicts with x, y, w, h, indices (h, w), optional transparency,
    interlace, local (a palette of its own)."""
    W, H = screen
    bits = max(1, (len(palette) - 1).bit_length())
    out = bytearray(b"GIF89a")
    out += struct.pack("<HHBBB", W, H, 0x80 | 0x70 | (bits - 1), background, 0)
    out += bytes(np.asarray(palette, np.uint8).reshape(-1)) + bytes(3 * ((1 << bits) - len(palette)))
    for f in frames:
        if "transparency" in f:
            out += struct.pack("<BBBBHBB", 0x21, 0xF9, 4, 0x01, 10, f["transparency"], 0)
        idx = np.asarray(f["indices"], np.uint8)
        rows = list(range(f["h"]))
        flags = 0
        if f.get("interlace"):
            flags |= 0x40
            rows = (list(range(0, f["h"], 8)) + list(range(4, f["h"], 8)) +
                    list(range(2, f["h"], 4)) + list(range(1, f["h"], 2)))
        local = f.get("local")
        lbits = bits
        if local is not None:
            lbits = max(1, (len(local) - 1).bit_length())
            flags |= 0x80 | (lbits - 1)
        out += struct.pack("<BHHHHB", 0x2C, f["x"], f["y"], f["w"], f["h"], flags)
        if local is not None:
            out += bytes(np.asarray(local, np.uint8).reshape(-1)) + bytes(3 * ((1 << lbits) - len(local)))
        out += lzw_uncompressed(idx[rows].reshape(-1), max(2, lbits))
    out += b"\x3B"
    return bytes(out)


def make_files():
    """Writes every test file; returns [(name, note)] in case order."""
    cases = []

    def save(img, name, note, **kw):
        img.save(os.path.join(HERE, name), **kw)
        cases.append((name, note))

    def write(data, name, note):
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
        cases.append((name, note))

    # JPEG: CMYK as PIL writes it (Adobe marker, inverted), and YCCK.
    save(picture(40, 30, 1).convert("CMYK"), "cmyk_40x30.jpg", "cmyk", quality=90)
    cmyk = np.asarray(picture(37, 29, 2).convert("CMYK"))
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "ycck.c"), os.path.join(tmp, "ycck")
        with open(src, "w") as f:
            f.write(YCCK_WRITER)
        subprocess.run(["cc", "-O1", "-o", exe, src, "-ljpeg"], check=True)
        # PIL stores CMYK inverted (Adobe's convention) and reads it back so.
        subprocess.run([exe, os.path.join(HERE, "ycck_37x29.jpg"), "37", "29"],
                       input=(255 - cmyk).tobytes(), check=True)
    cases.append(("ycck_37x29.jpg", "ycck"))
    save(picture(33, 21, 3), "rgb_33x21.jpg", "jpeg", quality=85)

    # GIF: PIL's own (palette, grayscale, animated) and hand-made ones.
    save(picture(32, 24, 4).quantize(64), "palette_32x24.gif", "gif")
    save(picture(30, 20, 5).convert("L"), "gray_30x20.gif", "gif")
    frames = [picture(24, 18, 6 + i).quantize(32) for i in range(3)]
    frames[0].save(os.path.join(HERE, "anim_24x18.gif"), save_all=True,
                   append_images=frames[1:], duration=100, loop=0)
    cases.append(("anim_24x18.gif", "gif, first of 3 frames"))
    r = np.random.default_rng(9)
    pal = r.integers(0, 256, (16, 3))
    fw, fh = 13, 11
    write(gif_file((20, 16), pal, [
        dict(x=4, y=3, w=fw, h=fh, indices=r.integers(0, 16, (fh, fw)), transparency=5,
             interlace=True),
        dict(x=0, y=0, w=20, h=16, indices=r.integers(0, 16, (16, 20))),
    ], background=7), "offset_interlaced_20x16.gif",
        "gif: frame at (4,3) 13x11, interlaced, transparent index 5 fills the rest")
    write(gif_file((20, 16), pal, [
        dict(x=2, y=5, w=fw, h=fh, indices=r.integers(1, 16, (fh, fw))),
    ], background=3), "offset_20x16.gif", "gif: frame at (2,5), no transparency: index 0 fills the rest")
    write(gif_file((12, 9), pal, [
        dict(x=0, y=0, w=12, h=9, indices=r.integers(0, 4, (9, 12)),
             local=r.integers(0, 256, (4, 3))),
    ]), "local_palette_12x9.gif", "gif: local colour table")

    # WebP: lossy, lossless with alpha, lossy with alpha, animated.
    save(picture(34, 26, 10), "lossy_34x26.webp", "webp", quality=80)
    rgba = picture(30, 22, 11).convert("RGBA")
    rgba.putalpha(alpha_ramp(30, 22))
    save(rgba, "lossless_alpha_30x22.webp", "webp lossless, alpha", lossless=True)
    save(rgba, "lossy_alpha_30x22.webp", "webp lossy, alpha", quality=80)
    frames = [picture(20, 14, 12 + i) for i in range(2)]
    frames[0].save(os.path.join(HERE, "anim_20x14.webp"), save_all=True,
                   append_images=frames[1:], duration=100, quality=80)
    cases.append(("anim_20x14.webp", "webp animated, first of 2 frames"))

    # PNG: palette (+tRNS), alpha, gray+alpha, 16-bit, low bit depths.
    save(picture(24, 20, 13).quantize(200), "palette_24x20.png", "png")
    p = picture(24, 20, 14).quantize(16)
    save(p, "palette_trns_24x20.png", "png palette, tRNS", transparency=bytes(range(0, 256, 16)))
    save(rgba, "rgba_30x22.png", "png")
    la = picture(21, 17, 15).convert("LA")
    save(la, "gray_alpha_21x17.png", "png")
    rgb16 = (np.asarray(picture(19, 13, 16)).astype(np.uint16) * 257 +
             np.random.default_rng(16).integers(0, 257, (13, 19, 3))).astype(np.uint16)
    write(png16(rgb16), "rgb16_19x13.png", "png 16-bit RGB")
    g16 = (np.asarray(picture(19, 13, 17).convert("L")).astype(np.uint16) * 257 + 100)
    write(png16(g16), "gray16_19x13.png", "png 16-bit gray (reference: high byte, see top)")
    save(picture(18, 10, 18).convert("1"), "bilevel_18x10.png", "png 1-bit")
    save(picture(18, 10, 19).quantize(16), "palette4_18x10.png", "png 4-bit palette", bits=4)
    return cases


def png16(a):
    """A 16-bit PNG of a (H, W) or (H, W, 3) uint16 array (PIL cannot write
    16-bit RGB)."""
    import zlib
    H, W = a.shape[:2]
    colour = 2 if a.ndim == 3 else 0
    raw = b"".join(b"\x00" + a[y].astype(">u2").tobytes() for y in range(H))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, colour, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def reference(name):
    im = Image.open(os.path.join(HERE, name))
    mode = im.mode
    if name.startswith("gray16"):
        assert mode in ("I", "I;16", "I;16B"), mode
        v = np.asarray(im).astype(np.int64)
        clipped = np.asarray(im.convert("RGB"))[..., 0]
        assert (clipped == np.minimum(v, 255)).all(), "PIL no longer clips I -> RGB: update the note"
        rgb = np.repeat((v >> 8).astype(np.uint8)[..., None], 3, axis=2)
    else:
        rgb = np.asarray(im.convert("RGB"))
    return mode, rgb


def main():
    os.makedirs(HERE, exist_ok=True)
    for f in os.listdir(HERE):
        os.remove(os.path.join(HERE, f))
    cases = make_files()
    header = [
        "MMPFMTREF %d" % VERSION,
        "# regenerate with: /usr/bin/python3 tests/image/make_refs.py",
        "# made by Pillow %s (libjpeg-turbo %s, libwebp %s), numpy %s"
        % (Image.__version__, features.version("libjpeg_turbo"), features.version("webp"),
           np.__version__),
        "# reference: np.asarray(Image.open(FILE).convert('RGB')), except 16-bit gray PNG (>> 8)",
    ]
    blobs = []
    for name, note in cases:
        mode, rgb = reference(name)
        H, W = rgb.shape[:2]
        lossy = name.endswith(".jpg") and not name.startswith(("cmyk", "ycck")) or \
            (name.endswith(".webp") and "lossless" not in name)
        tol = 1 if lossy else 0
        header.append("# %s: %s" % (name, note))
        header.append("case %s %d %d %d %s" % (name, W, H, tol, mode))
        blobs.append(np.ascontiguousarray(rgb, np.uint8).tobytes())
    assert Image.open(os.path.join(HERE, "cmyk_40x30.jpg")).mode == "CMYK"
    assert Image.open(os.path.join(HERE, "ycck_37x29.jpg")).mode == "CMYK"
    assert Image.open(os.path.join(HERE, "anim_24x18.gif")).n_frames == 3
    assert Image.open(os.path.join(HERE, "anim_20x14.webp")).n_frames == 2
    header.append("data")
    with open(os.path.join(HERE, "formats.ref"), "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        for b in blobs:
            f.write(b)
    print("\n".join(header))
    total = sum(os.path.getsize(os.path.join(HERE, p)) for p in os.listdir(HERE))
    print("tests/image/formats: %d files, %d bytes" % (len(os.listdir(HERE)), total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
