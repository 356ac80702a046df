/* The dataset of data/dataset.h: a manifest index, a tokenizer and the plan's
 * preprocessing, plus the sample order.
 *
 * Sample order is a keyed pseudo-random permutation (a 4-round Feistel
 * network over the next even power of two, cycle-walked into [0, size)), so
 * mmp_dataset_sample_at is O(1), keeps no state and is thread-safe: every
 * stage and every process computes the same order from (seed, k) alone.
 * mmp_dataset_load shares nothing mutable between calls. This file never
 * writes files and never caches decoded images. */
#include "data/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/rng.h"
#include "data/manifest.h"
#include "data/png.h"
#include "data/tokenizer.h"

/* Mixed into the seed: keeps the order's stream apart from other users of the seed. */
#define ORDER_DOMAIN 0x6f72646572000000ull
#define FEISTEL_ROUNDS 4

struct mmp_dataset {
    mmp_manifest *manifest;
    mmp_tokenizer *tok;
    int image_size;
    int max_text_len;
    float mean[3], std[3];
};

static mmp_err check_image(void *user, const mmp_manifest_entry *e, const char *problem)
{
    const char *manifest = user;
    (void)problem; /* only good lines reach a check */
    char path[4096];
    mmp_err ret = mmp_manifest_resolve(manifest, e->image, path, sizeof path);
    if (ret != MMP_OK) {
        return mmp_error_prefix(ret, "%s:%lld", manifest, (long long)e->line);
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s:%lld: missing image %s (%s)", manifest,
                          (long long)e->line, path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        return mmp_errorf(MMP_ERR_DATA, "%s:%lld: image %s is not a regular file", manifest,
                          (long long)e->line, path);
    }
    return MMP_OK;
}

mmp_err mmp_dataset_open(mmp_dataset **out, const char *manifest, const char *vocab,
                         const mmp_plan *plan)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    const int size = plan->data.image_size, len = plan->data.max_text_len;
    if (size < 1 || size > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_INVALID, "data.image_size %d out of range [1, %d]", size,
                          MMP_PNG_MAX_SIDE);
    }
    if (len < 2) {
        return mmp_errorf(MMP_ERR_INVALID, "data.max_text_len %d < 2 (room for [CLS] and [SEP])",
                          len);
    }
    for (int c = 0; c < 3; c++) {
        if (!isfinite(plan->data.mean[c]) || !isfinite(plan->data.std[c]) ||
            plan->data.std[c] <= 0) {
            return mmp_errorf(MMP_ERR_INVALID, "data.mean/std[%d] = %g/%g: need finite, std > 0", c,
                              (double)plan->data.mean[c], (double)plan->data.std[c]);
        }
    }
    mmp_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        return mmp_errorf(MMP_ERR_NOMEM, "dataset");
    }
    d->image_size = size;
    d->max_text_len = len;
    memcpy(d->mean, plan->data.mean, sizeof d->mean);
    memcpy(d->std, plan->data.std, sizeof d->std);

    char vocab_path[4096];
    if (!vocab || !*vocab) {
        ret = mmp_manifest_resolve(manifest, "vocab.txt", vocab_path, sizeof vocab_path);
        if (ret != MMP_OK) {
            goto fail;
        }
        vocab = vocab_path;
    }
    /* The manifest first: when it is missing, that is the error to report,
     * not the vocab that would be beside it. */
    ret = mmp_manifest_open(&d->manifest, manifest, check_image, (void *)manifest);
    if (ret != MMP_OK) {
        goto fail;
    }
    ret = mmp_tokenizer_load(&d->tok, vocab);
    if (ret != MMP_OK) {
        goto fail;
    }
    *out = d;
    return MMP_OK;
fail:
    mmp_dataset_close(d);
    return ret;
}

void mmp_dataset_close(mmp_dataset *d)
{
    if (!d) {
        return;
    }
    mmp_manifest_close(d->manifest);
    mmp_tokenizer_destroy(d->tok);
    free(d);
}

int64_t mmp_dataset_size(const mmp_dataset *d)
{
    return mmp_manifest_size(d->manifest);
}

int mmp_dataset_vocab_size(const mmp_dataset *d)
{
    return mmp_tokenizer_vocab_size(d->tok);
}

/* A bijection of [0, 4^half_bits) keyed by keys[]. */
static uint64_t feistel(uint64_t x, int half_bits, const uint64_t keys[FEISTEL_ROUNDS])
{
    const uint64_t mask = (1ull << half_bits) - 1;
    uint64_t l = x >> half_bits, r = x & mask;
    for (int round = 0; round < FEISTEL_ROUNDS; round++) {
        uint64_t f = mmp_hash64(r ^ keys[round]) & mask;
        uint64_t next = l ^ f;
        l = r;
        r = next;
    }
    return (l << half_bits) | r;
}

