/* The prefetching loader (data/loader.h) and the bad-sample policy of the
 * dataset under it.
 *
 * The reference is mmp_dataset_load on the samples the order gives: every
 * worker count and depth must give the same bytes. Then every kind of bad
 * sample under data.on_bad_sample = fail (an error naming manifest:line and
 * the reason) and skip (flagged 0 and counted, the other rows untouched),
 * destroying a loader whose workers are busy, and a loader producing only
 * the micro-batches it owns (bitwise the unfiltered loader's). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/loader.h"
#include "tests/harness.h"

#define FIXTURES "tests/data/loader"

static int contains(const char *s, const char *part)
{
    return strstr(s, part) != NULL;
}

static void small_plan(mmp_plan *p, int image_size, int text_len, int batch, int microbatches,
                       int workers, mmp_bad_sample policy)
{
    mmp_plan_defaults(p);
    p->job.seed = 7;
    p->data.image_size = image_size;
    p->data.max_text_len = text_len;
    p->data.workers = workers;
    p->data.on_bad_sample = policy;
    p->train.batch = batch;
    p->train.microbatches = microbatches;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* ---- order and contents ---------------------------------------------------------- */

/* A manifest of n lines over the fixture images (three sizes, so the resize
 * path runs too) with varied captions; written beside absolute image paths. */
static void write_manifest(const char *path, int n)
{
    static const char *const images[] = {"a.png", "b.png", "c.png"};
    static const char *const words[] = {"a", "red", "blue", "green", "dot", "square", "."};
    char *abs = realpath(FIXTURES, NULL);
    FILE *f = fopen(path, "w");
    if (!abs || !f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"image\": \"%s/%s\", \"text\": \"%s %s %s\"}\n", abs, images[i % 3],
                words[i % 7], words[(i / 7) % 7], words[(i * 5 + 1) % 7]);
    }
    fclose(f);
    free(abs);
}

/* A dataset over a fresh manifest of n lines (write_manifest) in the tmpdir
 * name, with the fixtures' vocabulary; NULL, a failed check, when it does
 * not open. */
static mmp_dataset *open_written(const char *name, int n, const mmp_plan *plan)
{
    char manifest[1200];
    snprintf(manifest, sizeof manifest, "%s/m.jsonl", mmp_test_tmpdir(name));
    write_manifest(manifest, n);
    mmp_dataset *d = NULL;
    CHECK_OK(mmp_dataset_open(&d, manifest, FIXTURES "/vocab.txt", plan));
    return d;
}

typedef struct reference {
    int n;
    int64_t samples[64];
    float *images;
    int32_t *ids;
    float *mask;
} reference;

/* What mmp_dataset_load gives for (step, mb): the loader's specification. */
static void load_reference(mmp_dataset *d, const mmp_plan *p, int step, int mb, reference *r)
{
    const size_t S = (size_t)p->data.image_size, T = (size_t)p->data.max_text_len;
    r->n = mmp_plan_mb_size(p, mb);
    const int64_t base = (int64_t)step * p->train.batch + mmp_plan_mb_offset(p, mb);
    for (int i = 0; i < r->n; i++) {
        r->samples[i] = mmp_dataset_sample_at(d, (uint64_t)p->job.seed, base + i, 1);
    }
    r->images = calloc((size_t)r->n * 3 * S * S, sizeof *r->images);
    r->ids = calloc((size_t)r->n * T, sizeof *r->ids);
    r->mask = calloc((size_t)r->n * T, sizeof *r->mask);
    CHECK_OK(mmp_dataset_load(d, r->samples, r->n, r->images, r->ids, r->mask));
}

static void free_reference(reference *r)
{
    free(r->images);
    free(r->ids);
    free(r->mask);
}

/* Compares a loader's micro-batch with the reference, bitwise. */
static int same_batch(const mmp_batch *b, const reference *r, const mmp_plan *p, int images,
                      int text)
{
    const size_t S = (size_t)p->data.image_size, T = (size_t)p->data.max_text_len;
    const size_t n = (size_t)r->n;
    int ok = b->n == r->n && memcmp(b->samples, r->samples, n * sizeof *r->samples) == 0;
    ok &= b->skipped == 0 && b->digest == 0;
    for (size_t i = 0; i < n; i++) {
        ok &= b->valid[i] == 1;
    }
    if (images) {
        ok &= b->images && memcmp(b->images, r->images, n * 3 * S * S * sizeof(float)) == 0;
    } else {
        ok &= b->images == NULL;
    }
    if (text) {
        ok &= b->ids && memcmp(b->ids, r->ids, n * T * sizeof(int32_t)) == 0;
        ok &= b->mask && memcmp(b->mask, r->mask, n * T * sizeof(float)) == 0;
    } else {
        ok &= b->ids == NULL && b->mask == NULL;
    }
    return ok;
}

/* A loader over both branches' inputs for steps [first, last). */
static mmp_loader_cfg both_branches(mmp_dataset *d, const mmp_plan *plan, int first, int last,
                                    int depth)
{
    mmp_loader_cfg cfg = {.ds = d,
                          .plan = plan,
                          .images = 1,
                          .text = 1,
                          .first_step = first,
                          .last_step = last,
                          .depth = depth};
    return cfg;
}

