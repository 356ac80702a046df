/* The data path: PNG, the tokenizer, manifests, the dataset, and (when the
 * mmpipe binary is built) `mmpipe data` (the synthetic set: test_synth.c).
 *
 * Fixtures live in tests/data/manifests/ (run from the repository root);
 * everything written goes to mmp_test_tmpdir(). */
#include <spng.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/err.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/manifest.h"
#include "data/png.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "tests/harness.h"

#define FIXTURES "tests/data/manifests"

/* ---- small helpers ------------------------------------------------------------ */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int contains(const char *haystack, const char *needle)
{
    int ok = strstr(haystack, needle) != NULL;
    if (!ok) {
        fprintf(stderr, "  expected \"%s\" in \"%s\"\n", needle, haystack);
    }
    return ok;
}

/* A plan with only what the dataset reads filled in. */
static void tiny_plan(mmp_plan *p, int image_size, int max_text_len)
{
    memset(p, 0, sizeof *p);
    p->job.seed = 1;
    p->data.image_size = image_size;
    p->data.max_text_len = max_text_len;
    const float mean[3] = {0.5f, 0.25f, 0.0f}, std[3] = {0.5f, 0.25f, 2.0f};
    memcpy(p->data.mean, mean, sizeof mean);
    memcpy(p->data.std, std, sizeof std);
}

/* Encodes raw pixels of any PNG colour type with libspng directly. */
static void *encode_raw(int color_type, int bit_depth, const void *px, size_t n, int w, int h,
                        const struct spng_plte *plte, size_t *len)
{
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {.width = (uint32_t)w,
                           .height = (uint32_t)h,
                           .bit_depth = (uint8_t)bit_depth,
                           .color_type = (uint8_t)color_type};
    spng_set_ihdr(c, &ih);
    if (plte) {
        spng_set_plte(c, (struct spng_plte *)plte);
    }
    int rc = spng_encode_image(c, px, n, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    int err = 0;
    void *buf = rc == 0 ? spng_get_png_buffer(c, len, &err) : NULL;
    spng_ctx_free(c);
    return buf;
}

/* ---- PNG ---------------------------------------------------------------------- */

static void test_png(void)
{
    const char *dir = mmp_test_tmpdir("data_png");
    char path[1024];
    enum { W = 7, H = 5 };
    uint8_t px[W * H * 3];
    for (int i = 0; i < W * H * 3; i++) {
        px[i] = (uint8_t)(i * 37 + 11);
    }
    snprintf(path, sizeof path, "%s/a.png", dir);
    CHECK_OK(mmp_png_write(path, px, W, H));
    mmp_image img;
    CHECK_OK(mmp_png_read(path, &img));
    CHECK(img.width == W && img.height == H);
    CHECK(img.rgb && memcmp(img.rgb, px, sizeof px) == 0);
    mmp_image_fini(&img);
    mmp_image_fini(&img); /* idempotent */

    /* Other colour types and depths come back as RGB8. */
    size_t len = 0;
    const uint8_t gray[4] = {0, 100, 200, 255};
    void *buf = encode_raw(SPNG_COLOR_TYPE_GRAYSCALE, 8, gray, 4, 2, 2, NULL, &len);
    CHECK_OK(mmp_png_decode("gray", buf, len, 0, &img));
    CHECK(img.rgb && img.rgb[3] == 100 && img.rgb[4] == 100 && img.rgb[5] == 100);
    mmp_image_fini(&img);
    free(buf);

    const uint16_t gray16[4] = {0, 0xffff, 0x8080, 0x0101};
    buf = encode_raw(SPNG_COLOR_TYPE_GRAYSCALE, 16, gray16, 8, 2, 2, NULL, &len);
    CHECK_OK(mmp_png_decode("gray16", buf, len, 0, &img));
    CHECK(img.rgb && img.rgb[3] == 255 && img.rgb[6] == 128 && img.rgb[9] == 1);
    mmp_image_fini(&img);
    free(buf);

    struct spng_plte plte = {.n_entries = 2};
    plte.entries[0] = (struct spng_plte_entry){.red = 10, .green = 20, .blue = 30};
    plte.entries[1] = (struct spng_plte_entry){.red = 0, .green = 200, .blue = 7};
    const uint8_t indices[2] = {0x40, 0x80}; /* 1 bit per pixel: rows 01, 10 */
    buf = encode_raw(SPNG_COLOR_TYPE_INDEXED, 1, indices, 2, 2, 2, &plte, &len);
    CHECK_OK(mmp_png_decode("palette", buf, len, 0, &img));
    CHECK(img.rgb && img.rgb[0] == 10 && img.rgb[1] == 20 && img.rgb[2] == 30);
    CHECK(img.rgb && img.rgb[3] == 0 && img.rgb[4] == 200 && img.rgb[5] == 7);
    mmp_image_fini(&img);
    free(buf);

    const uint8_t rgba[16] = {1, 2, 3, 0, 4, 5, 6, 255, 7, 8, 9, 100, 10, 11, 12, 13};
    buf = encode_raw(SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8, rgba, 16, 2, 2, NULL, &len);
    CHECK_OK(mmp_png_decode("rgba", buf, len, 0, &img));
    CHECK(img.rgb && img.rgb[0] == 1 && img.rgb[3] == 4 && img.rgb[11] == 12); /* alpha dropped */
    mmp_image_fini(&img);

    /* Errors say what is wrong. */
    CHECK(mmp_png_decode("cut", buf, len / 2, 0, &img) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "cut: truncated PNG"));
    CHECK(img.rgb == NULL);
    free(buf);
    CHECK(mmp_png_decode("nothing", "", 0, 0, &img) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "nothing: empty file"));
    snprintf(path, sizeof path, "%s/text.png", dir);
    write_text(path, "hello, I am not an image\n");
    CHECK(mmp_png_read(path, &img) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "text.png: not a PNG"));
    snprintf(path, sizeof path, "%s/empty.png", dir);
    write_text(path, "");
    CHECK(mmp_png_read(path, &img) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "empty.png: empty file (0 bytes)"));
    snprintf(path, sizeof path, "%s/absent.png", dir);
    CHECK(mmp_png_read(path, &img) == MMP_ERR_IO);
    CHECK(contains(mmp_last_error(), "absent.png: No such file"));
    CHECK(mmp_png_write(path, px, 0, 3) == MMP_ERR_INVALID);
}

