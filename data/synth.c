/* The synthetic "shapes" set: scenes, their pixels, their captions, files.
 *
 * What makes it learnable by a small CNN + transformer in minutes: few
 * attributes, each large and unambiguous at 32x32 (six far-apart colours,
 * five shapes told apart by outline or hole, sizes 8 vs 13 px, a 3x3 grid
 * of places), captions that state every attribute of every object. What makes
 * it varied: independent attributes, 1-3 objects, relations between them, so
 * few captions repeat in a 256-sample batch. Spatial words follow CLEVR's
 * convention: "A left of B" means A's grid column is smaller, whatever the
 * rows; "above" compares rows. A caption never states something the image
 * does not show (tests/test_data.c checks every caption against the pixels).
 * Never reads anything: all of it comes from (seed, index). */
#include "data/synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/json.h"
#include "common/rng.h"
#include "data/png.h"

#define GRID 3
#define MAX_OBJECTS 3
/* Mixed into the seed: keeps these streams apart from other users of the seed. */
#define SYNTH_DOMAIN 0x73796e7468657469ull
#define MAX_SAMPLES 10000000

static const struct {
    const char *name;
    uint8_t rgb[3];
} colours[] = {
    {"red", {225, 40, 40}},     {"green", {40, 200, 60}},   {"blue", {50, 100, 245}},
    {"yellow", {235, 220, 40}}, {"purple", {170, 60, 220}}, {"white", {240, 240, 240}},
};
#define N_COLOURS ((int)(sizeof colours / sizeof colours[0]))

enum { CIRCLE, SQUARE, TRIANGLE, CROSS, RING, N_SHAPES };
static const char *const shape_names[N_SHAPES] = {"circle", "square", "triangle", "cross", "ring"};
static const char *const size_names[2] = {"small", "large"};

/* Where a lone object is, by grid cell [row][col]. */
static const char *const place_names[GRID][GRID] = {
    {"in the top left", "at the top", "in the top right"},
    {"on the left", "in the center", "on the right"},
    {"in the bottom left", "at the bottom", "in the bottom right"},
};

enum { LEFT_OF, RIGHT_OF, ABOVE, BELOW, N_RELATIONS };
static const char *const relation_names[N_RELATIONS] = {"left of", "right of", "above", "below"};

typedef struct object {
    int colour, shape, large;
    int row, col;       /* grid cell */
    float cx, cy, side; /* centre and bounding-box side, pixels */
} object;

typedef struct scene {
    int n;
    object obj[MAX_OBJECTS];
} scene;

int mmp_synth_val_count(int samples)
{
    int v = samples / 8;
    v = v < 256 ? v : 256;
    return v > 1 ? v : 1;
}

static float small_side(int size)
{
    return roundf(0.25f * (float)size); /* 8 px at 32 */
}

static float large_side(int size)
{
    return roundf(0.41f * (float)size); /* 13 px at 32 */
}

/* Places o (side already set) in a free cell with jitter, its box two pixels
 * from every box in s->obj[0..k): at least one whole background pixel always
 * separates two objects, so they never touch. */
static int place_object(mmp_rng *r, const scene *s, int k, int size, object *o)
{
    const float cell = (float)size / GRID;
    const float jitter = 0.06f * (float)size;
    const float half = o->side / 2;
    for (int attempt = 0; attempt < 64; attempt++) {
        int c = (int)mmp_rng_below(r, GRID * GRID);
        int row = c / GRID, col = c % GRID;
        int used = 0;
        for (int j = 0; j < k; j++) {
            used |= s->obj[j].row == row && s->obj[j].col == col;
        }
        if (used) {
            continue;
        }
        float cx = ((float)col + 0.5f) * cell + (2 * mmp_rng_uniform(r) - 1) * jitter;
        float cy = ((float)row + 0.5f) * cell + (2 * mmp_rng_uniform(r) - 1) * jitter;
        cx = fminf(fmaxf(cx, half + 1), (float)size - half - 1);
        cy = fminf(fmaxf(cy, half + 1), (float)size - half - 1);
        int clear = 1;
        for (int j = 0; j < k; j++) {
            const object *p = &s->obj[j];
            float gap = (o->side + p->side) / 2 + 2;
            if (fabsf(cx - p->cx) < gap && fabsf(cy - p->cy) < gap) {
                clear = 0;
            }
        }
        if (clear) {
            o->row = row, o->col = col, o->cx = cx, o->cy = cy;
            return 1;
        }
    }
    return 0;
}