/* Gets the micro-batches of steps [first, last) that l produces (those with
 * owns[mb], or all n_mb when owns is NULL) in order, holding up to depth at
 * once before releasing the oldest, and checks each with same(b, ctx).
 * Returns 1 when every get succeeded and matched; *produced counts them. */
typedef int (*batch_check)(const mmp_batch *b, void *ctx);
static int stream_batches(mmp_loader *l, int first, int last, int n_mb, const unsigned char *owns,
                          int depth, const char *what, batch_check same, void *ctx, int *produced)
{
    int ok = 1;
    mmp_batch *held[8] = {0};
    int n_held = 0;
    *produced = 0;
    for (int step = first; step < last; step++) {
        for (int mb = 0; mb < n_mb; mb++) {
            if (owns && !owns[mb]) {
                continue;
            }
            if (n_held == depth) {
                mmp_loader_release(l, held[0]);
                memmove(held, held + 1, (size_t)--n_held * sizeof *held);
            }
            mmp_batch *b = NULL;
            mmp_err err = mmp_loader_get(l, step, mb, &b);
            ok &= err == MMP_OK && b && b->step == step && b->mb == mb;
            if (err != MMP_OK || !b) {
                fprintf(stderr, "  %s %d/%d: %s\n", what, step, mb, mmp_last_error());
                continue;
            }
            ok &= same(b, ctx);
            (*produced)++;
            held[n_held++] = b;
        }
    }
    while (n_held > 0) {
        mmp_loader_release(l, held[--n_held]);
    }
    return ok;
}

/* The references of test_order_and_contents, from step first on. */
typedef struct order_ctx {
    reference (*ref)[4];
    int first, images, text;
    const mmp_plan *plan;
} order_ctx;

static int same_as_reference(const mmp_batch *b, void *ctx)
{
    const order_ctx *c = ctx;
    return same_batch(b, &c->ref[b->step - c->first][b->mb], c->plan, c->images, c->text);
}

static void test_order_and_contents(void)
{
    /* batch 10 in 4 micro-batches: sizes 3 3 2 2, so offsets are uneven */
    mmp_plan plan;
    small_plan(&plan, 8, 7, 10, 4, 0, MMP_BAD_FAIL);
    mmp_dataset *d = open_written("loader_order", 53, &plan);
    if (!d) {
        return;
    }
    const int first = 3, last = 11, M = plan.train.microbatches;
    reference ref[8][4];
    for (int step = first; step < last; step++) {
        for (int mb = 0; mb < M; mb++) {
            load_reference(d, &plan, step, mb, &ref[step - first][mb]);
        }
    }

    static const int workers[] = {0, 1, 2, 3};
    static const int depths[] = {1, 2, 5};
    static const int modes[][2] = {{1, 1}, {1, 0}, {0, 1}}; /* images, text */
    for (size_t w = 0; w < 4; w++) {
        for (size_t k = 0; k < 3; k++) {
            for (size_t m = 0; m < 3; m++) {
                plan.data.workers = workers[w];
                mmp_loader_cfg cfg = {.ds = d,
                                      .plan = &plan,
                                      .images = modes[m][0],
                                      .text = modes[m][1],
                                      .first_step = first,
                                      .last_step = last,
                                      .depth = depths[k]};
                mmp_loader *l = NULL;
                CHECK_OK(mmp_loader_create(&l, &cfg));
                if (!l) {
                    continue;
                }
                order_ctx c = {ref, first, modes[m][0], modes[m][1], &plan};
                int produced;
                int ok = stream_batches(l, first, last, M, NULL, depths[k], "get",
                                        same_as_reference, &c, &produced);
                if (!ok) {
                    fprintf(stderr, "  differs: workers %d depth %d images %d text %d\n",
                            workers[w], depths[k], modes[m][0], modes[m][1]);
                }
                CHECK(ok);
                /* Past the last micro-batch. */
                mmp_batch *b = NULL;
                CHECK(mmp_loader_get(l, last, 0, &b) == MMP_ERR_INVALID && b == NULL);
                mmp_loader_destroy(l);
            }
        }
    }

    /* Requests out of order, and one while every buffer is held. */
    plan.data.workers = 2;
    mmp_loader_cfg cfg = both_branches(d, &plan, 0, 4, 1);
    mmp_loader *l = NULL;
    CHECK_OK(mmp_loader_create(&l, &cfg));
    if (l) {
        mmp_batch *b = NULL, *b2 = NULL;
        CHECK(mmp_loader_get(l, 0, 1, &b) == MMP_ERR_INVALID);
        CHECK(contains(mmp_last_error(), "out of order (next is step 0 micro-batch 0)"));
        CHECK_OK(mmp_loader_get(l, 0, 0, &b));
        CHECK(mmp_loader_get(l, 0, 1, &b2) == MMP_ERR_INVALID && b2 == NULL);
        CHECK(contains(mmp_last_error(), "release one first"));
        mmp_loader_release(l, b);
        CHECK_OK(mmp_loader_get(l, 0, 1, &b2));
        mmp_loader_release(l, b2);
        mmp_loader_release(l, NULL);
    }
    mmp_loader_destroy(l);
    mmp_loader_destroy(NULL);

    cfg.depth = 0;
    CHECK(mmp_loader_create(&l, &cfg) == MMP_ERR_INVALID && l == NULL);
    cfg.depth = 2;
    cfg.last_step = -1;
    CHECK(mmp_loader_create(&l, &cfg) == MMP_ERR_INVALID && l == NULL);

    for (int s = 0; s < last - first; s++) {
        for (int mb = 0; mb < M; mb++) {
            free_reference(&ref[s][mb]);
        }
    }
    mmp_dataset_close(d);
}