/* ---- tokenizer ------------------------------------------------------------------ */

static const char *const VOCAB[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]",  "[MASK]", "hello",
                                    "world", "un",    "##aff", "##able", ",",      ".",
                                    "!",     "a",     "##a",   "cafe",   "x"};
enum {
    V_PAD,
    V_UNK,
    V_CLS,
    V_SEP,
    V_MASK,
    V_HELLO,
    V_WORLD,
    V_UN,
    V_AFF,
    V_ABLE,
    V_COMMA,
    V_DOT,
    V_BANG,
    V_A,
    V_HASH_A,
    V_CAFE,
    V_X
};

static int ids_are(const int32_t *ids, int n, const int32_t *want, int n_want)
{
    int ok = n == n_want && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;
    if (!ok) {
        fprintf(stderr, "  got:");
        for (int i = 0; i < n; i++) {
            fprintf(stderr, " %d", ids[i]);
        }
        fprintf(stderr, "\n  want:");
        for (int i = 0; i < n_want; i++) {
            fprintf(stderr, " %d", want[i]);
        }
        fprintf(stderr, "\n");
    }
    return ok;
}

#define ENCODES(tok, text, ...)                                                                    \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        int32_t got_[128];                                                                         \
        int n_ = 0;                                                                                \
        CHECK_OK(mmp_tokenizer_encode(tok, text, 128, got_, NULL, &n_, NULL));                     \
        CHECK(ids_are(got_, n_, want_, (int)(sizeof want_ / sizeof want_[0])));                    \
    } while (0)

