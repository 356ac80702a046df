/* The synthetic data set (data/synth.c): determinism (same seed, same
 * bytes; another seed, other bytes) and content (every caption true of its
 * image: shapes, colours and relations read back from the pixels).
 * Everything written goes to mmp_test_tmpdir(). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "data/manifest.h"
#include "data/png.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "tests/harness.h"

/* ---- synth -------------------------------------------------------------------- */

static const char *const shape_words[] = {"circle", "square", "triangle", "cross", "ring"};

static int count_shapes(const char *caption)
{
    int n = 0;
    char buf[MMP_SYNTH_CAPTION_MAX];
    snprintf(buf, sizeof buf, "%s", caption);
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        for (size_t k = 0; k < sizeof shape_words / sizeof shape_words[0]; k++) {
            n += strcmp(w, shape_words[k]) == 0;
        }
    }
    return n;
}

/* Reads the "text" of every line of a synth manifest (plain ASCII captions). */
static int read_captions(const char *manifest, char caps[][MMP_SYNTH_CAPTION_MAX], int max,
                         char images[][32])
{
    FILE *f = fopen(manifest, "r");
    if (!f) {
        return -1;
    }
    char line[1024];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        mmp_manifest_entry e;
        line[strcspn(line, "\n")] = 0;
        if (mmp_manifest_parse_line(line, strlen(line), &e) != MMP_OK) {
            n = -1;
            break;
        }
        snprintf(caps[n], MMP_SYNTH_CAPTION_MAX, "%s", e.text);
        snprintf(images[n], 32, "%s", e.image);
        mmp_manifest_entry_fini(&e);
        n++;
    }
    fclose(f);
    return n;
}

static int cmp_caption(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* An oracle for "the caption tells the truth": finds the objects in the
 * pixels (4-connected bright components; synth keeps a background pixel
 * between objects) and checks the caption's count, colours, sizes, shapes,
 * place and relations against them. It is written from the pictures' side,
 * not from synth's code, so a change that makes captions lie fails here. */
typedef struct blob {
    int n, x0, y0, x1, y1; /* pixels, inclusive bbox */
    double cx, cy, r, g, b;
    int colour, large, shape;
} blob;

static const char *const colour_words[] = {"red", "green", "blue", "yellow", "purple", "white"};
static const uint8_t colour_rgb[6][3] = {{225, 40, 40},  {40, 200, 60},  {50, 100, 245},
                                         {235, 220, 40}, {170, 60, 220}, {240, 240, 240}};

static int find_word(const char *w, const char *const *list, int n)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(w, list[i]) == 0) {
            return i;
        }
    }
    return -1;
}

static int is_fg(const uint8_t *p)
{
    return p[0] >= 80 || p[1] >= 80 || p[2] >= 80;
}

static int row_width(const uint8_t *rgb, int S, const blob *b, int y)
{
    int w = 0;
    for (int x = b->x0; x <= b->x1; x++) {
        w += is_fg(rgb + (y * S + x) * 3);
    }
    return w;
}

static void classify(const uint8_t *rgb, int S, blob *b)
{
    double best = 1e30;
    for (int c = 0; c < 6; c++) {
        /* objects are drawn at 85-100% of their colour's brightness */
        double dr = b->r / 0.925 - colour_rgb[c][0], dg = b->g / 0.925 - colour_rgb[c][1];
        double db = b->b / 0.925 - colour_rgb[c][2];
        double d = dr * dr + dg * dg + db * db;
        if (d < best) {
            best = d, b->colour = c;
        }
    }
    int w = b->x1 - b->x0 + 1, h = b->y1 - b->y0 + 1;
    b->large = (w > h ? w : h) >= 10;
    double fill = (double)b->n / (w * h);
    int cx = (b->x0 + b->x1) / 2, cy = (b->y0 + b->y1) / 2;
    int top = row_width(rgb, S, b, b->y0), bottom = row_width(rgb, S, b, b->y1);
    if (!is_fg(rgb + (cy * S + cx) * 3)) {
        b->shape = 4; /* ring: a hole in the middle */
    } else if (fill >= 0.9) {
        b->shape = 1; /* square */
    } else if (bottom >= w - 1 && top <= w / 2) {
        b->shape = 2; /* triangle: a wide base, a narrow top */
    } else if (fill >= 0.65) {
        b->shape = 0; /* circle */
    } else {
        b->shape = 3; /* cross */
    }
}