/* ---- bad samples ------------------------------------------------------------------- */

typedef enum where { AT_OPEN, AT_IMAGE, AT_TEXT } where;

typedef struct bad_case {
    const char *name;
    const char *image; /* fixture file name */
    const char *text;  /* the JSON line's text value, or NULL for `line` */
    const char *line;  /* a whole line, when the line itself is bad */
    where where;
    const char *reason; /* in the error, after "m.jsonl:3: " */
} bad_case;

static const bad_case bad_cases[] = {
    {"malformed JSON", NULL, NULL, "{\"image\": \"a.png\", \"text\": }", AT_OPEN,
     "not valid JSON at column 28"},
    {"missing field", NULL, NULL, "{\"image\": \"a.png\"}", AT_OPEN, "missing field \"text\""},
    {"non-string", NULL, NULL, "{\"image\": 7, \"text\": \"a dot\"}", AT_OPEN,
     "expected a string for \"image\""},
    {"empty caption", "a.png", " \\t ", NULL, AT_OPEN, "empty caption"},
    {"invalid UTF-8", "a.png", "bad \xc3\x28 byte", NULL, AT_OPEN, "invalid UTF-8 in a string"},
    {"lone surrogate", "a.png", "x \\udc00", NULL, AT_OPEN, "low surrogate"},
    {"missing image", "missing.png", "a dot", NULL, AT_OPEN, "missing image "},
    {"zero-size image", "empty.png", "a dot", NULL, AT_OPEN, "empty.png is empty (0 bytes)"},
    {"truncated image", "truncated.png", "a dot", NULL, AT_IMAGE, "truncated.png: "},
    {"not an image", "not_image.png", "a dot", NULL, AT_IMAGE, "not_image.png: "},
    {"caption without tokens", "a.png", "\\u0001\\u0002", NULL, AT_TEXT, "caption has no tokens"},
};

/* Writes good, good, bad: the bad sample is line 3, sample 2. */
static void write_case(const char *manifest, const bad_case *c)
{
    char *abs = realpath(FIXTURES, NULL);
    FILE *f = fopen(manifest, "w");
    if (!abs || !f) {
        exit(1);
    }
    fprintf(f, "{\"image\": \"%s/a.png\", \"text\": \"a red dot\"}\n", abs);
    fprintf(f, "{\"image\": \"%s/b.png\", \"text\": \"a blue square\"}\n", abs);
    if (c->line) {
        fprintf(f, "%s\n", c->line);
    } else {
        fprintf(f, "{\"image\": \"%s/%s\", \"text\": \"%s\"}\n", abs, c->image, c->text);
    }
    fclose(f);
    free(abs);
}

/* Under fail: the open, or the get of the first micro-batch holding sample
 * 2, is an MMP_ERR_DATA starting "m.jsonl:3: " and giving the reason. */