static void scene_sample(mmp_rng *r, int size, scene *s)
{
    /* 1/8 one object, 3/8 two, 1/2 three: single-object captions have the
     * smallest space (2 sizes x 6 colours x 5 shapes x 9 places = 540), so
     * they are the rarest, which keeps repeats in a 256-sample batch rare. */
    static const int n_of[8] = {1, 2, 2, 2, 3, 3, 3, 3};
    int n = n_of[mmp_rng_below(r, 8)];
    for (int attempt = 0; attempt < 1000; attempt++) {
        memset(s, 0, sizeof *s);
        s->n = n;
        int ok = 1;
        for (int k = 0; k < n && ok; k++) {
            object *o = &s->obj[k];
            int distinct;
            do { /* no two objects alike in colour and shape: captions stay unambiguous */
                o->colour = (int)mmp_rng_below(r, N_COLOURS);
                o->shape = (int)mmp_rng_below(r, N_SHAPES);
                distinct = 1;
                for (int j = 0; j < k; j++) {
                    distinct &= !(s->obj[j].colour == o->colour && s->obj[j].shape == o->shape);
                }
            } while (!distinct);
            o->large = (int)mmp_rng_below(r, 2);
            o->side = o->large ? large_side(size) : small_side(size);
            ok = place_object(r, s, k, size, o);
        }
        if (ok) {
            return;
        }
    }
    /* Unreachable in practice (a few tries always succeed); a valid scene anyway. */
    memset(s, 0, sizeof *s);
    s->n = 1;
    s->obj[0].row = s->obj[0].col = 1;
    s->obj[0].side = small_side(size);
    s->obj[0].cx = s->obj[0].cy = (float)size / 2;
}

static int inside(int shape, float u, float v)
{
    /* u, v: pixel centre relative to the object's centre, in half-sides. */
    switch (shape) {
    case CIRCLE:
        return u * u + v * v <= 1.0f;
    case SQUARE:
        return fabsf(u) <= 0.86f && fabsf(v) <= 0.86f;
    case TRIANGLE:
        return v >= -0.9f && v <= 0.9f && fabsf(u) <= (v + 0.9f) / 1.8f;
    case RING:
        return u * u + v * v <= 1.0f && u * u + v * v >= 0.3f; /* hole ~ half the width */
    case CROSS:
        return fabsf(u) <= 1.0f && fabsf(v) <= 1.0f && (fabsf(u) <= 0.3f || fabsf(v) <= 0.3f);
    }
    return 0;
}

static uint8_t clamp_u8(int x)
{
    return (uint8_t)(x < 0 ? 0 : x > 255 ? 255 : x);
}

/* Pixel noise: uniform-ish integers in [-amp, amp], eight per 64-bit draw
 * (a multiply-shift of each byte; its tiny bias does not matter for noise). */
typedef struct noise {
    uint64_t bits;
    int left;
} noise;

static int noise_next(mmp_rng *r, noise *n, int amp)
{
    if (n->left == 0) {
        n->bits = mmp_rng_u64(r);
        n->left = 8;
    }
    int byte = (int)(n->bits & 0xff);
    n->bits >>= 8;
    n->left--;
    return ((byte * (2 * amp + 1)) >> 8) - amp;
}

static void scene_render(mmp_rng *r, const scene *s, int size, uint8_t *rgb)
{
    noise nz = {0};
    int base = 12 + (int)mmp_rng_below(r, 16);
    for (int i = 0; i < size * size * 3; i++) {
        rgb[i] = clamp_u8(base + noise_next(r, &nz, 5));
    }
    for (int k = 0; k < s->n; k++) {
        const object *o = &s->obj[k];
        float half = o->side / 2;
        float shade = 0.85f + 0.15f * mmp_rng_uniform(r);
        int x0 = (int)floorf(o->cx - half), x1 = (int)ceilf(o->cx + half);
        int y0 = (int)floorf(o->cy - half), y1 = (int)ceilf(o->cy + half);
        for (int y = y0 < 0 ? 0 : y0; y < y1 && y < size; y++) {
            for (int x = x0 < 0 ? 0 : x0; x < x1 && x < size; x++) {
                float u = ((float)x + 0.5f - o->cx) / half;
                float v = ((float)y + 0.5f - o->cy) / half;
                if (!inside(o->shape, u, v)) {
                    continue;
                }
                uint8_t *p = rgb + ((size_t)y * (size_t)size + (size_t)x) * 3;
                for (int c = 0; c < 3; c++) {
                    int val = (int)lroundf(shade * colours[o->colour].rgb[c]);
                    p[c] = clamp_u8(val + noise_next(r, &nz, 8));
                }
            }
        }
    }
}