static int find_blobs(const uint8_t *rgb, int S, blob *out, int max)
{
    static int label[64 * 64], stack[64 * 64];
    int n = 0;
    memset(label, 0, sizeof label);
    for (int start = 0; start < S * S; start++) {
        if (label[start] || !is_fg(rgb + start * 3)) {
            continue;
        }
        if (n == max) {
            return max + 1;
        }
        blob *b = &out[n++];
        memset(b, 0, sizeof *b);
        b->x0 = b->y0 = S;
        int top = 0;
        stack[top++] = start;
        label[start] = n;
        while (top) {
            int p = stack[--top], x = p % S, y = p / S;
            const uint8_t *q = rgb + p * 3;
            b->n++, b->cx += x + 0.5, b->cy += y + 0.5, b->r += q[0], b->g += q[1], b->b += q[2];
            b->x0 = x < b->x0 ? x : b->x0, b->x1 = x > b->x1 ? x : b->x1;
            b->y0 = y < b->y0 ? y : b->y0, b->y1 = y > b->y1 ? y : b->y1;
            const int nb[4] = {x > 0 ? p - 1 : -1, x < S - 1 ? p + 1 : -1, y > 0 ? p - S : -1,
                               y < S - 1 ? p + S : -1};
            for (int k = 0; k < 4; k++) {
                if (nb[k] >= 0 && !label[nb[k]] && is_fg(rgb + nb[k] * 3)) {
                    label[nb[k]] = n;
                    stack[top++] = nb[k];
                }
            }
        }
        b->cx /= b->n, b->cy /= b->n, b->r /= b->n, b->g /= b->n, b->b /= b->n;
        classify(rgb, S, b);
    }
    return n;
}

typedef struct phrase {
    int large, colour, shape;
} phrase;

/* 1 when blobs[assign[k]] can be phrase k for every k and the relation holds. */
static int relation_true(const blob *blobs, const int *assign, int n, int rel)
{
    const blob *a = &blobs[assign[0]];
    for (int k = 1; k < n; k++) {
        const blob *o = &blobs[assign[k]];
        int ok = rel == 0   ? a->cx < o->cx - 2
                 : rel == 1 ? a->cx > o->cx + 2
                 : rel == 2 ? a->cy < o->cy - 2
                            : a->cy > o->cy + 2;
        if (!ok) {
            return 0;
        }
    }
    return 1;
}