static void test_fail_policy(void)
{
    const char *dir = mmp_test_tmpdir("loader_fail");
    char manifest[1200], vocab[1200], want[1400];
    snprintf(manifest, sizeof manifest, "%s/m.jsonl", dir);
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", FIXTURES);
    for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
        const bad_case *c = &bad_cases[k];
        write_case(manifest, c);
        snprintf(want, sizeof want, "%s:3: ", manifest);
        mmp_plan plan;
        small_plan(&plan, 8, 6, 2, 2, 1, MMP_BAD_FAIL);
        mmp_dataset *d = NULL;
        mmp_err err = mmp_dataset_open(&d, manifest, vocab, &plan);
        if (c->where == AT_OPEN) {
            int ok = err == MMP_ERR_DATA && d == NULL && contains(mmp_last_error(), want) &&
                     contains(mmp_last_error(), c->reason);
            if (!ok) {
                fprintf(stderr, "  %s: got '%s', want '%s...%s'\n", c->name, mmp_last_error(), want,
                        c->reason);
            }
            CHECK(ok);
            mmp_dataset_close(d);
            continue;
        }
        CHECK_OK(err);
        if (!d) {
            continue;
        }
        int first_bad = -1; /* the step whose batch holds sample 2 (one mb per sample) */
        for (int k2 = 0; k2 < 12 && first_bad < 0; k2++) {
            if (mmp_dataset_sample_at(d, (uint64_t)plan.job.seed, k2, 1) == 2) {
                first_bad = k2;
            }
        }
        CHECK(first_bad >= 0);
        mmp_loader_cfg cfg = {.ds = d,
                              .plan = &plan,
                              .images = c->where == AT_IMAGE,
                              .text = c->where == AT_TEXT,
                              .first_step = 0,
                              .last_step = 6,
                              .depth = 2};
        mmp_loader *l = NULL;
        CHECK_OK(mmp_loader_create(&l, &cfg));
        int got_error_at = -1;
        for (int k2 = 0; l && k2 < 12 && got_error_at < 0; k2++) {
            mmp_batch *b = NULL;
            err = mmp_loader_get(l, k2 / 2, k2 % 2, &b);
            if (err != MMP_OK) {
                got_error_at = k2;
                int ok = err == MMP_ERR_DATA && b == NULL && contains(mmp_last_error(), want) &&
                         contains(mmp_last_error(), c->reason);
                if (!ok) {
                    fprintf(stderr, "  %s: got '%s', want '%s...%s'\n", c->name, mmp_last_error(),
                            want, c->reason);
                }
                CHECK(ok);
            }
            mmp_loader_release(l, b);
        }
        CHECK(got_error_at == first_bad);
        /* The other branch does not see this problem at all. */
        cfg.images = !cfg.images;
        cfg.text = !cfg.text;
        mmp_loader_destroy(l);
        l = NULL;
        CHECK_OK(mmp_loader_create(&l, &cfg));
        for (int k2 = 0; l && k2 < 12; k2++) {
            mmp_batch *b = NULL;
            CHECK_OK(mmp_loader_get(l, k2 / 2, k2 % 2, &b));
            mmp_loader_release(l, b);
        }
        mmp_loader_destroy(l);
        mmp_dataset_close(d);
    }
}

/* Under skip, bad lines are left out at open: bad_lines.jsonl has good
 * lines 1, 3, 9 and 11 between six bad ones and a blank. */
static void test_skip_at_open(void)
{
    mmp_plan plan;
    small_plan(&plan, 8, 6, 4, 1, 0, MMP_BAD_SKIP);
    mmp_dataset *d = NULL;
    CHECK_OK(mmp_dataset_open(&d, FIXTURES "/bad_lines.jsonl", FIXTURES "/vocab.txt", &plan));
    if (!d) {
        return;
    }
    CHECK(mmp_dataset_size(d) == 4);
    CHECK(mmp_dataset_dropped(d) == 6);
    /* The kept samples are the good lines, in order: compare with a clean
     * manifest of those lines alone. */
    const char *dir = mmp_test_tmpdir("loader_skip_open");
    char clean[1200];
    snprintf(clean, sizeof clean, "%s/clean.jsonl", dir);
    char *abs = realpath(FIXTURES, NULL);
    FILE *f = fopen(clean, "w");
    if (abs && f) {
        fprintf(f, "{\"image\": \"%s/a.png\", \"text\": \"a red dot\"}\n", abs);
        fprintf(f, "{\"image\": \"%s/b.png\", \"text\": \"a blue square\"}\n", abs);
        fprintf(f, "{\"image\": \"%s/c.png\", \"text\": \"green dot .\"}\n", abs);
        fprintf(f, "{\"image\": \"%s/a.png\", \"text\": \"red square\"}\n", abs);
        fclose(f);
    }
    free(abs);
    mmp_dataset *c = NULL;
    CHECK_OK(mmp_dataset_open(&c, clean, FIXTURES "/vocab.txt", &plan));
    if (c) {
        const int64_t all[4] = {0, 1, 2, 3};
        float img_a[4 * 3 * 64], img_b[4 * 3 * 64], mask_a[24], mask_b[24];
        int32_t ids_a[24], ids_b[24];
        CHECK_OK(mmp_dataset_load(d, all, 4, img_a, ids_a, mask_a));
        CHECK_OK(mmp_dataset_load(c, all, 4, img_b, ids_b, mask_b));
        CHECK(memcmp(img_a, img_b, sizeof img_a) == 0);
        CHECK(memcmp(ids_a, ids_b, sizeof ids_a) == 0);
        CHECK(memcmp(mask_a, mask_b, sizeof mask_a) == 0);
    }
    mmp_dataset_close(c);
    mmp_dataset_close(d);

    /* Line numbers (for errors) stay the file's own, blank and left-out
     * lines counted. */
    mmp_manifest *m = NULL;
    CHECK_OK(mmp_manifest_open_skip(&m, FIXTURES "/bad_lines.jsonl", NULL, NULL));
    if (m) {
        CHECK(mmp_manifest_size(m) == 4 && mmp_manifest_dropped(m) == 6);
        CHECK(mmp_manifest_line(m, 0) == 1 && mmp_manifest_line(m, 1) == 3);
        CHECK(mmp_manifest_line(m, 2) == 9 && mmp_manifest_line(m, 3) == 11);
        mmp_manifest_entry e;
        CHECK_OK(mmp_manifest_read(m, 3, &e));
        CHECK(e.line == 11 && e.text && strcmp(e.text, "red square") == 0);
        mmp_manifest_entry_fini(&e);
    }
    mmp_manifest_close(m);

    /* Under fail the same file is an error at its first bad line. */
    plan.data.on_bad_sample = MMP_BAD_FAIL;
    CHECK(mmp_dataset_open(&d, FIXTURES "/bad_lines.jsonl", FIXTURES "/vocab.txt", &plan) ==
          MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "bad_lines.jsonl:2: not valid JSON"));

    /* A manifest with no good line is an error under skip too. */
    char none[1200];
    snprintf(none, sizeof none, "%s/none.jsonl", dir);
    write_file(none, "{\"image\": \"a.png\"}\n\n[1]\n");
    plan.data.on_bad_sample = MMP_BAD_SKIP;
    CHECK(mmp_dataset_open(&d, none, FIXTURES "/vocab.txt", &plan) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "no samples (all 2 lines are bad)"));
}