static void test_tokenizer(void)
{
    const char *dir = mmp_test_tmpdir("data_tokenizer");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "w");
    for (size_t i = 0; i < sizeof VOCAB / sizeof VOCAB[0]; i++) {
        fprintf(f, "%s%s", VOCAB[i], i == 3 ? "\r\n" : "\n"); /* a CRLF line is fine */
    }
    fclose(f);
    mmp_tokenizer *t = NULL;
    CHECK_OK(mmp_tokenizer_load(&t, path));
    if (!t) {
        return;
    }
    CHECK(mmp_tokenizer_vocab_size(t) == (int)(sizeof VOCAB / sizeof VOCAB[0]));
    CHECK(mmp_tokenizer_id(t, "[SEP]", 5) == V_SEP);
    CHECK(mmp_tokenizer_id(t, "nope", 4) == -1);
    CHECK(strcmp(mmp_tokenizer_token(t, V_AFF), "##aff") == 0);
    CHECK(mmp_tokenizer_token(t, 999) == NULL);

    ENCODES(t, "Hello, WORLD!", V_CLS, V_HELLO, V_COMMA, V_WORLD, V_BANG, V_SEP);
    ENCODES(t, "  hello\tworld\n", V_CLS, V_HELLO, V_WORLD, V_SEP);
    ENCODES(t, "unaffable", V_CLS, V_UN, V_AFF, V_ABLE, V_SEP);
    ENCODES(t, "UnAffAble.", V_CLS, V_UN, V_AFF, V_ABLE, V_DOT, V_SEP);
    ENCODES(t, "unx hello", V_CLS, V_UNK, V_HELLO, V_SEP); /* no ##x: the whole word is [UNK] */
    ENCODES(t, "xa", V_CLS, V_X, V_HASH_A, V_SEP);
    ENCODES(t, "zebra", V_CLS, V_UNK, V_SEP);
    ENCODES(t, "hel\x01lo", V_CLS, V_HELLO, V_SEP); /* control characters are dropped */
    ENCODES(t, "café", V_CLS, V_CAFE, V_SEP);       /* accents are stripped (NFD, drop Mn) */
    ENCODES(t, "caf\xc3", V_CLS, V_UNK, V_SEP);     /* never split inside a character */
    ENCODES(t, "", V_CLS, V_SEP);
    ENCODES(t, "[MASK]", V_CLS, V_MASK, V_SEP); /* a special token written exactly is itself */
    ENCODES(t, "[mask]", V_CLS, V_UNK, V_UNK, V_UNK, V_SEP); /* "[", "mask", "]": not in vocab */

    /* Words of up to 100 characters are segmented; longer ones are [UNK]. */
    char word[200];
    memset(word, 'a', 100);
    word[100] = 0;
    int32_t ids[128];
    float mask[128];
    int n_real = 0, n_unk = 0;
    CHECK_OK(mmp_tokenizer_encode(t, word, 128, ids, NULL, &n_real, &n_unk));
    CHECK(n_real == 102 && ids[1] == V_A && ids[2] == V_HASH_A && ids[100] == V_HASH_A);
    CHECK(ids[101] == V_SEP && n_unk == 0);
    memset(word, 'a', 101);
    word[101] = 0;
    ENCODES(t, word, V_CLS, V_UNK, V_SEP);

    /* Truncation keeps [SEP]; padding is [PAD] with mask 0. */
    CHECK_OK(mmp_tokenizer_encode(t, "hello world hello world", 4, ids, mask, &n_real, NULL));
    const int32_t trunc[4] = {V_CLS, V_HELLO, V_WORLD, V_SEP};
    CHECK(ids_are(ids, 4, trunc, 4) && n_real == 4);
    CHECK(mask[0] == 1 && mask[3] == 1);
    CHECK_OK(mmp_tokenizer_encode(t, "Hello", 6, ids, mask, &n_real, NULL));
    const int32_t padded[6] = {V_CLS, V_HELLO, V_SEP, V_PAD, V_PAD, V_PAD};
    const float padded_mask[6] = {1, 1, 1, 0, 0, 0};
    CHECK(ids_are(ids, 6, padded, 6) && n_real == 3);
    CHECK(memcmp(mask, padded_mask, sizeof padded_mask) == 0);
    CHECK_OK(mmp_tokenizer_encode(t, "hello", 2, ids, mask, &n_real, NULL));
    CHECK(ids[0] == V_CLS && ids[1] == V_SEP && n_real == 2);
    CHECK(mmp_tokenizer_encode(t, "hello", 1, ids, mask, &n_real, NULL) == MMP_ERR_INVALID);
    mmp_tokenizer_destroy(t);
    mmp_tokenizer_destroy(NULL);

    /* Bad vocabs name the line. */
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n", "vocab_bad.txt:3: empty line"},
        {"[PAD]\nab\xff\n[UNK]\n[CLS]\n[SEP]\n", "vocab_bad.txt:2: invalid UTF-8"},
        {"[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nhello\n", "vocab_bad.txt:6: duplicate token 'hello'"},
        {"[PAD]\n[CLS]\n[SEP]\n", "vocab_bad.txt: no [UNK] token"},
        {"", "vocab_bad.txt: empty vocab"},
    };
    snprintf(path, sizeof path, "%s/vocab_bad.txt", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        mmp_tokenizer *b = NULL;
        CHECK(mmp_tokenizer_load(&b, path) == MMP_ERR_DATA);
        CHECK(b == NULL);
        CHECK(contains(mmp_last_error(), bad[i].want));
    }
    /* A last line without '\n' is a token. */
    write_text(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]");
    CHECK_OK(mmp_tokenizer_load(&t, path));
    CHECK(t && mmp_tokenizer_vocab_size(t) == 4);
    mmp_tokenizer_destroy(t);
    snprintf(path, sizeof path, "%s/absent.txt", dir);
    CHECK(mmp_tokenizer_load(&t, path) == MMP_ERR_IO);
}

/* ---- manifests ------------------------------------------------------------------ */

