/* Decoding dispatch, geometry and the resample/normalise pass (data/image.h).
 *
 * The resampler reproduces PIL's 8-bit BILINEAR resize (libImaging/
 * Resample.c: precompute_coeffs, normalize_coeffs_8bpc, the two 8bpc passes)
 * so that a model trained here sees the pixels torchvision would give it.
 * Unlike PIL it computes only the kept output window, and the horizontal
 * pass only for the source rows the vertical pass reads. It must never read
 * outside the geometry's source rectangle, allocate per pixel, or keep
 * state between calls (loader threads share nothing). */
#include "data/image.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "data/codecs.h"

/* PIL's fixed point: 8 bits of result, 2 spare for overshoot, the rest
 * fraction. Weights are non-negative here, so sums stay below 2^31. */
#define PRECISION_BITS (32 - 8 - 2)

#define MMP_IMAGE_FILE_SLACK ((size_t)64 << 20)

static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* ---- reading ------------------------------------------------------------ */

mmp_err mmp_image_read(const char *path, long long max_pixels, mmp_image *img)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    memset(img, 0, sizeof *img);
    /* A dataset naming a file that is not there is bad data, not a failing
     * disk. The file is read whole, so its size is bounded before anything
     * is allocated: 16 bytes per allowed pixel (an uncompressed 16-bit RGBA
     * PNG takes 8) plus 64 MiB for metadata and the frames of an animation
     * we do not decode. A file past that is a bad sample, not an OOM kill. */
    long long px = max_pixels > 0 ? max_pixels : MMP_IMAGE_MAX_PIXELS;
    size_t max_len = px > (long long)((SIZE_MAX - MMP_IMAGE_FILE_SLACK) / 16)
                         ? SIZE_MAX
                         : (size_t)px * 16 + MMP_IMAGE_FILE_SLACK;
    MMP_TRY(mmp_fs_read_file(path, MMP_ERR_DATA, max_len, &buf, &len));
    mmp_err ret;
    if (len == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: empty file (0 bytes)", path);
    } else if (len >= sizeof png_magic && memcmp(buf, png_magic, sizeof png_magic) == 0) {
        ret = mmp_png_decode(path, buf, len, max_pixels, img);
    } else if (mmp_jpeg_sniff(buf, len)) {
        ret = mmp_jpeg_decode(path, buf, len, max_pixels, img);
    } else if (mmp_gif_sniff(buf, len)) {
        ret = mmp_gif_decode(path, buf, len, max_pixels, img);
    } else if (mmp_webp_sniff(buf, len)) {
        ret = mmp_webp_decode(path, buf, len, max_pixels, img);
    } else {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: not a PNG, JPEG, GIF or WebP image", path);
    }
    free(buf);
    return ret;
}

/* ---- geometry ----------------------------------------------------------- */

static mmp_err check_prep(const mmp_image_prep *prep)
{
    if (prep->size < 1 || prep->size > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_INVALID, "image size %d out of range [1, %d]", prep->size,
                          MMP_PNG_MAX_SIDE);
    }
    for (int c = 0; c < 3; c++) {
        if (!(prep->std[c] > 0) || !isfinite(prep->std[c]) || !isfinite(prep->mean[c])) {
            return mmp_errorf(MMP_ERR_INVALID, "image mean/std[%d] = %g/%g: std must be > 0", c,
                              (double)prep->mean[c], (double)prep->std[c]);
        }
    }
    return MMP_OK;
}

/* Python's round() on the values we meet: half to even (rint in the default
 * rounding mode). */
static int round_even(double v)
{
    return (int)rint(v);
}

static void centre_geometry(int width, int height, int size, mmp_image_geometry *g)
{
    *g = (mmp_image_geometry){.w = width, .h = height};
    if (width <= height) {
        g->rw = size;
        g->rh = round_even((double)height * size / width);
    } else {
        g->rh = size;
        g->rw = round_even((double)width * size / height);
    }
    g->ox = round_even((g->rw - size) / 2.0);
    g->oy = round_even((g->rh - size) / 2.0);
}

/* torchvision RandomResizedCrop.get_params with our rng (see image.h). */
static void random_crop(int width, int height, mmp_rng *rng, mmp_image_geometry *g)
{
    const double scale_lo = 0.08, scale_hi = 1.0;
    const double log_lo = log(3.0 / 4.0), log_hi = log(4.0 / 3.0);
    double area = (double)width * height;
    for (int attempt = 0; attempt < 10; attempt++) {
        double u1 = mmp_rng_uniform(rng);
        double u2 = mmp_rng_uniform(rng);
        double target = area * (scale_lo + (scale_hi - scale_lo) * u1);
        double ratio = exp(log_lo + (log_hi - log_lo) * u2);
        int w = round_even(sqrt(target * ratio));
        int h = round_even(sqrt(target / ratio));
        if (0 < w && w <= width && 0 < h && h <= height) {
            g->y = (int)mmp_rng_below(rng, (uint64_t)(height - h + 1));
            g->x = (int)mmp_rng_below(rng, (uint64_t)(width - w + 1));
            g->w = w;
            g->h = h;
            return;
        }
    }
    /* Ten misses (only very long or thin images): the centre crop, with the
     * ratio clamped into [3/4, 4/3]. */
    double in_ratio = (double)width / height;
    int w = width, h = height;
    if (in_ratio < 3.0 / 4.0) {
        h = round_even(w / (3.0 / 4.0));
    } else if (in_ratio > 4.0 / 3.0) {
        w = round_even(h * (4.0 / 3.0));
    }
    g->x = (width - w) / 2;
    g->y = (height - h) / 2;
    g->w = w;
    g->h = h;
}