/* Under skip, bad images and captions are flagged at load: bad_samples.jsonl
 * rows 1, 3, 4, 5 have bad images (missing, zero-size, truncated, not an
 * image), row 6 a caption without tokens; rows 0, 2, 7 are good. */
static void test_skip_at_load(void)
{
    static const uint8_t image_ok[8] = {1, 0, 1, 0, 0, 0, 1, 1};
    static const uint8_t text_ok[8] = {1, 1, 1, 1, 1, 1, 0, 1};
    for (int workers = 0; workers <= 2; workers += 2) {
        mmp_plan plan;
        small_plan(&plan, 8, 6, 8, 3, workers, MMP_BAD_SKIP); /* mbs of 3 3 2 */
        mmp_dataset *d = NULL;
        CHECK_OK(mmp_dataset_open(&d, FIXTURES "/bad_samples.jsonl", FIXTURES "/vocab.txt", &plan));
        if (!d) {
            return;
        }
        CHECK(mmp_dataset_size(d) == 8 && mmp_dataset_dropped(d) == 0);
        const size_t S = 8, T = 6;
        for (int branch = 0; branch < 3; branch++) { /* image, text, both */
            const int images = branch != 1, text = branch != 0;
            mmp_loader_cfg cfg = {.ds = d,
                                  .plan = &plan,
                                  .images = images,
                                  .text = text,
                                  .first_step = 0,
                                  .last_step = 3,
                                  .depth = 2};
            mmp_loader *l = NULL;
            CHECK_OK(mmp_loader_create(&l, &cfg));
            int flags_ok = 1, counts_ok = 1, rows_ok = 1, blank_ok = 1, total_skipped = 0;
            for (int step = 0; l && step < 3; step++) {
                for (int mb = 0; mb < 3; mb++) {
                    mmp_batch *b = NULL;
                    CHECK_OK(mmp_loader_get(l, step, mb, &b));
                    if (!b) {
                        continue;
                    }
                    int bad = 0;
                    for (int i = 0; i < b->n; i++) {
                        const int64_t s = b->samples[i];
                        const int want = (!images || image_ok[s]) && (!text || text_ok[s]);
                        flags_ok &= b->valid[i] == want;
                        bad += !want;
                        float ref_img[3 * 64], ref_mask[6];
                        int32_t ref_ids[6];
                        if (want) { /* good rows are exactly what the strict path loads */
                            mmp_err le =
                                mmp_dataset_load(d, &s, 1, images ? ref_img : NULL,
                                                 text ? ref_ids : NULL, text ? ref_mask : NULL);
                            CHECK_OK(le);
                            if (le != MMP_OK) {
                                rows_ok = 0; /* nothing loaded to compare */
                                continue;
                            }
                            rows_ok &= !images || memcmp(b->images + i * 3 * S * S, ref_img,
                                                         sizeof ref_img) == 0;
                            rows_ok &=
                                !text || (memcmp(b->ids + i * T, ref_ids, sizeof ref_ids) == 0 &&
                                          memcmp(b->mask + i * T, ref_mask, sizeof ref_mask) == 0);
                        } else { /* bad rows: zero image, [CLS] [SEP] caption */
                            for (size_t j = 0; images && j < 3 * S * S; j++) {
                                blank_ok &= b->images[i * 3 * S * S + j] == 0.0f;
                            }
                            if (text) {
                                const int32_t want_ids[6] = {2, 3, 0, 0, 0, 0};
                                const float want_mask[6] = {1, 1, 0, 0, 0, 0};
                                blank_ok &= memcmp(b->ids + i * T, want_ids, sizeof want_ids) == 0;
                                blank_ok &=
                                    memcmp(b->mask + i * T, want_mask, sizeof want_mask) == 0;
                            }
                        }
                    }
                    counts_ok &= b->skipped == bad;
                    total_skipped += b->skipped;
                    mmp_loader_release(l, b);
                }
            }
            /* 3 steps of 8 = 3 epochs of the 8 samples: each bad one 3 times. */
            const int per_epoch = images && text ? 5 : images ? 4 : 1;
            if (!(flags_ok && counts_ok && rows_ok && blank_ok)) {
                fprintf(stderr, "  workers %d branch %d: flags %d counts %d rows %d blank %d\n",
                        workers, branch, flags_ok, counts_ok, rows_ok, blank_ok);
            }
            CHECK(flags_ok && counts_ok && rows_ok && blank_ok);
            CHECK(total_skipped == 3 * per_epoch);
            mmp_loader_destroy(l);
        }
        /* The strict path still fails on the same file. */
        const int64_t missing = 1;
        float img[3 * 64];
        CHECK(mmp_dataset_load(d, &missing, 1, img, NULL, NULL) == MMP_ERR_DATA);
        CHECK(contains(mmp_last_error(), "bad_samples.jsonl:2: missing image"));
        mmp_dataset_close(d);
    }
}