int64_t mmp_dataset_sample_at(const mmp_dataset *d, uint64_t seed, int64_t k, int shuffle)
{
    const int64_t n = mmp_dataset_size(d);
    MMP_ASSERT(k >= 0 && n > 0);
    const int64_t epoch = k / n, pos = k % n;
    if (!shuffle || n == 1) {
        return pos;
    }
    int bits = 2;
    while ((1ull << bits) < (uint64_t)n) {
        bits += 2;
    }
    uint64_t keys[FEISTEL_ROUNDS];
    uint64_t base = mmp_hash64(mmp_hash64(seed ^ ORDER_DOMAIN) + (uint64_t)epoch);
    for (int round = 0; round < FEISTEL_ROUNDS; round++) {
        keys[round] = mmp_hash64(base + (uint64_t)round);
    }
    /* Cycle walking: the permutation of [0, 4^b) restricted to [0, n) by
     * stepping past values >= n is itself a permutation (n > 4^b / 4, so a
     * few steps on average). */
    uint64_t x = (uint64_t)pos;
    do {
        x = feistel(x, bits / 2, keys);
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

/* Bilinear resize with half-pixel centres (no antialiasing: fine for the
 * mild rescaling a manifest of mixed sizes needs), to float 0..255.
 * out (S, S, 3), in (h, w, 3). */
static void resize_bilinear(const mmp_image *in, int size, float *out)
{
    for (int y = 0; y < size; y++) {
        float sy = ((float)y + 0.5f) * (float)in->height / (float)size - 0.5f;
        sy = fminf(fmaxf(sy, 0.0f), (float)(in->height - 1));
        int y0 = (int)sy, y1 = y0 + 1 < in->height ? y0 + 1 : y0;
        float fy = sy - (float)y0;
        for (int x = 0; x < size; x++) {
            float sx = ((float)x + 0.5f) * (float)in->width / (float)size - 0.5f;
            sx = fminf(fmaxf(sx, 0.0f), (float)(in->width - 1));
            int x0 = (int)sx, x1 = x0 + 1 < in->width ? x0 + 1 : x0;
            float fx = sx - (float)x0;
            for (int c = 0; c < 3; c++) {
                const uint8_t *p = in->rgb;
                float a = p[((size_t)y0 * in->width + x0) * 3 + c];
                float b = p[((size_t)y0 * in->width + x1) * 3 + c];
                float e = p[((size_t)y1 * in->width + x0) * 3 + c];
                float f = p[((size_t)y1 * in->width + x1) * 3 + c];
                float top = a + (b - a) * fx, bottom = e + (f - e) * fx;
                out[((size_t)y * size + x) * 3 + c] = top + (bottom - top) * fy;
            }
        }
    }
}

/* One sample into image (3, S, S), ids (T), mask (T). */
static mmp_err load_one(mmp_dataset *d, int64_t sample, float *image, int32_t *ids, float *mask,
                        float **scratch)
{
    mmp_err ret = MMP_OK;
    mmp_manifest_entry e;
    mmp_image img = {0};
    const char *mpath = mmp_manifest_path(d->manifest);
    MMP_TRY(mmp_manifest_read(d->manifest, sample, &e));
    char path[4096];
    if (!image) { /* the text branch: no decoding */
        goto text;
    }
    ret = mmp_manifest_resolve(mpath, e.image, path, sizeof path);
    if (ret == MMP_OK) {
        ret = mmp_png_read(path, &img);
    }
    if (ret != MMP_OK) {
        ret = mmp_error_prefix(ret, "%s:%lld", mpath, (long long)e.line);
        goto exit;
    }
    const int S = d->image_size;
    const size_t plane = (size_t)S * S;
    const float inv = 1.0f / 255.0f;
    if (img.width == S && img.height == S) {
        for (size_t i = 0; i < plane; i++) {
            for (int c = 0; c < 3; c++) {
                image[c * plane + i] = ((float)img.rgb[i * 3 + c] * inv - d->mean[c]) / d->std[c];
            }
        }
    } else {
        if (!*scratch) { /* only images of another size need it */
            *scratch = malloc(plane * 3 * sizeof **scratch);
            if (!*scratch) {
                ret = mmp_errorf(MMP_ERR_NOMEM, "dataset: %zu bytes to resize", plane * 12);
                goto exit;
            }
        }
        resize_bilinear(&img, S, *scratch);
        for (size_t i = 0; i < plane; i++) {
            for (int c = 0; c < 3; c++) {
                image[c * plane + i] = ((*scratch)[i * 3 + c] * inv - d->mean[c]) / d->std[c];
            }
        }
    }
text:
    if (!ids) { /* the image branch: no tokenizing */
        goto exit;
    }
    ret = mmp_tokenizer_encode(d->tok, e.text, d->max_text_len, ids, mask, NULL, NULL);
    if (ret != MMP_OK) {
        ret = mmp_error_prefix(ret, "%s:%lld", mpath, (long long)e.line);
    }
exit:
    mmp_image_fini(&img);
    mmp_manifest_entry_fini(&e);
    return ret;
}

mmp_err mmp_dataset_load(mmp_dataset *d, const int64_t *samples, int n, float *images, int32_t *ids,
                         float *mask)
{
    const int64_t size = mmp_dataset_size(d);
    const size_t S = (size_t)d->image_size, T = (size_t)d->max_text_len;
    float *scratch = NULL;
    mmp_err ret = MMP_OK;
    for (int i = 0; i < n && ret == MMP_OK; i++) {
        if (samples[i] < 0 || samples[i] >= size) {
            ret =
                mmp_errorf(MMP_ERR_INVALID, "%s: sample %lld out of range [0, %lld)",
                           mmp_manifest_path(d->manifest), (long long)samples[i], (long long)size);
            break;
        }
        ret = load_one(d, samples[i], images ? images + (size_t)i * 3 * S * S : NULL,
                       ids ? ids + (size_t)i * T : NULL, ids ? mask + (size_t)i * T : NULL,
                       &scratch);
    }
    free(scratch);
    return ret;
}