mmp_err mmp_image_choose_geometry(int width, int height, const mmp_image_prep *prep, mmp_rng *rng,
                                  mmp_image_geometry *g)
{
    memset(g, 0, sizeof *g);
    MMP_TRY(check_prep(prep));
    if (width < 1 || height < 1 || width > MMP_PNG_MAX_SIDE || height > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_INVALID, "image %dx%d out of range [1, %d]", width, height,
                          MMP_PNG_MAX_SIDE);
    }
    if (!prep->augment) {
        centre_geometry(width, height, prep->size, g);
        return MMP_OK;
    }
    if (!rng) {
        return mmp_errorf(MMP_ERR_INVALID, "image augmentation needs an rng");
    }
    random_crop(width, height, rng, g);
    g->rw = g->rh = prep->size;
    g->flip = mmp_rng_uniform(rng) < 0.5f;
    return MMP_OK;
}

/* ---- resampling --------------------------------------------------------- */

/* PIL's BILINEAR weights for output samples [o0, o0 + n) of a resize of
 * in_size samples to out_size: sample i reads source [first[i], first[i] +
 * count[i]) with weights k[i * ksize ...] in PRECISION_BITS fixed point. */
typedef struct taps {
    int identity; /* in_size == out_size: PIL skips the pass, weights are 1 */
    int ksize;
    int *first, *count;
    int32_t *k;
} taps;

static void taps_fini(taps *t)
{
    free(t->first);
    free(t->count);
    free(t->k);
    memset(t, 0, sizeof *t);
}