/* ---- mmpipe data check ------------------------------------------------------------- */

static void test_check_cli(void)
{
    const char *bin = mmp_test_bin();
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "  (no %s: data check not run)\n", bin);
        return;
    }
    char cmd[2048];
    static char out[1 << 14];
    snprintf(cmd, sizeof cmd, "%s data check %s/bad_samples.jsonl --decode --vocab %s/vocab.txt",
             bin, FIXTURES, FIXTURES);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    static const char *const want[] = {
        "bad_samples.jsonl:2: missing image " FIXTURES "/missing.png (No such file",
        "bad_samples.jsonl:4: image " FIXTURES "/empty.png is empty (0 bytes)",
        "bad_samples.jsonl:5: " FIXTURES "/truncated.png: truncated",
        "bad_samples.jsonl:6: " FIXTURES "/not_image.png: not a",
        "bad_samples.jsonl:7: caption has no tokens",
        ("8 non-blank lines, 5 problems (by kind: 1 missing image, 1 zero-size image, 2 "
         "undecodable image, "
         "1 caption without tokens); 3 good samples"),
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(contains(out, want[i]));
    }
    /* Without --decode the images are only looked at, not decoded. */
    snprintf(cmd, sizeof cmd, "%s data check %s/bad_samples.jsonl", bin, FIXTURES);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    CHECK(contains(out,
                   "8 non-blank lines, 2 problems (by kind: 1 missing image, 1 zero-size image)"));
    CHECK(!contains(out, ":5: "));

    snprintf(cmd, sizeof cmd, "%s data check %s/bad_lines.jsonl", bin, FIXTURES);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    static const char *const want_lines[] = {
        ":2: not valid JSON at column 28",
        ":4: missing field \"text\"",
        ":5: expected a string for \"image\"",
        ":6: empty caption",
        ":7: not valid JSON at column 33: invalid UTF-8 in a string",
        ":10: not valid JSON at column 40: \\ud800 is a high surrogate",
        ("10 non-blank lines, 6 problems (by kind: 1 malformed JSON, 1 missing field, 1 non-string "
         "field, "
         "2 text not UTF-8 or with a NUL, 1 empty caption); 4 good samples"),
    };
    for (size_t i = 0; i < sizeof want_lines / sizeof want_lines[0]; i++) {
        CHECK(contains(out, want_lines[i]));
    }

    char manifest[1200];
    snprintf(manifest, sizeof manifest, "%s/m.jsonl", mmp_test_tmpdir("loader_check"));
    write_manifest(manifest, 9);
    snprintf(cmd, sizeof cmd, "%s data check %s --decode --vocab %s/vocab.txt", bin, manifest,
             FIXTURES);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
    CHECK(contains(
        out, "9 non-blank lines, 0 problems; 9 good samples; images 8x8 (and 6 of other sizes"));
    snprintf(cmd, sizeof cmd, "%s data check --decode", bin);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);
}

/* ---- shutdown ------------------------------------------------------------------------ */

/* Destroy while workers are busy filling (large images, deep queue), while
 * the consumer still holds a batch, and before any get. */
static void test_destroy_mid_stream(void)
{
    mmp_plan plan;
    small_plan(&plan, 96, 16, 32, 2, 3, MMP_BAD_FAIL);
    mmp_dataset *d = open_written("loader_destroy", 40, &plan);
    if (!d) {
        return;
    }
    for (int held = 0; held < 3; held++) {
        mmp_loader_cfg cfg = both_branches(d, &plan, 0, 1000, 4);
        mmp_loader *l = NULL;
        CHECK_OK(mmp_loader_create(&l, &cfg));
        mmp_batch *b = NULL;
        for (int k = 0; l && k < held; k++) {
            CHECK_OK(mmp_loader_get(l, 0, k, &b));
            if (k + 1 < held) {
                mmp_loader_release(l, b);
            }
        }
        mmp_loader_destroy(l); /* with b possibly still held */
    }
    mmp_dataset_close(d);
}

/* ---- owned micro-batches ----------------------------------------------------------- */

/* A copy of one micro-batch, to compare loaders that cannot share buffers. */
typedef struct batch_copy {
    int n, skipped;
    int64_t samples[64];
    uint8_t valid[64];
    float *images;
    int32_t *ids;
    float *mask;
} batch_copy;

