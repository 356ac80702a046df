"""The photo-like test pictures both generators here draw (gen_reference.py
for tests/test_image.c, make_refs.py for tests/test_formats.c): a smooth
colour gradient, three shapes of random colours, mild noise, all from a seed.
One definition, so the two sets of pictures are made the same way."""
import numpy as np
from PIL import Image, ImageDraw


def picture(W, H, seed, gradient, noise, rectangles=False, diagonal=False):
    """gradient (a, b, c, d, e, f): R = a + b u, G = c + d v, B = e - f u v over
    u, v in [0, 1] across the picture. Each of the three shapes is an ellipse,
    or with rectangles a random choice of ellipse or rectangle; diagonal adds
    a white line corner to corner; then Gaussian noise of sigma noise."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    u, v = xx / max(W - 1, 1), yy / max(H - 1, 1)
    a, b, c, d, e, f = gradient
    base = np.stack([a + b * u, c + d * v, e - f * u * v], axis=-1)
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x0, y0 = int(r.integers(0, W)), int(r.integers(0, H))
        x1, y1 = x0 + int(r.integers(2, max(3, W // 2))), y0 + int(r.integers(2, max(3, H // 2)))
        colour = tuple(int(k) for k in r.integers(0, 256, 3))
        if rectangles and not r.integers(0, 2):
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
    if diagonal:
        draw.line((0, H - 1, W - 1, 0), fill=(250, 250, 250), width=1)
    px = np.asarray(img).astype(np.float64) + r.normal(0, noise, (H, W, 3))
    return Image.fromarray(np.clip(np.rint(px), 0, 255).astype(np.uint8), "RGB")
