/* The dataset of data/dataset.h: a manifest index, a tokenizer and the plan's
 * preprocessing, plus the sample order.
 *
 * Sample order is a keyed pseudo-random permutation (a 4-round Feistel
 * network over the next even power of two, cycle-walked into [0, size)), so
 * mmp_dataset_sample_at is O(1), keeps no state and is thread-safe: every
 * stage and every process computes the same order from (seed, k) alone.
 * mmp_dataset_load shares nothing mutable between calls but an atomic count
 * of the skips it has logged. This file never
 * writes files and never caches decoded images.
 *
 * Bad samples (data.on_bad_sample): what can be judged from the manifest
 * line alone (malformed JSON, missing or non-string field, invalid UTF-8,
 * empty caption) is judged at open, where under skip the line is left out of
 * the index; every process opens the same file with the same rules, so the
 * index, and with it the sample order, is the same everywhere. What needs
 * the image file or the vocab is judged at load, by the branch that has it,
 * and under skip only flagged (valid = 0): the index never depends on the
 * file system, which two hosts may see differently. */
#include "data/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/rng.h"
#include "data/image.h"
#include "data/manifest.h"
#include "data/tokenizer.h"

/* Mixed into the seed: keeps the order's stream apart from other users of the seed. */
#define ORDER_DOMAIN 0x6f72646572000000ull
#define FEISTEL_ROUNDS 4
#define AUGMENT_DOMAIN 0x6175676d656e7400ull
/* Skipped samples logged with their reason, before they are only counted. */
#define SKIP_LOG_MAX 10

struct mmp_dataset {
    mmp_manifest *manifest;
    mmp_tokenizer *tok;
    int image_size;
    int max_text_len;
    mmp_image_prep prep; /* centre crop; training loads with positions may augment */
    int augment;         /* plan's data.augment */
    uint64_t seed;       /* job.seed: augmentation draws are a function of (seed, position) */
    mmp_bad_sample policy;
    atomic_int skips_logged;
};