static void copy_batch(batch_copy *c, const mmp_batch *b, const mmp_plan *p)
{
    const size_t S = (size_t)p->data.image_size, T = (size_t)p->data.max_text_len;
    const size_t n = (size_t)b->n;
    c->n = b->n;
    c->skipped = b->skipped;
    memcpy(c->samples, b->samples, n * sizeof *b->samples);
    memcpy(c->valid, b->valid, n * sizeof *b->valid);
    c->images = malloc(n * 3 * S * S * sizeof(float));
    c->ids = malloc(n * T * sizeof(int32_t));
    c->mask = malloc(n * T * sizeof(float));
    if (!c->images || !c->ids || !c->mask) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memcpy(c->images, b->images, n * 3 * S * S * sizeof(float));
    memcpy(c->ids, b->ids, n * T * sizeof(int32_t));
    memcpy(c->mask, b->mask, n * T * sizeof(float));
}

static int same_as_copy(const mmp_batch *b, const batch_copy *c, const mmp_plan *p)
{
    const size_t S = (size_t)p->data.image_size, T = (size_t)p->data.max_text_len;
    const size_t n = (size_t)c->n;
    return b->n == c->n && b->skipped == c->skipped &&
           memcmp(b->samples, c->samples, n * sizeof *c->samples) == 0 &&
           memcmp(b->valid, c->valid, n * sizeof *c->valid) == 0 &&
           memcmp(b->images, c->images, n * 3 * S * S * sizeof(float)) == 0 &&
           memcmp(b->ids, c->ids, n * T * sizeof(int32_t)) == 0 &&
           memcmp(b->mask, c->mask, n * T * sizeof(float)) == 0;
}

#define OWN_STEPS 4
#define OWN_MB 5

/* The copies check_owned compares with, from step first on. */
typedef struct owned_ctx {
    batch_copy (*all)[OWN_MB];
    int first;
    const mmp_plan *plan;
} owned_ctx;

static int same_as_owned_copy(const mmp_batch *b, void *ctx)
{
    const owned_ctx *c = ctx;
    return same_as_copy(b, &c->all[b->step - c->first][b->mb], c->plan);
}

/* Steps [1, 1 + OWN_STEPS) of plan (OWN_MB micro-batches) through a loader
 * owning the micro-batches owns marks, for workers 0, 1 and 2 and depths 1
 * and 3: exactly the owned (step, mb) come out, in order, each bitwise the
 * unfiltered loader's. Returns the samples the unfiltered loader flagged
 * bad, -1 when it failed. */
static int check_owned(mmp_dataset *d, mmp_plan *plan, const unsigned char *owns)
{
    const int first = 1, last = 1 + OWN_STEPS;
    batch_copy all[OWN_STEPS][OWN_MB];
    memset(all, 0, sizeof all);
    int skipped = 0;
    plan->data.workers = 0;
    mmp_loader_cfg cfg = both_branches(d, plan, first, last, 2);
    mmp_loader *l = NULL;
    CHECK_OK(mmp_loader_create(&l, &cfg));
    int got_all = l != NULL;
    for (int step = first; l && step < last; step++) {
        for (int mb = 0; mb < OWN_MB; mb++) {
            mmp_batch *b = NULL;
            mmp_err err = mmp_loader_get(l, step, mb, &b);
            CHECK(err == MMP_OK && b);
            if (err != MMP_OK || !b) {
                got_all = 0;
                continue;
            }
            copy_batch(&all[step - first][mb], b, plan);
            skipped += b->skipped;
            mmp_loader_release(l, b);
        }
    }
    mmp_loader_destroy(l);
    if (!got_all) {
        return -1;
    }

    static const int workers[] = {0, 1, 2};
    static const int depths[] = {1, 3};
    for (size_t w = 0; w < 3; w++) {
        for (size_t k = 0; k < 2; k++) {
            plan->data.workers = workers[w];
            cfg.depth = depths[k];
            cfg.owns = owns;
            l = NULL;
            CHECK_OK(mmp_loader_create(&l, &cfg));
            if (!l) {
                continue;
            }
            owned_ctx c = {all, first, plan};
            int produced;
            int ok = stream_batches(l, first, last, OWN_MB, owns, depths[k], "owned get",
                                    same_as_owned_copy, &c, &produced);
            int want = 0;
            for (int mb = 0; mb < OWN_MB; mb++) {
                want += owns[mb] != 0;
            }
            if (!ok) {
                fprintf(stderr, "  owned differs: workers %d depth %d\n", workers[w], depths[k]);
            }
            CHECK(ok);
            CHECK(produced == want * OWN_STEPS);
            mmp_batch *b = NULL;
            CHECK(mmp_loader_get(l, last, 0, &b) == MMP_ERR_INVALID && b == NULL);
            mmp_loader_destroy(l);
        }
    }
    for (int s = 0; s < OWN_STEPS; s++) {
        for (int mb = 0; mb < OWN_MB; mb++) {
            free(all[s][mb].images);
            free(all[s][mb].ids);
            free(all[s][mb].mask);
        }
    }
    return skipped;
}