/* Returns NULL when caption is true of rgb (S x S), else what is wrong. */
static const char *caption_lie(const uint8_t *rgb, int S, const char *caption)
{
    static const char *const sizes[] = {"small", "large"};
    static const char *const places[9] = {
        "in the top left",    "at the top",    "in the top right",
        "on the left",        "in the center", "on the right",
        "in the bottom left", "at the bottom", "in the bottom right"};
    static const char *const relations[] = {"left of", "right of", "above", "below"};
    char buf[MMP_SYNTH_CAPTION_MAX];
    char *w[40];
    int nw = 0;
    snprintf(buf, sizeof buf, "%s", caption);
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t && nw < 40;
         t = strtok_r(NULL, " ", &save)) {
        w[nw++] = t;
    }
    phrase ph[3];
    int np = 0, at = 0, rel = -1, place = -1;
    while (at + 4 <= nw && strcmp(w[at], "a") == 0 && np < 3) {
        ph[np].large = find_word(w[at + 1], sizes, 2);
        ph[np].colour = find_word(w[at + 2], colour_words, 6);
        ph[np].shape = find_word(w[at + 3], shape_words, 5);
        if (ph[np].large < 0 || ph[np].colour < 0 || ph[np].shape < 0) {
            return "unknown attribute word";
        }
        np++, at += 4;
        if (at == nw) {
            break;
        }
        char rest[MMP_SYNTH_CAPTION_MAX] = "";
        if (np == 1) {
            for (int i = at; i < nw; i++) {
                strcat(rest, i > at ? " " : "");
                strcat(rest, w[i]);
            }
            place = find_word(rest, places, 9);
            if (place >= 0) {
                at = nw;
                break;
            }
            int two = at + 1 < nw && strcmp(w[at + 1], "of") == 0;
            snprintf(rest, sizeof rest, "%s%s", w[at], two ? " of" : "");
            rel = find_word(rest, relations, 4);
            if (rel < 0) {
                return "neither a place nor a relation after the first object";
            }
            at += two ? 2 : 1;
        } else if (np == 2 && strcmp(w[at], "and") == 0) {
            at++;
        } else {
            return "unexpected words";
        }
    }
    if (at != nw || np == 0 || (np == 1) != (place >= 0)) {
        return "caption does not parse";
    }
    blob blobs[4];
    int nb = find_blobs(rgb, S, blobs, 3);
    if (nb != np) {
        return "object count differs";
    }
    /* Some assignment of blobs to phrases must match attributes and relation. */
    static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int p = 0; p < 6; p++) {
        int assign[3], ok = 1;
        for (int k = 0; k < np; k++) {
            assign[k] = perms[p][k];
            ok &= assign[k] < nb;
        }
        for (int k = 0; ok && k < np; k++) {
            const blob *b = &blobs[assign[k]];
            ok &= b->colour == ph[k].colour && b->large == ph[k].large && b->shape == ph[k].shape;
        }
        if (ok && place >= 0) {
            int col = (int)(blobs[assign[0]].cx * 3 / S), row = (int)(blobs[assign[0]].cy * 3 / S);
            ok = row * 3 + col == place;
        }
        if (ok && rel >= 0) {
            ok = relation_true(blobs, assign, np, rel);
        }
        if (ok) {
            return NULL;
        }
    }
    return "no object assignment matches the caption";
}