static void parses(const char *line, const char *image, const char *text, const char *id)
{
    mmp_manifest_entry e;
    mmp_err err = mmp_manifest_parse_line(line, strlen(line), &e);
    CHECK_OK(err);
    if (err != MMP_OK) {
        fprintf(stderr, "  line: %s\n", line);
        return;
    }
    CHECK(strcmp(e.image, image) == 0);
    CHECK(strcmp(e.text, text) == 0);
    CHECK(id ? e.id && strcmp(e.id, id) == 0 : e.id == NULL);
    mmp_manifest_entry_fini(&e);
}

static void rejects(const char *line, const char *why)
{
    mmp_manifest_entry e;
    CHECK(mmp_manifest_parse_line(line, strlen(line), &e) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), why));
    CHECK(e.image == NULL && e.storage == NULL);
}

static void test_manifest_lines(void)
{
    parses("{\"image\": \"a.png\", \"text\": \"hi\"}", "a.png", "hi", NULL);
    parses("{\"text\":\"x\",\"image\":\"b\",\"id\":-12.5e3}", "b", "x", "-12.5e3");
    parses("{\"image\": \"\\u00e9\\u4e2d\", \"text\": \"\\ud83d\\ude00 \\\"q\\\" \\\\ \\/ \\t\"}",
           "\xc3\xa9\xe4\xb8\xad", "\xf0\x9f\x98\x80 \"q\" \\ / \t", NULL);
    parses("{\"a\": [1, {\"b\": [null, true, false, \"\\n\"]}, -0.0], \"image\": \"i\", "
           "\"text\": \"t\", \"id\": \"s1\", \"z\": {}}",
           "i", "t", "s1");
    parses("  {\"image\": \"i\", \"text\": \"caf\xc3\xa9\"}  ", "i", "caf\xc3\xa9", NULL);
    parses("{\"im\\u0061ge\": \"i\", \"text\": \"escaped key\"}", "i", "escaped key", NULL);

    rejects("[1, 2]", "not a JSON object");
    rejects("{\"image\": \"a\" \"text\": \"b\"}", "not valid JSON at column 15: expected ','");
    rejects("{\"image\" \"a\"}", "not valid JSON at column 10: expected ':' after a key");
    rejects("{\"image\": \"a\", \"text\": \"b\"", "not valid JSON at the end of the line");
    rejects("{\"image\": \"a\", \"text\": \"b}", "unterminated string");
    rejects("{\"image\": \"a\", \"text\": \"b\"} x", "unexpected data after the object");
    rejects("{\"image\": \"a\", \"text\": \"\\x\"}", "unknown escape '\\x'");
    rejects("{\"image\": \"a\", \"text\": \"\\ud800\"}", "high surrogate without a low one");
    rejects("{\"image\": \"a\", \"text\": \"\\udc00\"}", "low surrogate without a high one");
    rejects("{\"image\": \"a\", \"text\": \"\\u12\"}", "four hex digits");
    rejects("{\"image\": \"a\", \"text\": \"\xff\"}", "invalid UTF-8");
    rejects("{\"image\": \"a\", \"text\": \"tab\there\"}", "control character 0x09");
    rejects("{\"image\": \"a\", \"text\": 01}", "expected ',' or '}'");
    rejects("{\"image\": \"a\", \"text\": 1.}", "digits after '.'");
    rejects("{\"image\": \"a\", \"text\": tru}", "expected a value, found 't'");
    rejects("{\"image\": \"a\", \"text\": \"b\",}", "expected a quoted key");
    rejects("{\"image\": \"a\"}", "missing field \"text\"");
    rejects("{\"text\": \"a\"}", "missing field \"image\"");
    rejects("{\"image\": 5, \"text\": \"a\"}", "expected a string for \"image\"");
    rejects("{\"image\": \"a\", \"text\": [\"a\"]}", "expected a string for \"text\"");
    rejects("{\"image\": \"a\", \"text\": \"b\", \"id\": null}", "string or a number for \"id\"");
    rejects("{\"image\": \"a\", \"image\": \"b\", \"text\": \"c\"}", "duplicate field \"image\"");
    rejects("{\"image\": \"\", \"text\": \"c\"}", "empty image path");
    rejects("{\"image\": \"a\", \"text\": \" \\t \"}", "empty caption");
    rejects("{\"image\": \"a\\u0000b\", \"text\": \"c\"}", "NUL character");

    char deep[200] = "{\"x\": ";
    size_t at = strlen(deep);
    memset(deep + at, '[', 100);
    deep[at + 100] = 0;
    rejects(deep, "nested deeper than 64");

    char out[64];
    CHECK_OK(mmp_manifest_resolve("data/set/train.jsonl", "images/1.png", out, sizeof out));
    CHECK(strcmp(out, "data/set/images/1.png") == 0);
    CHECK_OK(mmp_manifest_resolve("train.jsonl", "images/1.png", out, sizeof out));
    CHECK(strcmp(out, "images/1.png") == 0);
    CHECK_OK(mmp_manifest_resolve("data/train.jsonl", "/abs/1.png", out, sizeof out));
    CHECK(strcmp(out, "/abs/1.png") == 0);
    CHECK(mmp_manifest_resolve("d/t.jsonl", "x", out, 3) == MMP_ERR_INVALID);
}

