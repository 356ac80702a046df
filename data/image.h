/* Image files to model input: decode (PNG via libspng, JPEG via
 * libjpeg-turbo), convert to RGB, resize and crop, normalise into NCHW float.
 *
 * Evaluation / default: the shorter side is resized to `size` with bilinear
 * filtering (half-pixel centres, as PIL's BILINEAR with antialiasing off when
 * shrinking... see the implementation's note for the exact filter), then the
 * centre size x size crop. Training augmentation (augment = 1): a random
 * resized crop (scale [0.08, 1], ratio [3/4, 4/3], as torchvision) and a
 * horizontal flip with probability 1/2, drawn from the caller's rng so it is
 * a pure function of (seed, sample, epoch). Then (x/255 - mean) / std.
 * Errors are MMP_ERR_DATA "<path>: <reason>" (missing, empty, truncated,
 * not an image, CMYK JPEG, absurd size); nothing here exits or prints. */
#ifndef MMP_DATA_IMAGE_H
#define MMP_DATA_IMAGE_H

#include "common/err.h"
#include "common/rng.h"
#include "data/png.h"

typedef struct mmp_image_prep {
    int size;          /* output side */
    float mean[3], std[3];
    int augment;       /* random resized crop + flip (needs rng) */
} mmp_image_prep;

/* Decodes a PNG or JPEG file (by content, not name) into *img (RGB8). */
mmp_err mmp_image_read(const char *path, mmp_image *img);

/* Decodes path and writes out (3, size, size) normalised floats. rng may be
 * NULL when prep->augment is 0. Thread-safe. */
mmp_err mmp_image_load(const char *path, const mmp_image_prep *prep, mmp_rng *rng, float *out);

#endif