static void test_synth_determinism(void)
{
    char a[1024], b[1024], c[1024], pa[1200], pb[1200];
    snprintf(a, sizeof a, "%s", mmp_test_tmpdir("data_synth_a"));
    snprintf(b, sizeof b, "%s", mmp_test_tmpdir("data_synth_b"));
    snprintf(c, sizeof c, "%s", mmp_test_tmpdir("data_synth_c"));
    CHECK_OK(mmp_synth_write(a, 40, 7, 32));
    CHECK_OK(mmp_synth_write(b, 40, 7, 32));
    CHECK_OK(mmp_synth_write(c, 40, 8, 32));
    CHECK(mmp_synth_val_count(40) == 5);
    CHECK(mmp_synth_val_count(1) == 1 && mmp_synth_val_count(100000) == 256);
    static const char *const files[] = {"train.jsonl", "val.jsonl", "vocab.txt"};
    for (int k = 0; k < 3; k++) {
        snprintf(pa, sizeof pa, "%s/%s", a, files[k]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[k]);
        CHECK(mmp_test_same_file(pa, pb));
    }
    int same_images = 1, differ_c = 0;
    for (int i = 0; i < 45; i++) {
        snprintf(pa, sizeof pa, "%s/images/%06d.png", a, i);
        snprintf(pb, sizeof pb, "%s/images/%06d.png", b, i);
        same_images &= mmp_test_same_file(pa, pb);
        snprintf(pb, sizeof pb, "%s/images/%06d.png", c, i);
        differ_c += !mmp_test_same_file(pa, pb);
    }
    CHECK(same_images);
    CHECK(differ_c >= 40); /* another seed, other pictures */
    snprintf(pa, sizeof pa, "%s/train.jsonl", a);
    snprintf(pb, sizeof pb, "%s/train.jsonl", c);
    CHECK(!mmp_test_same_file(pa, pb));
    snprintf(pa, sizeof pa, "%s/images/%06d.png", a, 45);
    CHECK(access(pa, F_OK) != 0); /* 40 train + 5 val, nothing more */

    /* The in-memory sample is the file's sample. */
    uint8_t rgb[32 * 32 * 3];
    char caption[MMP_SYNTH_CAPTION_MAX];
    int n_objects = 0;
    CHECK_OK(mmp_synth_sample(7, 3, 32, rgb, caption, &n_objects));
    snprintf(pa, sizeof pa, "%s/images/%06d.png", a, 3);
    mmp_image img;
    CHECK_OK(mmp_png_read(pa, &img));
    CHECK(img.rgb && memcmp(img.rgb, rgb, sizeof rgb) == 0);
    mmp_image_fini(&img);
    CHECK(n_objects >= 1 && n_objects <= 3 && count_shapes(caption) == n_objects);

    CHECK(mmp_synth_write(a, 0, 7, 32) == MMP_ERR_INVALID);
    CHECK(mmp_synth_write(a, 10, 7, 8) == MMP_ERR_INVALID);

    /* A set cut short (here image 20 cannot be written: a directory stands
     * at its name) leaves no manifest, not a partial one that looks whole,
     * nor the older set's whose first images were just overwritten. */
    snprintf(pa, sizeof pa, "%s/images/%06d.png", c, 20);
    CHECK(unlink(pa) == 0 && mkdir(pa, 0755) == 0);
    CHECK(mmp_synth_write(c, 40, 9, 32) == MMP_ERR_IO);
    static const char *const left[] = {"train.jsonl", "val.jsonl", "train.jsonl.tmp",
                                       "val.jsonl.tmp"};
    for (int k = 0; k < 4; k++) {
        snprintf(pb, sizeof pb, "%s/%s", c, left[k]);
        CHECK(access(pb, F_OK) != 0);
    }
}