static int relation_holds(const object *a, const object *b, int rel)
{
    switch (rel) {
    case LEFT_OF:
        return a->col < b->col;
    case RIGHT_OF:
        return a->col > b->col;
    case ABOVE:
        return a->row < b->row;
    case BELOW:
        return a->row > b->row;
    }
    return 0;
}

static size_t put_object(char *buf, size_t at, size_t n, const object *o)
{
    int w = snprintf(buf + at, n - at, "a %s %s %s", size_names[o->large], colours[o->colour].name,
                     shape_names[o->shape]);
    return at + (size_t)w;
}

static void scene_caption(mmp_rng *r, const scene *s, char *buf, size_t n)
{
    size_t at = 0;
    if (s->n == 1) {
        const object *o = &s->obj[0];
        at = put_object(buf, at, n, o);
        snprintf(buf + at, n - at, " %s", place_names[o->row][o->col]);
        return;
    }
    /* Every (subject, relation) that is true of the subject against all the
     * others; one of them is said. Two distinct cells always differ in a row
     * or a column, and of three cells one is always extreme in some direction. */
    int subj[MAX_OBJECTS * N_RELATIONS], rels[MAX_OBJECTS * N_RELATIONS], n_cand = 0;
    for (int a = 0; a < s->n; a++) {
        for (int rel = 0; rel < N_RELATIONS; rel++) {
            int all = 1;
            for (int b = 0; b < s->n; b++) {
                all &= b == a || relation_holds(&s->obj[a], &s->obj[b], rel);
            }
            if (all) {
                subj[n_cand] = a, rels[n_cand] = rel, n_cand++;
            }
        }
    }
    if (n_cand == 0) { /* impossible with distinct cells */
        snprintf(buf, n, "%s", "a scene");
        return;
    }
    int pick = (int)mmp_rng_below(r, (uint64_t)n_cand);
    int a = subj[pick], rel = rels[pick];
    int others[MAX_OBJECTS - 1], n_others = 0;
    for (int b = 0; b < s->n; b++) {
        if (b != a) {
            others[n_others++] = b;
        }
    }
    if (n_others == 2 && mmp_rng_below(r, 2)) {
        int t = others[0];
        others[0] = others[1], others[1] = t;
    }
    at = put_object(buf, at, n, &s->obj[a]);
    at += (size_t)snprintf(buf + at, n - at, " %s ", relation_names[rel]);
    at = put_object(buf, at, n, &s->obj[others[0]]);
    if (n_others == 2) {
        at += (size_t)snprintf(buf + at, n - at, " and ");
        put_object(buf, at, n, &s->obj[others[1]]);
    }
}

mmp_err mmp_synth_sample(uint64_t seed, int64_t index, int image_size, uint8_t *rgb,
                         char caption[MMP_SYNTH_CAPTION_MAX], int *n_objects)
{
    if (image_size < MMP_SYNTH_MIN_IMAGE || image_size > MMP_SYNTH_MAX_IMAGE) {
        return mmp_errorf(MMP_ERR_INVALID, "synth image size %d out of range [%d, %d]", image_size,
                          MMP_SYNTH_MIN_IMAGE, MMP_SYNTH_MAX_IMAGE);
    }
    if (index < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "synth sample index %lld < 0", (long long)index);
    }
    mmp_rng r;
    mmp_rng_seed(&r, seed ^ SYNTH_DOMAIN, (uint64_t)index);
    scene s;
    scene_sample(&r, image_size, &s);
    scene_render(&r, &s, image_size, rgb);
    scene_caption(&r, &s, caption, MMP_SYNTH_CAPTION_MAX);
    if (n_objects) {
        *n_objects = s.n;
    }
    return MMP_OK;
}

/* ---- files ---------------------------------------------------------------- */

static mmp_err make_dirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        return mmp_errorf(MMP_ERR_INVALID, "output folder '%s': empty or too long", path);
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) {
            continue;
        }
        char saved = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            return mmp_errorf(MMP_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
        }
        struct stat st;
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
            return mmp_errorf(MMP_ERR_IO, "%s: not a folder", buf);
        }
        buf[i] = saved;
    }
    return MMP_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds each space-separated word of phrase to words[] unless present. */
static void add_words(const char *phrase, char words[][16], int *n)
{
    const char *p = phrase;
    while (*p) {
        while (*p == ' ') {
            p++;
        }
        size_t len = strcspn(p, " ");
        if (len == 0) {
            break;
        }
        int seen = 0;
        for (int i = 0; i < *n; i++) {
            seen |= strlen(words[i]) == len && memcmp(words[i], p, len) == 0;
        }
        if (!seen && len < sizeof words[0]) {
            memcpy(words[*n], p, len);
            words[*n][len] = 0;
            (*n)++;
        }
        p += len;
    }
}