mmp_err mmp_dataset_check_file(const char *path, mmp_sample_problem *kind)
{
    struct stat st;
    *kind = MMP_PROBLEM_NONE;
    if (stat(path, &st) != 0) {
        *kind = MMP_PROBLEM_MISSING_IMAGE;
        return mmp_errorf(MMP_ERR_DATA, "missing image %s (%s)", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        *kind = MMP_PROBLEM_MISSING_IMAGE;
        return mmp_errorf(MMP_ERR_DATA, "image %s is not a regular file", path);
    }
    if (st.st_size == 0) {
        *kind = MMP_PROBLEM_EMPTY_IMAGE;
        return mmp_errorf(MMP_ERR_DATA, "image %s is empty (0 bytes)", path);
    }
    return MMP_OK;
}

/* Under fail, open refuses a manifest whose image files are missing or empty
 * (the earliest clear error); under skip it does not look (see the top). */
static mmp_err check_image(void *user, const mmp_manifest_entry *e, const char *problem)
{
    const char *manifest = user;
    (void)problem; /* only good lines reach a check */
    char path[4096];
    mmp_sample_problem kind;
    mmp_err ret = mmp_manifest_resolve(manifest, e->image, path, sizeof path);
    if (ret == MMP_OK) {
        ret = mmp_dataset_check_file(path, &kind);
    }
    if (ret != MMP_OK) {
        return mmp_error_prefix(ret, "%s:%lld", manifest, (long long)e->line);
    }
    return MMP_OK;
}

mmp_err mmp_dataset_open(mmp_dataset **out, const char *manifest, const char *vocab,
                         const mmp_plan *plan)
{
    return mmp_dataset_open_progress(out, manifest, vocab, plan, NULL, NULL);
}

mmp_err mmp_dataset_open_progress(mmp_dataset **out, const char *manifest, const char *vocab,
                                  const mmp_plan *plan, mmp_manifest_progress progress, void *ctx)
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
    d->policy = plan->data.on_bad_sample;
    atomic_init(&d->skips_logged, 0);
    d->prep.size = size;
    memcpy(d->prep.mean, plan->data.mean, sizeof d->prep.mean);
    memcpy(d->prep.std, plan->data.std, sizeof d->prep.std);
    d->prep.augment = 0;
    d->prep.max_pixels = plan->data.max_image_pixels;
    d->augment = plan->data.augment;
    d->seed = (uint64_t)plan->job.seed;

    char vocab_path[4096];
    if (!vocab || !*vocab) {
        MMP_TRY_GOTO(mmp_manifest_resolve(manifest, "vocab.txt", vocab_path, sizeof vocab_path),
                     ret, fail);
        vocab = vocab_path;
    }
    /* The manifest first: when it is missing, that is the error to report,
     * not the vocab that would be beside it. */
    ret = d->policy == MMP_BAD_SKIP
              ? mmp_manifest_open_progress(&d->manifest, manifest, NULL, NULL, 1, progress, ctx)
              : mmp_manifest_open_progress(&d->manifest, manifest, check_image, (void *)manifest, 0,
                                           progress, ctx);
    MMP_TRY_GOTO(ret, ret, fail);
    MMP_TRY_GOTO(mmp_tokenizer_load(&d->tok, vocab), ret, fail);
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

int64_t mmp_dataset_dropped(const mmp_dataset *d)
{
    return mmp_manifest_dropped(d->manifest);
}

size_t mmp_dataset_index_bytes(const mmp_dataset *d)
{
    return sizeof *d + mmp_manifest_index_bytes(d->manifest);
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

/* Decodes the image at path into image (3, S, S) as data/image.h defines
 * it; *kind says what was wrong on failure. */
static mmp_err load_image(mmp_dataset *d, const char *path, int64_t position, float *image,
                          mmp_sample_problem *kind)
{
    MMP_TRY(mmp_dataset_check_file(path, kind));
    mmp_err ret;
    if (d->augment && position >= 0) {
        /* The crop and flip are a pure function of (seed, run position):
         * every worker count and every resume draws the same ones. */
        mmp_image_prep prep = d->prep;
        prep.augment = 1;
        mmp_rng rng;
        mmp_rng_seed(&rng, d->seed ^ AUGMENT_DOMAIN, (uint64_t)position);
        ret = mmp_image_load(path, &prep, &rng, image);
    } else {
        ret = mmp_image_load(path, &d->prep, NULL, image);
    }
    if (ret == MMP_ERR_DATA || ret == MMP_ERR_IO) {
        *kind = MMP_PROBLEM_BAD_IMAGE; /* the file's problem (no memory is not) */
        return MMP_ERR_DATA;
    }
    return ret;
}

/* One sample into image (3, S, S), ids (T), mask (T). A problem that is the
 * sample's own (its image, its caption) is MMP_ERR_DATA with *kind set;
 * anything else (no memory, the manifest unreadable) has *kind NONE. */
static mmp_err load_one(mmp_dataset *d, int64_t sample, int64_t position, float *image,
                        int32_t *ids, float *mask, mmp_sample_problem *kind)
{
    mmp_err ret = MMP_OK;
    mmp_manifest_entry e;
    const char *mpath = mmp_manifest_path(d->manifest);
    *kind = MMP_PROBLEM_NONE;
    MMP_TRY(mmp_manifest_read(d->manifest, sample, &e));
    if (image) { /* the text branch does not decode */
        char path[4096];
        ret = mmp_manifest_resolve(mpath, e.image, path, sizeof path);
        if (ret != MMP_OK) { /* a path too long to open is as good as missing */
            *kind = MMP_PROBLEM_MISSING_IMAGE;
            ret = MMP_ERR_DATA;
        } else {
            ret = load_image(d, path, position, image, kind);
        }
        if (ret != MMP_OK) {
            ret = mmp_error_prefix(ret, "%s:%lld", mpath, (long long)e.line);
            goto exit;
        }
    }
    if (ids) { /* the image branch does not tokenise */
        int n_real = 0;
        ret = mmp_tokenizer_encode(d->tok, e.text, d->max_text_len, ids, mask, &n_real, NULL);
        if (ret == MMP_OK && n_real <= 2) {
            *kind = MMP_PROBLEM_BAD_CAPTION;
            ret = mmp_errorf(MMP_ERR_DATA, "caption has no tokens after normalisation");
        }
        if (ret != MMP_OK) {
            ret = mmp_error_prefix(ret, "%s:%lld", mpath, (long long)e.line);
        }
    }
exit:
    mmp_manifest_entry_fini(&e);
    return ret;
}

/* What a skipped sample holds: a zero image and the empty caption [CLS]
 * [SEP] (not all padding, so no attention row is fully masked). */
static mmp_err blank_sample(mmp_dataset *d, float *image, int32_t *ids, float *mask)
{
    const size_t S = (size_t)d->image_size;
    if (image) {
        memset(image, 0, 3 * S * S * sizeof *image);
    }
    if (ids) {
        return mmp_tokenizer_encode(d->tok, "", d->max_text_len, ids, mask, NULL, NULL);
    }
    return MMP_OK;
}

static mmp_err load_samples(mmp_dataset *d, const int64_t *samples, const int64_t *positions, int n,
                            float *images, int32_t *ids, float *mask, mmp_bad_sample policy,
                            uint8_t *valid, int *skipped)
{
    const int64_t size = mmp_dataset_size(d);
    const size_t S = (size_t)d->image_size, T = (size_t)d->max_text_len;
    mmp_err ret = MMP_OK;
    if (skipped) {
        *skipped = 0;
    }
    for (int i = 0; i < n; i++) {
        if (samples[i] < 0 || samples[i] >= size) {
            ret =
                mmp_errorf(MMP_ERR_INVALID, "%s: sample %lld out of range [0, %lld)",
                           mmp_manifest_path(d->manifest), (long long)samples[i], (long long)size);
            break;
        }
        float *image = images ? images + (size_t)i * 3 * S * S : NULL;
        int32_t *id = ids ? ids + (size_t)i * T : NULL;
        float *m = ids ? mask + (size_t)i * T : NULL;
        mmp_sample_problem kind;
        ret = load_one(d, samples[i], positions ? positions[i] : -1, image, id, m, &kind);
        if (valid) {
            valid[i] = ret == MMP_OK;
        }
        if (ret == MMP_OK) {
            continue;
        }
        if (policy != MMP_BAD_SKIP || kind == MMP_PROBLEM_NONE) {
            break; /* fail, or a problem that is not the sample's */
        }
        if (atomic_fetch_add(&d->skips_logged, 1) < SKIP_LOG_MAX) {
            MMP_WARN("%s (%s; sample skipped: data.on_bad_sample is skip)", mmp_last_error(),
                     mmp_sample_problem_name(kind));
        }
        if (skipped) {
            (*skipped)++;
        }
        ret = blank_sample(d, image, id, m);
        if (ret != MMP_OK) {
            break;
        }
    }
    return ret;
}

mmp_err mmp_dataset_load(mmp_dataset *d, const int64_t *samples, int n, float *images, int32_t *ids,
                         float *mask)
{
    return load_samples(d, samples, NULL, n, images, ids, mask, MMP_BAD_FAIL, NULL, NULL);
}

mmp_err mmp_dataset_load_valid(mmp_dataset *d, const int64_t *samples, int n, float *images,
                               int32_t *ids, float *mask, uint8_t *valid, int *skipped)
{
    return load_samples(d, samples, NULL, n, images, ids, mask, d->policy, valid, skipped);
}

mmp_err mmp_dataset_load_at(mmp_dataset *d, const int64_t *samples, const int64_t *positions, int n,
                            float *images, int32_t *ids, float *mask, uint8_t *valid, int *skipped)
{
    return load_samples(d, samples, positions, n, images, ids, mask, d->policy, valid, skipped);
}