static void test_synth_content(void)
{
    char dir[1024], path[1200], img_path[1200];
    snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("data_synth_set"));
    const int n_train = 2048; /* val = 256 */
    CHECK_OK(mmp_synth_write(dir, n_train, 1, 32));

    static char train[2048][MMP_SYNTH_CAPTION_MAX], val[256][MMP_SYNTH_CAPTION_MAX];
    static char train_img[2048][32], val_img[256][32];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    CHECK(read_captions(path, train, n_train, train_img) == n_train);
    snprintf(path, sizeof path, "%s/val.jsonl", dir);
    CHECK(read_captions(path, val, 256, val_img) == 256);

    /* Val images are not train images. */
    CHECK(strcmp(train_img[n_train - 1], "images/002047.png") == 0);
    CHECK(strcmp(val_img[0], "images/002048.png") == 0);

    /* Every image decodes, is 32x32, shows something bright, and its
     * caption names 1 to 3 shapes; the object counts all occur. */
    int bad_shapes = 0, bad_images = 0, lies = 0, counts[4] = {0};
    for (int i = 0; i < n_train + 256; i++) {
        const char *cap = i < n_train ? train[i] : val[i - n_train];
        const char *rel = i < n_train ? train_img[i] : val_img[i - n_train];
        int n = count_shapes(cap);
        bad_shapes += n < 1 || n > 3;
        counts[n >= 1 && n <= 3 ? n : 0]++;
        snprintf(img_path, sizeof img_path, "%s/%s", dir, rel);
        mmp_image img;
        if (mmp_png_read(img_path, &img) != MMP_OK || img.width != 32 || img.height != 32) {
            bad_images++;
            mmp_image_fini(&img);
            continue;
        }
        int bright = 0;
        for (int p = 0; p < 32 * 32; p++) {
            const uint8_t *q = img.rgb + p * 3;
            bright += q[0] > 120 || q[1] > 120 || q[2] > 120;
        }
        bad_images += bright < 20 * n; /* a small object covers >= ~25 pixels */
        const char *lie = caption_lie(img.rgb, 32, cap);
        if (lie && lies < 5) {
            fprintf(stderr, "  %s \"%s\": %s\n", rel, cap, lie);
        }
        lies += lie != NULL;
        mmp_image_fini(&img);
    }
    CHECK(bad_shapes == 0);
    CHECK(bad_images == 0);
    CHECK(lies == 0);

    /* The oracle is not blind: a wrong colour, size or relation is caught. */
    int mutated = 0, caught = 0;
    for (int i = 0; i < 64; i++) {
        snprintf(img_path, sizeof img_path, "%s/%.31s", dir, val_img[i]);
        mmp_image img;
        if (mmp_png_read(img_path, &img) != MMP_OK) {
            continue;
        }
        static const char *const swaps[][2] = {
            {" red ", " green "},        {" green ", " blue "},   {" blue ", " yellow "},
            {" yellow ", " purple "},    {" purple ", " white "}, {" white ", " red "},
            {"a small", "a large"},      {"a large", "a small"},  {" left of ", " right of "},
            {" right of ", " left of "}, {" above ", " below "},  {" below ", " above "}};
        for (size_t k = 0; k < sizeof swaps / sizeof swaps[0]; k++) {
            const char *hit = strstr(val[i], swaps[k][0]);
            if (!hit) {
                continue;
            }
            char wrong[2 * MMP_SYNTH_CAPTION_MAX];
            snprintf(wrong, sizeof wrong, "%.*s%s%s", (int)(hit - val[i]), val[i], swaps[k][1],
                     hit + strlen(swaps[k][0]));
            mutated++;
            caught += caption_lie(img.rgb, 32, wrong) != NULL;
        }
        mmp_image_fini(&img);
    }
    CHECK(mutated > 100 && caught == mutated);
    CHECK(counts[1] > 0 && counts[2] > 0 && counts[3] > 0);

    /* Variety: under 5% of the 256 val samples share their caption. */
    static char sorted[256][MMP_SYNTH_CAPTION_MAX];
    memcpy(sorted, val, sizeof sorted);
    qsort(sorted, 256, sizeof sorted[0], cmp_caption);
    int shared = 0;
    for (int i = 0; i < 256; i++) {
        shared += (i > 0 && strcmp(sorted[i], sorted[i - 1]) == 0) ||
                  (i < 255 && strcmp(sorted[i], sorted[i + 1]) == 0);
    }
    fprintf(stderr, "  synth val: %d/256 samples (%.1f%%) share a caption\n", shared,
            100.0 * shared / 256);
    CHECK(shared < 256 * 5 / 100);

    /* The vocab covers every caption word: no [UNK] anywhere. */
    mmp_tokenizer *tok = NULL;
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    CHECK_OK(mmp_tokenizer_load(&tok, path));
    if (tok) {
        mmp_special_ids sp = mmp_tokenizer_specials(tok);
        CHECK(sp.pad == 0 && sp.unk == 1 && sp.cls == 2 && sp.sep == 3 && sp.mask == 4);
        CHECK(mmp_tokenizer_id(tok, ",", 1) >= 0 && mmp_tokenizer_id(tok, "ring", 4) >= 0);
        int unk = 0, longest = 0;
        int32_t ids[64];
        for (int i = 0; i < n_train; i++) {
            int n_real = 0, n_unk = 0;
            mmp_tokenizer_encode(tok, train[i], 64, ids, NULL, &n_real, &n_unk);
            unk += n_unk;
            longest = n_real > longest ? n_real : longest;
        }
        CHECK(unk == 0);
        CHECK(longest <= 24); /* fits the demo plan's max_text_len */
    }
    mmp_tokenizer_destroy(tok);
}

MMP_TEST_LIST("test_synth", MMP_TEST_CASE(test_synth_determinism),
              MMP_TEST_CASE(test_synth_content))