static void test_owned(void)
{
    /* batch 12 in 5 micro-batches: sizes 3 3 2 2 2 */
    mmp_plan plan;
    small_plan(&plan, 8, 7, 12, OWN_MB, 0, MMP_BAD_FAIL);
    mmp_dataset *d = open_written("loader_owned", 53, &plan);
    if (!d) {
        return;
    }
    static const unsigned char owns[][OWN_MB] = {
        {1, 0, 1, 1, 0}, {0, 1, 0, 0, 1}, {0, 0, 0, 0, 1}, {1, 1, 1, 1, 1}};
    for (size_t k = 0; k < sizeof owns / sizeof owns[0]; k++) {
        CHECK(check_owned(d, &plan, owns[k]) == 0);
    }

    /* Asking for an unowned micro-batch names it and consumes nothing;
     * owned ones out of order are out of order. */
    plan.data.workers = 2;
    mmp_loader_cfg cfg = {.ds = d,
                          .plan = &plan,
                          .images = 1,
                          .text = 1,
                          .first_step = 0,
                          .last_step = 2,
                          .depth = 2,
                          .owns = owns[0]};
    mmp_loader *l = NULL;
    CHECK_OK(mmp_loader_create(&l, &cfg));
    if (l) {
        mmp_batch *b = NULL;
        CHECK_OK(mmp_loader_get(l, 0, 0, &b));
        mmp_loader_release(l, b);
        b = NULL;
        CHECK(mmp_loader_get(l, 0, 1, &b) == MMP_ERR_INVALID && b == NULL);
        CHECK(contains(mmp_last_error(), "step 0 micro-batch 1"));
        CHECK(contains(mmp_last_error(), "does not own micro-batch 1"));
        CHECK(mmp_loader_get(l, 0, 3, &b) == MMP_ERR_INVALID && b == NULL);
        CHECK(contains(mmp_last_error(), "out of order (next is step 0 micro-batch 2)"));
        CHECK(mmp_loader_get(l, 1, 4, &b) == MMP_ERR_INVALID && b == NULL);
        CHECK(contains(mmp_last_error(), "does not own micro-batch 4"));
        CHECK_OK(mmp_loader_get(l, 0, 2, &b));
        CHECK(b && b->step == 0 && b->mb == 2);
        mmp_loader_release(l, b);
        CHECK_OK(mmp_loader_get(l, 0, 3, &b));
        mmp_loader_release(l, b);
        CHECK(mmp_loader_get(l, 1, 2, &b) == MMP_ERR_INVALID);
        CHECK(contains(mmp_last_error(), "out of order (next is step 1 micro-batch 0)"));
        CHECK_OK(mmp_loader_get(l, 1, 0, &b));
        CHECK(b && b->step == 1 && b->mb == 0);
        mmp_loader_release(l, b);
    }
    mmp_loader_destroy(l);

    /* The caller's array may go once the loader exists. */
    unsigned char mine[OWN_MB] = {0, 0, 1, 0, 0};
    cfg.owns = mine;
    l = NULL;
    CHECK_OK(mmp_loader_create(&l, &cfg));
    memset(mine, 1, sizeof mine);
    if (l) {
        mmp_batch *b = NULL;
        CHECK(mmp_loader_get(l, 0, 0, &b) == MMP_ERR_INVALID);
        CHECK_OK(mmp_loader_get(l, 0, 2, &b));
        mmp_loader_release(l, b);
        CHECK_OK(mmp_loader_get(l, 1, 2, &b));
        mmp_loader_release(l, b);
    }
    mmp_loader_destroy(l);

    /* Owning nothing is an error at create. */
    static const unsigned char none[OWN_MB] = {0};
    cfg.owns = none;
    l = NULL;
    CHECK(mmp_loader_create(&l, &cfg) == MMP_ERR_INVALID && l == NULL);
    CHECK(contains(mmp_last_error(), "owns none of the 5 micro-batches"));
    mmp_dataset_close(d);

    /* Under skip the valid flags and counts carry over too: bad_samples.jsonl
     * has 5 bad of 8, in micro-batches of 2 2 2 1 1. */
    small_plan(&plan, 8, 6, 8, OWN_MB, 0, MMP_BAD_SKIP);
    d = NULL;
    CHECK_OK(mmp_dataset_open(&d, FIXTURES "/bad_samples.jsonl", FIXTURES "/vocab.txt", &plan));
    if (d) {
        CHECK(check_owned(d, &plan, owns[0]) > 0);
        CHECK(check_owned(d, &plan, owns[1]) > 0);
    }
    mmp_dataset_close(d);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_order_and_contents), MMP_TEST_CASE(test_fail_policy),
    MMP_TEST_CASE(test_skip_at_open),       MMP_TEST_CASE(test_skip_at_load),
    MMP_TEST_CASE(test_destroy_mid_stream), MMP_TEST_CASE(test_owned),
    MMP_TEST_CASE(test_check_cli),
};

int main(int argc, char **argv)
{
    mmp_log_set_level(MMP_LOG_ERROR); /* skip warnings are expected here */
    return MMP_TEST_MAIN("test_loader", cases, argc, argv);
}