typedef struct problems {
    int n;
    int64_t lines[32];
    int good;
} problems;

static mmp_err collect(void *user, const mmp_manifest_entry *e, const char *problem)
{
    problems *p = user;
    if (problem) {
        if (p->n < 32) {
            p->lines[p->n++] = e->line;
        }
        CHECK(e->image == NULL && e->text == NULL);
    } else {
        p->good++;
        CHECK(e->image && e->text);
    }
    return MMP_OK;
}

static void open_fails(const char *file, const char *want)
{
    char path[256];
    snprintf(path, sizeof path, FIXTURES "/%s", file);
    mmp_manifest *m = NULL;
    CHECK(mmp_manifest_open(&m, path, NULL, NULL) == MMP_ERR_DATA);
    CHECK(m == NULL);
    CHECK(contains(mmp_last_error(), want));
}

static void test_manifest_files(void)
{
    open_fails("bad_json.jsonl",
               FIXTURES "/bad_json.jsonl:3: not valid JSON at column 20: expected ','");
    open_fails("missing_text.jsonl", FIXTURES "/missing_text.jsonl:2: missing field \"text\"");
    open_fails("nonstring_image.jsonl",
               FIXTURES "/nonstring_image.jsonl:4: expected a string for \"image\"");
    open_fails("empty_caption.jsonl", FIXTURES "/empty_caption.jsonl:2: empty caption");

    /* The good fixture: blank lines skipped, line numbers kept, order kept. */
    mmp_manifest *m = NULL;
    CHECK_OK(mmp_manifest_open(&m, FIXTURES "/good.jsonl", NULL, NULL));
    if (m) {
        CHECK(mmp_manifest_size(m) == 4);
        CHECK(mmp_manifest_line(m, 0) == 1 && mmp_manifest_line(m, 2) == 4);
        CHECK(mmp_manifest_line(m, 3) == 5);
        mmp_manifest_entry e;
        CHECK_OK(mmp_manifest_read(m, 1, &e));
        CHECK(e.line == 2 && strcmp(e.id, "s-2") == 0 && strcmp(e.image, "px.png") == 0);
        CHECK(strcmp(e.text, "caf\xc3\xa9 \"quoted\" \\ back/slash \xf0\x9f\x98\x80") == 0);
        mmp_manifest_entry_fini(&e);
        CHECK_OK(mmp_manifest_read(m, 2, &e));
        CHECK(e.line == 4 && strcmp(e.id, "17") == 0);
        mmp_manifest_entry_fini(&e);
        CHECK(mmp_manifest_read(m, 4, &e) == MMP_ERR_INVALID);
    }
    mmp_manifest_close(m);
    mmp_manifest_close(NULL);

    /* A scan reports every bad line, with its number. */
    problems p = {0};
    CHECK_OK(mmp_manifest_scan(FIXTURES "/many_problems.jsonl", collect, &p));
    const int64_t want[] = {2, 4, 5, 6, 8, 9, 10}; /* JSON-level problems; 11, 13 are images */
    CHECK(p.n == 7 && memcmp(p.lines, want, sizeof want) == 0);
    CHECK(p.good == 6);

    const char *dir = mmp_test_tmpdir("data_manifest");
    char path[1024];
    snprintf(path, sizeof path, "%s/empty.jsonl", dir);
    write_text(path, "\n  \n");
    CHECK(mmp_manifest_open(&m, path, NULL, NULL) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "no samples"));
    snprintf(path, sizeof path, "%s/bom.jsonl", dir);
    write_text(path,
               "\xef\xbb\xbf{\"image\": \"i\", \"text\": \"t\"}\r\n{\"image\": \"j\", \"text\": "
               "\"u\"}");
    CHECK_OK(mmp_manifest_open(&m, path, NULL, NULL));
    if (m) {
        mmp_manifest_entry e;
        CHECK(mmp_manifest_size(m) == 2);
        CHECK_OK(mmp_manifest_read(m, 1, &e));
        CHECK(e.image && strcmp(e.image, "j") == 0);
        mmp_manifest_entry_fini(&e);
        CHECK_OK(mmp_manifest_read(m, 0, &e));
        CHECK(e.image && strcmp(e.image, "i") == 0);
        mmp_manifest_entry_fini(&e);
    }
    mmp_manifest_close(m);
    snprintf(path, sizeof path, "%s/absent.jsonl", dir);
    CHECK(mmp_manifest_open(&m, path, NULL, NULL) == MMP_ERR_IO);
}