static double triangle(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

static mmp_err taps_init(taps *t, int in_size, int out_size, int o0, int n)
{
    memset(t, 0, sizeof *t);
    t->identity = in_size == out_size;
    double scale = (double)in_size / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale; /* the triangle's support is 1 */
    t->ksize = (int)ceil(support) * 2 + 1;
    t->first = malloc(sizeof(int) * (size_t)n);
    t->count = malloc(sizeof(int) * (size_t)n);
    t->k = calloc((size_t)n * (size_t)t->ksize, sizeof(int32_t));
    double *w = malloc(sizeof(double) * (size_t)t->ksize);
    if (!t->first || !t->count || !t->k || !w) {
        free(w);
        taps_fini(t);
        return mmp_errorf(MMP_ERR_NOMEM, "resize weights for %d -> %d", in_size, out_size);
    }
    for (int i = 0; i < n; i++) {
        int xx = o0 + i;
        double center = (xx + 0.5) * scale;
        double ss = 1.0 / filterscale;
        /* (int) truncates toward zero, as PIL's "round" does. */
        int lo = (int)(center - support + 0.5);
        lo = lo < 0 ? 0 : lo;
        int hi = (int)(center + support + 0.5);
        hi = hi > in_size ? in_size : hi;
        int cnt = hi - lo;
        double sum = 0.0;
        for (int j = 0; j < cnt; j++) {
            w[j] = triangle((j + lo - center + 0.5) * ss);
            sum += w[j];
        }
        int32_t *k = t->k + (size_t)i * t->ksize;
        for (int j = 0; j < cnt; j++) {
            double v = sum != 0.0 ? w[j] / sum : w[j];
            k[j] = (int32_t)(0.5 + v * (1 << PRECISION_BITS));
        }
        t->first[i] = lo;
        t->count[i] = cnt;
    }
    free(w);
    return MMP_OK;
}

static uint8_t clip8(int32_t acc)
{
    int32_t v = acc >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

mmp_err mmp_image_transform(const mmp_image *img, const mmp_image_prep *prep,
                            const mmp_image_geometry *g, float *out)
{
    // img (H, W, 3) uint8, out (3, S, S) float
    MMP_TRY(check_prep(prep));
    const int S = prep->size;
    if (g->w < 1 || g->h < 1 || g->x < 0 || g->y < 0 || g->x > img->width - g->w ||
        g->y > img->height - g->h || g->rw < S || g->rh < S || g->ox < 0 || g->oy < 0 ||
        g->ox > g->rw - S || g->oy > g->rh - S || g->rw > MMP_PNG_MAX_SIDE ||
        g->rh > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "image geometry (%d,%d %dx%d -> %dx%d at %d,%d) does not fit a %dx%d "
                          "image and a %d output",
                          g->x, g->y, g->w, g->h, g->rw, g->rh, g->ox, g->oy, img->width,
                          img->height, S);
    }
    mmp_err ret = MMP_OK;
    taps th = {0}, tv = {0};
    uint8_t *mid = NULL, *line = NULL;
    const uint8_t **rows = NULL;
    int32_t *acc = NULL;
    ret = taps_init(&th, g->w, g->rw, g->ox, S);
    if (ret == MMP_OK) {
        ret = taps_init(&tv, g->h, g->rh, g->oy, S);
    }
    if (ret != MMP_OK) {
        goto exit;
    }
    /* Source rows the vertical pass reads: [row0, row1) of the rectangle. */
    const int row0 = tv.identity ? g->oy : tv.first[0];
    const int row1 = tv.identity ? g->oy + S : tv.first[S - 1] + tv.count[S - 1];
    const size_t src_stride = (size_t)img->width * 3, mid_stride = (size_t)S * 3;
    /* rows[r - row0]: the S kept columns of row r after the horizontal pass,
     * in mid, or straight in the source when that pass is the identity. */
    rows = malloc(sizeof *rows * (size_t)(row1 - row0));
    mid = th.identity ? NULL : malloc(mid_stride * (size_t)(row1 - row0));
    acc = malloc(sizeof(int32_t) * mid_stride);
    line = malloc(mid_stride);
    if (!rows || (!th.identity && !mid) || !acc || !line) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "image resize buffers for a %d output", S);
        goto exit;
    }

    /* Horizontal pass: rows [row0, row1) of the rectangle, the S kept columns. */
    for (int r = row0; r < row1; r++) {
        const uint8_t *src = img->rgb + (size_t)(g->y + r) * src_stride + (size_t)g->x * 3;
        if (th.identity) {
            rows[r - row0] = src + (size_t)g->ox * 3;
            continue;
        }
        uint8_t *dst = mid + (size_t)(r - row0) * mid_stride;
        rows[r - row0] = dst;
        for (int i = 0; i < S; i++) {
            const int32_t *k = th.k + (size_t)i * th.ksize;
            const uint8_t *p = src + (size_t)th.first[i] * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int j = 0; j < th.count[i]; j++) {
                s0 += p[3 * j + 0] * k[j];
                s1 += p[3 * j + 1] * k[j];
                s2 += p[3 * j + 2] * k[j];
            }
            dst[3 * i + 0] = clip8(s0);
            dst[3 * i + 1] = clip8(s1);
            dst[3 * i + 2] = clip8(s2);
        }
    }

    /* Vertical pass, then 8-bit rounding, flip and normalisation. */
    float lut[3][256];
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v++) {
            lut[c][v] = ((float)v / 255.0f - prep->mean[c]) / prep->std[c];
        }
    }
    const size_t plane = (size_t)S * S;
    for (int i = 0; i < S; i++) {
        const uint8_t *row = line;
        if (tv.identity) {
            row = rows[i];
        } else {
            const int32_t *k = tv.k + (size_t)i * tv.ksize;
            for (size_t q = 0; q < mid_stride; q++) {
                acc[q] = 1 << (PRECISION_BITS - 1);
            }
            for (int j = 0; j < tv.count[i]; j++) {
                const uint8_t *p = rows[tv.first[i] + j - row0];
                int32_t kj = k[j];
                for (size_t q = 0; q < mid_stride; q++) {
                    acc[q] += p[q] * kj;
                }
            }
            for (size_t q = 0; q < mid_stride; q++) {
                line[q] = clip8(acc[q]);
            }
        }
        float *o = out + (size_t)i * S;
        for (int x = 0; x < S; x++) {
            int ox = g->flip ? S - 1 - x : x;
            o[ox] = lut[0][row[3 * x + 0]];
            o[plane + ox] = lut[1][row[3 * x + 1]];
            o[2 * plane + ox] = lut[2][row[3 * x + 2]];
        }
    }
exit:
    free(line);
    free(acc);
    free(mid);
    free(rows);
    taps_fini(&th);
    taps_fini(&tv);
    return ret;
}

mmp_err mmp_image_load(const char *path, const mmp_image_prep *prep, mmp_rng *rng, float *out)
{
    /* The caller's mistakes first, before the file is even opened. */
    MMP_TRY(check_prep(prep));
    if (prep->augment && !rng) {
        return mmp_errorf(MMP_ERR_INVALID, "image augmentation needs an rng");
    }
    mmp_image img = {0};
    mmp_image_geometry g;
    MMP_TRY(mmp_image_read(path, prep->max_pixels, &img)); /* its errors name path */
    mmp_err ret = mmp_image_choose_geometry(img.width, img.height, prep, rng, &g);
    if (ret == MMP_OK) {
        ret = mmp_image_transform(&img, prep, &g, out);
    }
    if (ret != MMP_OK) {
        ret = mmp_error_prefix(ret, "%s", path);
    }
    mmp_image_fini(&img);
    return ret;
}