static mmp_err write_vocab(const char *path)
{
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    char words[64][16];
    int n = 0;
    add_words("a and", words, &n);
    for (int i = 0; i < N_COLOURS; i++) {
        add_words(colours[i].name, words, &n);
    }
    for (int i = 0; i < N_SHAPES; i++) {
        add_words(shape_names[i], words, &n);
    }
    for (int i = 0; i < 2; i++) {
        add_words(size_names[i], words, &n);
    }
    for (int i = 0; i < GRID * GRID; i++) {
        add_words(place_names[i / GRID][i % GRID], words, &n);
    }
    for (int i = 0; i < N_RELATIONS; i++) {
        add_words(relation_names[i], words, &n);
    }
    const char *sorted[64];
    for (int i = 0; i < n; i++) {
        sorted[i] = words[i];
    }
    qsort(sorted, (size_t)n, sizeof sorted[0], cmp_str);

    FILE *f = fopen(path, "w");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        fprintf(f, "%s\n", specials[i]);
    }
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n", sorted[i]);
    }
    for (int c = 33; c < 127; c++) { /* BERT's ASCII punctuation: every non-alphanumeric */
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
            fprintf(f, "%c\n", c);
        }
    }
    if (fclose(f) != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return MMP_OK;
}

mmp_err mmp_synth_write(const char *out_dir, int samples, uint64_t seed, int image_size)
{
    mmp_err ret = MMP_OK;
    /* Zeroed: abort is a no-op on a manifest not (yet) opened. */
    mmp_atomic_file train = {0}, val = {0};
    uint8_t *rgb = NULL;
    char path[4096], train_path[4096], val_path[4096];

    if (samples < 1 || samples > MAX_SAMPLES) {
        return mmp_errorf(MMP_ERR_INVALID, "synth samples %d out of range [1, %d]", samples,
                          MAX_SAMPLES);
    }
    if (image_size < MMP_SYNTH_MIN_IMAGE || image_size > MMP_SYNTH_MAX_IMAGE) {
        return mmp_errorf(MMP_ERR_INVALID, "synth image size %d out of range [%d, %d]", image_size,
                          MMP_SYNTH_MIN_IMAGE, MMP_SYNTH_MAX_IMAGE);
    }
    if (strlen(out_dir) > 3000) {
        return mmp_errorf(MMP_ERR_INVALID, "output folder path too long");
    }
    snprintf(path, sizeof path, "%s/images", out_dir);
    MMP_TRY(make_dirs(path));
    snprintf(path, sizeof path, "%s/vocab.txt", out_dir);
    MMP_TRY(write_vocab(path));

    /* The manifests appear only once every image is written: a set cut short
     * (a full disk, a signal) has none, rather than one that looks whole, or
     * an older one whose images were just overwritten. Not durable: a data
     * set is regenerated from its seed, and its images are not fsynced
     * either. */
    snprintf(train_path, sizeof train_path, "%s/train.jsonl", out_dir);
    snprintf(val_path, sizeof val_path, "%s/val.jsonl", out_dir);
    unlink(train_path);
    unlink(val_path);
    MMP_TRY_GOTO(mmp_atomic_open(&train, train_path, 0), ret, exit);
    MMP_TRY_GOTO(mmp_atomic_open(&val, val_path, 0), ret, exit);
    rgb = malloc((size_t)image_size * (size_t)image_size * 3);
    if (!rgb) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "synth image buffer");
        goto exit;
    }
    int64_t total = (int64_t)samples + mmp_synth_val_count(samples);
    for (int64_t i = 0; i < total; i++) {
        char caption[MMP_SYNTH_CAPTION_MAX], rel[32];
        MMP_TRY_GOTO(mmp_synth_sample(seed, i, image_size, rgb, caption, NULL), ret, exit);
        snprintf(rel, sizeof rel, "images/%06lld.png", (long long)i);
        snprintf(path, sizeof path, "%s/%s", out_dir, rel);
        MMP_TRY_GOTO(mmp_png_write(path, rgb, image_size, image_size), ret, exit);
        FILE *f = i < samples ? train.f : val.f;
        fputs("{\"image\": ", f);
        mmp_json_put_string(f, rel);
        fputs(", \"text\": ", f);
        mmp_json_put_string(f, caption);
        fputs("}\n", f);
    }
    MMP_TRY_GOTO(mmp_atomic_commit(&train), ret, exit);
    if ((ret = mmp_atomic_commit(&val)) != MMP_OK) {
        unlink(train_path); /* no train manifest without its val one */
    }
exit:
    mmp_atomic_abort(&train);
    mmp_atomic_abort(&val);
    free(rgb);
    return ret;
}