/* ---- dataset ---------------------------------------------------------------------- */

static void test_dataset(void)
{
    char dir[1024], path[1200], manifest[1200], vocab[1200];
    snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("data_dataset"));
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    write_text(vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nred\ndot\n.\n");

    /* 2x2 exact size and 4x4 (resized to 2x2). */
    const uint8_t px2[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255};
    snprintf(path, sizeof path, "%s/two.png", dir);
    CHECK_OK(mmp_png_write(path, px2, 2, 2));
    uint8_t px4[4 * 4 * 3];
    for (int y = 0; y < 4; y++) {
        for (int x = 0; x < 4; x++) {
            for (int c = 0; c < 3; c++) {
                px4[(y * 4 + x) * 3 + c] = (uint8_t)(y * 40 + x * 10 + c);
            }
        }
    }
    snprintf(path, sizeof path, "%s/four.png", dir);
    CHECK_OK(mmp_png_write(path, px4, 4, 4));

    snprintf(manifest, sizeof manifest, "%s/m.jsonl", dir);
    FILE *f = fopen(manifest, "w");
    fprintf(f, "{\"image\": \"two.png\", \"text\": \"A red dot.\"}\n");
    fprintf(f, "{\"image\": \"four.png\", \"text\": \"a blue dot\"}\n");
    for (int i = 2; i < 37; i++) {
        fprintf(f, "{\"image\": \"two.png\", \"text\": \"dot %d\"}\n", i);
    }
    fclose(f);

    mmp_plan plan;
    tiny_plan(&plan, 2, 6);
    mmp_dataset *d = NULL;
    CHECK_OK(mmp_dataset_open(&d, manifest, vocab, &plan));
    if (!d) {
        return;
    }
    CHECK(mmp_dataset_size(d) == 37);
    CHECK(mmp_dataset_vocab_size(d) == 9);

    float images[2 * 3 * 4];
    int32_t ids[2 * 6];
    float mask[2 * 6];
    const int64_t samples[2] = {0, 1};
    CHECK_OK(mmp_dataset_load(d, samples, 2, images, ids, mask));
    /* NCHW, (x/255 - mean)/std with mean {.5,.25,0}, std {.5,.25,2}. */
    float want[2 * 3 * 4];
    for (int p = 0; p < 4; p++) {
        for (int c = 0; c < 3; c++) {
            float x = px2[p * 3 + c] / 255.0f;
            want[c * 4 + p] = (x - plan.data.mean[c]) / plan.data.std[c];
        }
    }
    /* The 4x4 image is resized to 2x2 by data/image.c (PIL's bilinear, tested
     * against PIL in test_image): the dataset must give exactly that. */
    mmp_image_prep prep = {.size = 2, .augment = 0};
    for (int c = 0; c < 3; c++) {
        prep.mean[c] = plan.data.mean[c];
        prep.std[c] = plan.data.std[c];
    }
    char four[1200];
    snprintf(four, sizeof four, "%s/four.png", dir);
    CHECK_OK(mmp_image_load(four, &prep, NULL, want + 12));
    CHECK_CLOSE("images", images, want, 24, 1e-6, 1e-5);
    CHECK(images[0] == 1.0f && images[4] == -1.0f && images[8] == 0.0f); /* red pixel, exact */
    const int32_t want_ids[12] = {2, 5, 6, 7, 8, 3, 2, 5, 1, 7, 3, 0};
    const float want_mask[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    CHECK(ids_are(ids, 12, want_ids, 12));
    CHECK(memcmp(mask, want_mask, sizeof want_mask) == 0);

    /* Order: a permutation per epoch, another one the next epoch, the
     * identity without shuffle, a pure function of (seed, k). */
    const int64_t n = mmp_dataset_size(d);
    int perm_ok = 1, differs = 0, identity = 1, pure = 1, seeds_differ = 0;
    for (int epoch = 0; epoch < 4; epoch++) {
        int seen[37] = {0};
        for (int64_t i = 0; i < n; i++) {
            int64_t k = epoch * n + i;
            int64_t s = mmp_dataset_sample_at(d, 42, k, 1);
            if (s < 0 || s >= n) {
                perm_ok = 0;
                continue;
            }
            seen[s]++;
            differs += epoch > 0 && s != mmp_dataset_sample_at(d, 42, k - n, 1);
            identity &= mmp_dataset_sample_at(d, 42, k, 0) == i;
            pure &= s == mmp_dataset_sample_at(d, 42, k, 1);
            seeds_differ += s != mmp_dataset_sample_at(d, 43, k, 1);
        }
        for (int i = 0; i < 37; i++) {
            perm_ok &= seen[i] == 1;
        }
    }
    CHECK(perm_ok && identity && pure);
    CHECK(differs > 3 * 37 / 2);
    CHECK(seeds_differ > 4 * 37 / 2);

    /* Load errors name manifest:line; a bad index is refused. */
    const int64_t out_of_range = 37;
    CHECK(mmp_dataset_load(d, &out_of_range, 1, images, ids, mask) == MMP_ERR_INVALID);
    snprintf(path, sizeof path, "%s/four.png", dir);
    write_text(path, "not a png any more");
    CHECK(mmp_dataset_load(d, samples, 2, images, ids, mask) == MMP_ERR_DATA);
    char want_err[2600];
    snprintf(want_err, sizeof want_err, "%s:2: %s/four.png: not a PNG", manifest, dir);
    CHECK(contains(mmp_last_error(), want_err));
    mmp_dataset_close(d);
    mmp_dataset_close(NULL);

    /* Open checks that images exist; vocab defaults to vocab.txt beside. */
    d = NULL;
    CHECK(mmp_dataset_open(&d, FIXTURES "/missing_image.jsonl", vocab, &plan) == MMP_ERR_DATA);
    CHECK(d == NULL);
    CHECK(contains(mmp_last_error(), FIXTURES "/missing_image.jsonl:3: missing image " FIXTURES
                                              "/no_such_image.png"));
    CHECK(mmp_dataset_open(&d, FIXTURES "/bad_json.jsonl", vocab, &plan) == MMP_ERR_DATA);
    CHECK(contains(mmp_last_error(), "bad_json.jsonl:3: not valid JSON"));
    snprintf(path, sizeof path, "%s/absent/m.jsonl", dir);
    CHECK(mmp_dataset_open(&d, path, NULL, &plan) == MMP_ERR_IO);
    CHECK(contains(mmp_last_error(), "absent/m.jsonl: No such file")); /* not the vocab */
    CHECK_OK(mmp_dataset_open(&d, manifest, NULL, &plan));
    CHECK(d && mmp_dataset_vocab_size(d) == 9);
    mmp_dataset_close(d);
    d = NULL;
    plan.data.std[1] = 0;
    CHECK(mmp_dataset_open(&d, manifest, vocab, &plan) == MMP_ERR_INVALID);
    tiny_plan(&plan, 2, 1);
    CHECK(mmp_dataset_open(&d, manifest, vocab, &plan) == MMP_ERR_INVALID);
}

/* Shuffling a set whose size is not a power of two, and a large one. */
static void test_order_sizes(void)
{
    char dir[1024], manifest[1200], vocab[1200], path[1200];
    snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("data_order"));
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    write_text(vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
    const uint8_t px[3] = {1, 2, 3};
    snprintf(path, sizeof path, "%s/p.png", dir);
    CHECK_OK(mmp_png_write(path, px, 1, 1));
    static const int sizes[] = {1, 2, 3, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        snprintf(manifest, sizeof manifest, "%s/m%d.jsonl", dir, n);
        FILE *f = fopen(manifest, "w");
        for (int i = 0; i < n; i++) {
            fprintf(f, "{\"image\": \"p.png\", \"text\": \"x\"}\n");
        }
        fclose(f);
        mmp_plan plan;
        tiny_plan(&plan, 1, 4);
        mmp_dataset *d = NULL;
        CHECK_OK(mmp_dataset_open(&d, manifest, vocab, &plan));
        if (!d) {
            continue;
        }
        char *seen = calloc((size_t)n, 1);
        int ok = 1;
        for (int64_t k = 5 * n; k < 6 * n; k++) {
            int64_t i = mmp_dataset_sample_at(d, 9, k, 1);
            ok &= i >= 0 && i < n && !seen[i];
            if (i >= 0 && i < n) {
                seen[i] = 1;
            }
        }
        CHECK(ok);
        free(seen);
        mmp_dataset_close(d);
    }
}

/* ---- the CLI ---------------------------------------------------------------------- */

static void test_cli(void)
{
    const char *bin = mmp_test_bin();
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "  (no %s: CLI checks not run)\n", bin);
        return;
    }
    char dir[1024], cmd[4096];
    static char out[1 << 16];
    snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("data_cli"));

    snprintf(cmd, sizeof cmd, "%s data synth --out %s/set --samples 64 --seed 3", bin, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
    CHECK(contains(out, "64 train + 8 val samples"));

    snprintf(cmd, sizeof cmd, "%s data check %s/set/train.jsonl --vocab %s/set/vocab.txt --decode",
             bin, dir, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
    CHECK(contains(out, "64 non-blank lines, 0 problems; 64 good samples; images 32x32"));
    CHECK(contains(out, "0 with [UNK]"));

    /* The pixel limit: every 32x32 image is over 1000 pixels, each reported
     * by file with the key to raise; a kind of its own in the summary. */
    snprintf(cmd, sizeof cmd, "%s data check %s/set/train.jsonl --decode --max-pixels 1000", bin,
             dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    CHECK(contains(out, "/set/images/000000.png: 32x32 image has 1024 pixels, more than the "
                        "limit of 1000 (data.max_image_pixels)"));
    CHECK(
        contains(out, "64 non-blank lines, 64 problems (by kind: 64 image over the pixel limit)"));
    snprintf(cmd, sizeof cmd, "%s data check %s/set/train.jsonl --decode --max-pixels 0", bin, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);

    /* Every format a user brings decodes (tests/test_formats.c checks the
     * pixels against PIL). */
    char cwd[512], manifest[1100];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    snprintf(manifest, sizeof manifest, "%s/formats.jsonl", dir);
    FILE *mf = fopen(manifest, "w");
    CHECK(mf != NULL);
    if (mf) {
        const char *files[] = {"cmyk_40x30.jpg", "ycck_37x29.jpg", "anim_24x18.gif",
                               "lossy_alpha_30x22.webp", "gray16_19x13.png"};
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            fprintf(mf, "{\"image\": \"%s/tests/image/formats/%s\", \"text\": \"a picture\"}\n",
                    cwd, files[i]);
        }
        fclose(mf);
    }
    snprintf(cmd, sizeof cmd, "%s data check %s --decode", bin, manifest);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
    CHECK(contains(out, "5 non-blank lines, 0 problems; 5 good samples"));

    snprintf(cmd, sizeof cmd, "%s data check " FIXTURES "/many_problems.jsonl --decode", bin);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    static const char *const lines[] = {
        ":2: ",  ":4: ",
        ":5: ",  ":6: ",
        ":8: ",  ":9: ",
        ":10: ", ":11: missing image " FIXTURES "/missing.png (No such file",
        ":13: ", "13 non-blank lines, 9 problems"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        CHECK(contains(out, lines[i]));
    }
    CHECK(contains(out, "not_a_png.png: not a PNG, JPEG, GIF or WebP image"));

    snprintf(cmd, sizeof cmd,
             "printf 'a red circle\\nZzz, ring.\\n' | %s data tokenize --vocab %s/set/vocab.txt "
             "--max-len 7",
             bin, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
    mmp_tokenizer *t = NULL;
    snprintf(cmd, sizeof cmd, "%s/set/vocab.txt", dir);
    CHECK_OK(mmp_tokenizer_load(&t, cmd));
    if (t) {
        char want[256];
        snprintf(want, sizeof want, "2 %d %d %d 3 0 0\n2 1 %d %d %d 3 0\n",
                 mmp_tokenizer_id(t, "a", 1), mmp_tokenizer_id(t, "red", 3),
                 mmp_tokenizer_id(t, "circle", 6), mmp_tokenizer_id(t, ",", 1),
                 mmp_tokenizer_id(t, "ring", 4), mmp_tokenizer_id(t, ".", 1));
        CHECK(strcmp(out, want) == 0);
        if (strcmp(out, want) != 0) {
            fprintf(stderr, "  got:\n%s  want:\n%s", out, want);
        }
    }
    mmp_tokenizer_destroy(t);

    snprintf(cmd, sizeof cmd, "%s data synth --samples 10", bin);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);
    CHECK(contains(out, "--out DIR is required"));
    snprintf(cmd, sizeof cmd, "%s data synth --out %s/x --samples ten", bin, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "%s data tokenize --vocab", bin);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "%s data frobnicate", bin);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "%s data check %s/absent.jsonl", bin, dir);
    CHECK(mmp_test_run(cmd, out, sizeof out) == 1);
    CHECK(contains(out, "absent.jsonl: No such file"));
    static const char *const helps[] = {"", " synth", " tokenize", " check"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s data%s --help", bin, helps[i]);
        CHECK(mmp_test_run(cmd, out, sizeof out) == 0);
        CHECK(contains(out, "usage: mmpipe data"));
    }
}

MMP_TEST_LIST("test_data", MMP_TEST_CASE(test_png), MMP_TEST_CASE(test_tokenizer),
              MMP_TEST_CASE(test_manifest_lines), MMP_TEST_CASE(test_manifest_files),
              MMP_TEST_CASE(test_dataset), MMP_TEST_CASE(test_order_sizes), MMP_TEST_CASE(test_cli))
