/* Image files to model input: decode (PNG via libspng, JPEG via
 * libjpeg-turbo, GIF via giflib, WebP via libwebp), convert to RGB as PIL's
 * Image.open(p).convert("RGB") does (data/png.h and data/codecs.h say
 * how, tests/test_formats.c checks it against PIL), resize and crop,
 * normalise into NCHW float.
 *
 * Everything below is defined to match what torchvision does with PIL images,
 * and tests/test_image.c checks it against a reference that PIL and NumPy
 * compute (tests/image/gen_reference.py):
 *
 * Resize filter: exactly PIL's Image.resize(..., Image.BILINEAR) on 8-bit
 * RGB. That is a separable triangle filter with half-pixel centres whose
 * support is widened by the scale factor when shrinking (so it antialiases:
 * shrinking 4x averages ~8 source pixels per axis, not 2); when enlarging it
 * is plain bilinear interpolation. Weights are computed in double, normalised
 * to sum 1 and rounded to 22-bit fixed point; the horizontal pass runs first
 * and its result is rounded to 8 bits before the vertical pass, the vertical
 * result rounded to 8 bits again. Our output equals PIL's bit for bit on the
 * test pictures; the stated tolerance is 1 level of 8 bits, i.e.
 * 1 / (255 * std) after normalisation.
 *
 * Evaluation / default (augment = 0): the shorter side is resized to `size`
 * and the longer to round(long * size / short) (round half to even, as
 * Python's round), then the centre size x size window is kept, its offset
 * round((resized - size) / 2) on each axis (half to even, as torchvision's
 * CenterCrop). Only the kept window is computed.
 *
 * Training (augment = 1): torchvision's RandomResizedCrop (scale [0.08, 1],
 * ratio [3/4, 4/3]) then RandomHorizontalFlip(0.5), drawn from the caller's
 * rng so that a sample is a pure function of the rng's state. The draws, in
 * order: up to 10 attempts of u1, u2 = mmp_rng_uniform() with area fraction
 * 0.08 + 0.92 * u1 and ratio exp(log(3/4) + (log(4/3) - log(3/4)) * u2),
 * w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio)) (half to
 * even); the first that fits takes y = mmp_rng_below(H - h + 1) then
 * x = mmp_rng_below(W - w + 1). If none fits, the centre crop of the whole
 * image clamped to the ratio range. Then flip = mmp_rng_uniform() < 0.5.
 * The crop is resized to size x size with the filter above, never reading
 * pixels outside it (as PIL's crop-then-resize).
 *
 * Normalisation: out[c][y][x] = (v / 255.0f - mean[c]) / std[c] in float,
 * (3, size, size) channel-major.
 *
 * Errors are MMP_ERR_DATA "<path>: <reason>" (missing or unreadable, empty,
 * truncated, not a PNG, JPEG, GIF or WebP, more pixels than the limit, more
 * than 16384 on a side; MMP_ERR_IO only for
 * a read that fails part way); MMP_ERR_INVALID for a bad prep. Nothing here
 * exits or prints; every function is thread-safe (no shared state). */
#ifndef MMP_DATA_IMAGE_H
#define MMP_DATA_IMAGE_H

#include "common/err.h"
#include "common/rng.h"
#include "data/png.h"

typedef struct mmp_image_prep {
    int size;              /* output side, 1 .. MMP_PNG_MAX_SIDE */
    float mean[3], std[3]; /* std > 0 */
    int augment;           /* random resized crop + flip (needs rng) */
    long long max_pixels;  /* larger images are refused (data.max_image_pixels); <= 0: default */
} mmp_image_prep;

/* Where one output's pixels come from: the source rectangle (x, y, w, h) is
 * resized to rw x rh, the size x size window at (ox, oy) of that is kept,
 * and mirrored left-right when flip. */
typedef struct mmp_image_geometry {
    int x, y, w, h;
    int rw, rh;
    int ox, oy;
    int flip;
} mmp_image_geometry;

/* Decodes a PNG, JPEG, GIF or WebP file (told apart by its first bytes, not
 * its name) into *img (RGB8), which the caller frees with mmp_image_fini.
 * An image of more than max_pixels pixels (<= 0: MMP_IMAGE_MAX_PIXELS) is
 * refused before its pixels are allocated. On failure img->rgb is NULL and
 * img is zeroed, except that mmp_image_too_large(img) then tells a refusal
 * on the pixel limit (img holds the declared size). */
mmp_err mmp_image_read(const char *path, long long max_pixels, mmp_image *img);

/* The geometry prep gives a width x height image: centre crop, or with
 * prep->augment the random draws described above (advancing *rng). */
mmp_err mmp_image_choose_geometry(int width, int height, const mmp_image_prep *prep, mmp_rng *rng,
                                  mmp_image_geometry *g);

/* Resizes, crops, flips and normalises img as g says into out
 * (3, prep->size, prep->size). g must lie inside img (MMP_ERR_INVALID if not). */
mmp_err mmp_image_transform(const mmp_image *img, const mmp_image_prep *prep,
                            const mmp_image_geometry *g, float *out);

/* Decodes path and writes out (3, size, size) normalised floats: read, then
 * choose_geometry, then transform. rng may be NULL when prep->augment is 0;
 * otherwise it is advanced by the draws. out is untouched on failure. */
mmp_err mmp_image_load(const char *path, const mmp_image_prep *prep, mmp_rng *rng, float *out);

#endif
