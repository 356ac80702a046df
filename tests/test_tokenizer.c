/* The BERT tokenizer against its reference: every line of tests/tokenizer/
 * corpus.txt must give the ids transformers' BertTokenizer gave
 * (tests/tokenizer/expected.txt, written by tests/tokenizer/gen_reference.py),
 * through the library and through `mmpipe data tokenize`; plus the
 * [CLS]/[SEP]/padding/mask contract, bytes that are not UTF-8, the Unicode
 * tables, and concurrent encodes. Runs from the repository root. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tokenizer.h"
#include "data/unicode.h"
#include "tests/harness.h"

#define VOCAB "tests/tokenizer/vocab.txt"
#define CORPUS "tests/tokenizer/corpus.txt"
#define EXPECTED "tests/tokenizer/expected.txt"
#define MAGIC "MMPTOKREF"
#define FORMAT_VERSION 1
#define REGEN_HINT                                                                                 \
    "regenerate with: pip install transformers==4.57.6 && python3 "                                \
    "tests/tokenizer/gen_reference.py (with the Python of data/unicode_tables.h)"
#define CLI_MAX 512 /* `mmpipe data tokenize` without --max-len */
#define SHOW_MISMATCHES 5

/* ---- files as lines ------------------------------------------------------------ */

typedef struct lines {
    char *data;
    const char **at; /* line i is at[i][0..len[i]), '\n' not included */
    size_t *len;
    size_t n;
} lines;

static void lines_free(lines *l)
{
    free(l->data);
    free(l->at);
    free(l->len);
    memset(l, 0, sizeof *l);
}

/* Splits the file on '\n' only, as the CLI and gen_reference.py do. */
static int lines_read(lines *l, const char *path)
{
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 0;
    }
    size_t cap = 1 << 16, size = 0, got;
    l->data = malloc(cap);
    while (l->data && (got = fread(l->data + size, 1, cap - size, f)) > 0) {
        size += got;
        if (size == cap) {
            char *bigger = realloc(l->data, 2 * cap);
            if (!bigger) {
                free(l->data);
                l->data = NULL;
                break;
            }
            l->data = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (!l->data) {
        return 0;
    }
    size_t n = 0;
    for (size_t i = 0; i < size; i++) {
        n += l->data[i] == '\n';
    }
    n += size > 0 && l->data[size - 1] != '\n';
    l->at = malloc((n + 1) * sizeof *l->at);
    l->len = malloc((n + 1) * sizeof *l->len);
    if (!l->at || !l->len) {
        lines_free(l);
        return 0;
    }
    size_t start = 0;
    for (size_t i = 0; i < size; i++) {
        if (l->data[i] == '\n') {
            l->at[l->n] = l->data + start;
            l->len[l->n++] = i - start;
            start = i + 1;
        }
    }
    if (start < size) {
        l->at[l->n] = l->data + start;
        l->len[l->n++] = size - start;
    }
    return 1;
}

/* Parses space-separated integers of s[0..len) into out (room for cap);
 * returns how many, or -1 on anything else. */
static int parse_ids(const char *s, size_t len, int32_t *out, int cap)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        if (s[i] == ' ') {
            i++;
            continue;
        }
        long v = 0;
        size_t d = i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i++] - '0');
            if (v > INT32_MAX) {
                return -1;
            }
        }
        if (i == d || n == cap) {
            return -1;
        }
        out[n++] = (int32_t)v;
    }
    return n;
}

static void print_text(const char *s, size_t len)
{
    fputs("  text: \"", stderr);
    for (size_t i = 0; i < len && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
            fprintf(stderr, "\\x%02x", c);
        } else {
            fputc(c, stderr);
        }
    }
    fputs(len > 200 ? "...\"\n" : "\"\n", stderr);
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    fprintf(stderr, "  %s (%d):", label, n);
    for (int i = 0; i < n && i < 64; i++) {
        fprintf(stderr, " %d", ids[i]);
    }
    fputs(n > 64 ? " ...\n" : "\n", stderr);
}

/* ---- the reference file -------------------------------------------------------- */

typedef struct reference {
    lines file;
    size_t n_lines, n_trunc;
    size_t first; /* index in file of the ids of corpus line 1 */
} reference;

static int reference_open(reference *r)
{
    if (!lines_read(&r->file, EXPECTED)) {
        fprintf(stderr, "%s: unreadable; " REGEN_HINT "\n", EXPECTED);
        return 0;
    }
    char magic[32] = "", uni[32] = "";
    int version = 0;
    char head[256] = "";
    if (r->file.n >= 2 && r->file.len[1] < sizeof head) {
        memcpy(head, r->file.at[1], r->file.len[1]);
    }
    int ok = r->file.n >= 2 && r->file.at[0][0] == '#' &&
             sscanf(head, "%31s %d unicode=%31s lines=%zu truncated=%zu", magic, &version, uni,
                    &r->n_lines, &r->n_trunc) == 5 &&
             strcmp(magic, MAGIC) == 0;
    if (!ok) {
        fprintf(stderr, "%s: no '# ...' line and '%s %d ...' header; " REGEN_HINT "\n", EXPECTED,
                MAGIC, FORMAT_VERSION);
        return 0;
    }
    if (version != FORMAT_VERSION) {
        fprintf(stderr, "%s: format version %d, this test reads %d; " REGEN_HINT "\n", EXPECTED,
                version, FORMAT_VERSION);
        return 0;
    }
    if (strcmp(uni, mmp_unicode_version()) != 0) {
        fprintf(stderr,
                "%s: made with Unicode %s but data/unicode_tables.c is Unicode %s; " REGEN_HINT
                "\n",
                EXPECTED, uni, mmp_unicode_version());
        return 0;
    }
    if (r->file.n != 2 + r->n_lines + r->n_trunc) {
        fprintf(stderr, "%s: %zu lines, the header promises %zu; " REGEN_HINT "\n", EXPECTED,
                r->file.n, 2 + r->n_lines + r->n_trunc);
        return 0;
    }
    r->first = 2;
    return 1;
}

/* One truncated case: "T <max_len> <corpus line> : <ids> : <mask>". */
typedef struct trunc_case {
    int max_len;
    size_t line; /* 1-based */
    int32_t ids[64], mask[64];
    int n_ids, n_mask;
} trunc_case;

static int trunc_parse(const char *s, size_t len, trunc_case *c)
{
    char buf[2048];
    if (len >= sizeof buf) {
        return 0;
    }
    memcpy(buf, s, len);
    buf[len] = 0;
    int used = 0;
    if (sscanf(buf, "T %d %zu :%n", &c->max_len, &c->line, &used) != 2 || used == 0) {
        return 0;
    }
    char *ids = buf + used, *bar = strchr(ids, ':');
    if (!bar) {
        return 0;
    }
    c->n_ids = parse_ids(ids, (size_t)(bar - ids), c->ids, 64);
    c->n_mask = parse_ids(bar + 1, strlen(bar + 1), c->mask, 64);
    return c->n_ids > 0 && c->n_ids == c->max_len && c->n_mask == c->max_len;
}

/* ---- the corpus through the library -------------------------------------------- */

static void test_corpus(const mmp_tokenizer *t, const reference *r, const lines *corpus)
{
    CHECK(corpus->n == r->n_lines);
    if (corpus->n != r->n_lines) {
        fprintf(stderr, "%s has %zu lines, %s %zu; " REGEN_HINT "\n", CORPUS, corpus->n, EXPECTED,
                r->n_lines);
        return;
    }
    static int32_t got[CLI_MAX], want[CLI_MAX + 1];
    size_t bad = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < corpus->n; i++) {
        int n_got = 0;
        mmp_err e = mmp_tokenizer_encode_n(t, corpus->at[i], corpus->len[i], CLI_MAX, got, NULL,
                                           &n_got, NULL);
        int n_want =
            parse_ids(r->file.at[r->first + i], r->file.len[r->first + i], want, CLI_MAX + 1);
        if (e == MMP_OK && n_want == n_got && memcmp(got, want, (size_t)n_got * 4) == 0) {
            continue;
        }
        if (bad++ < SHOW_MISMATCHES) {
            fprintf(stderr, "MISMATCH corpus line %zu:\n", i + 1);
            print_text(corpus->at[i], corpus->len[i]);
            print_ids("reference", want, n_want);
            print_ids("mmpipe   ", got, n_got);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3;
    fprintf(stderr, "corpus: %zu lines, %zu differ from the reference (%.1f us per line)\n",
            corpus->n, bad, us / (double)corpus->n);
    CHECK(bad == 0);
}

static void test_truncated(const mmp_tokenizer *t, const reference *r, const lines *corpus)
{
    size_t bad = 0;
    for (size_t k = 0; k < r->n_trunc; k++) {
        size_t at = r->first + r->n_lines + k;
        trunc_case c;
        if (!trunc_parse(r->file.at[at], r->file.len[at], &c) || c.line < 1 || c.line > corpus->n) {
            fprintf(stderr, "%s:%zu: bad truncated case; " REGEN_HINT "\n", EXPECTED, at + 1);
            bad++;
            continue;
        }
        int32_t ids[64];
        float mask[64];
        int n_real = 0;
        CHECK_OK(mmp_tokenizer_encode_n(t, corpus->at[c.line - 1], corpus->len[c.line - 1],
                                        c.max_len, ids, mask, &n_real, NULL));
        int ok = memcmp(ids, c.ids, (size_t)c.max_len * 4) == 0;
        int real_want = 0;
        for (int i = 0; i < c.max_len; i++) {
            ok &= mask[i] == (float)c.mask[i];
            real_want += c.mask[i];
        }
        ok &= n_real == real_want;
        if (!ok && bad++ < SHOW_MISMATCHES) {
            fprintf(stderr, "MISMATCH corpus line %zu at max_len %d:\n", c.line, c.max_len);
            print_ids("reference", c.ids, c.max_len);
            print_ids("mmpipe   ", ids, c.max_len);
        }
    }
    fprintf(stderr, "truncated: %zu cases, %zu differ\n", r->n_trunc, bad);
    CHECK(r->n_trunc > 0 && bad == 0);
}

/* ---- the corpus through `mmpipe data tokenize` ------------------------------------ */

static int file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
    }
    return f != NULL;
}

/* Runs the CLI on in (with --max-len max_len when > 0) into out, its
 * warnings (the corpus's lines that are not UTF-8 or hold a NUL, which a
 * manifest would refuse) into out.err; 1 on exit 0. */
static int run_cli(const char *in, const char *out, int max_len)
{
    char cmd[4096], flag[32] = "";
    if (max_len > 0) {
        snprintf(flag, sizeof flag, " --max-len %d", max_len);
    }
    snprintf(cmd, sizeof cmd, "{ %s data tokenize --vocab %s%s < %s > %s 2> %s.err; }",
             mmp_test_bin(), VOCAB, flag, in, out, out);
    return mmp_test_run(cmd, NULL, 0) == 0;
}

static size_t compare_cli_line(const lines *got, size_t i, const char *want, size_t want_len,
                               const char *label)
{
    if (i < got->n && got->len[i] == want_len && memcmp(got->at[i], want, want_len) == 0) {
        return 0;
    }
    fprintf(stderr, "MISMATCH mmpipe data tokenize, %s:\n  reference: %.*s\n  mmpipe:    %.*s\n",
            label, (int)(want_len > 300 ? 300 : want_len), want,
            i < got->n ? (int)(got->len[i] > 300 ? 300 : got->len[i]) : 6,
            i < got->n ? got->at[i] : "(none)");
    return 1;
}

static void test_cli(const reference *r, const lines *corpus)
{
    if (!file_exists(mmp_test_bin())) {
        fprintf(stderr, "FAIL: no mmpipe binary at %s (build it, or set MMP_BIN)\n",
                mmp_test_bin());
        CHECK(!"mmpipe binary present");
        return;
    }
    const char *dir = mmp_test_tmpdir("tokenizer_cli");
    char out[1024];
    snprintf(out, sizeof out, "%s/ids.txt", dir);
    CHECK(run_cli(CORPUS, out, 0));
    lines got;
    size_t bad = 0;
    if (lines_read(&got, out)) {
        CHECK(got.n == corpus->n);
        for (size_t i = 0; i < r->n_lines; i++) {
            char label[64];
            snprintf(label, sizeof label, "corpus line %zu", i + 1);
            if (bad < SHOW_MISMATCHES) {
                bad += compare_cli_line(&got, i, r->file.at[r->first + i],
                                        r->file.len[r->first + i], label);
            } else {
                bad += !(i < got.n && got.len[i] == r->file.len[r->first + i] &&
                         memcmp(got.at[i], r->file.at[r->first + i], got.len[i]) == 0);
            }
        }
        lines_free(&got);
    } else {
        bad = r->n_lines;
    }

    /* truncation and padding: one run per max_len over the lines that use it */
    size_t bad_trunc = 0;
    for (size_t k = 0; k < r->n_trunc; k++) {
        trunc_case c;
        size_t at = r->first + r->n_lines + k;
        if (!trunc_parse(r->file.at[at], r->file.len[at], &c) || c.line > corpus->n) {
            bad_trunc++;
            continue;
        }
        char in[1024];
        snprintf(in, sizeof in, "%s/line.txt", dir);
        FILE *f = fopen(in, "wb");
        if (!f) {
            bad_trunc++;
            continue;
        }
        fwrite(corpus->at[c.line - 1], 1, corpus->len[c.line - 1], f);
        fputc('\n', f);
        fclose(f);
        char want[1024];
        size_t n = 0;
        for (int i = 0; i < c.max_len && n < sizeof want - 16; i++) {
            n += (size_t)snprintf(want + n, sizeof want - n, i ? " %d" : "%d", c.ids[i]);
        }
        if (!run_cli(in, out, c.max_len) || !lines_read(&got, out)) {
            bad_trunc++;
            continue;
        }
        char label[64];
        snprintf(label, sizeof label, "corpus line %zu, --max-len %d", c.line, c.max_len);
        bad_trunc += compare_cli_line(&got, 0, want, n, label);
        lines_free(&got);
    }
    fprintf(stderr,
            "mmpipe data tokenize: %zu of %zu lines and %zu of %zu truncated cases differ\n", bad,
            r->n_lines, bad_trunc, r->n_trunc);
    CHECK(bad == 0);
    CHECK(bad_trunc == 0);
}

/* ---- the contract on small inputs --------------------------------------------------- */

static int encodes_as(const mmp_tokenizer *t, const char *text, size_t len, int max_len,
                      const int32_t *want, int n_want)
{
    int32_t ids[64];
    int n = 0;
    if (mmp_tokenizer_encode_n(t, text, len, max_len, ids, NULL, &n, NULL) != MMP_OK) {
        return 0;
    }
    if (n == n_want && memcmp(ids, want, (size_t)n * 4) == 0) {
        return 1;
    }
    print_text(text, len);
    print_ids("want", want, n_want);
    print_ids("got ", ids, n);
    return 0;
}

#define ENCODES(t, text, ...)                                                                      \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        CHECK(encodes_as(t, text, sizeof(text) - 1, 64, want_,                                     \
                         (int)(sizeof want_ / sizeof want_[0])));                                  \
    } while (0)

enum {
    PAD = 0,
    UNK = 100,
    CLS = 101,
    SEP = 102,
    MASK = 103,
    HELLO = 7592,
    WORLD = 2088,
    EURO = 1574
};

static void test_contract(const mmp_tokenizer *t)
{
    CHECK(mmp_tokenizer_vocab_size(t) == 30522);
    mmp_special_ids sp = mmp_tokenizer_specials(t);
    CHECK(sp.pad == PAD && sp.unk == UNK && sp.cls == CLS && sp.sep == SEP && sp.mask == MASK);

    ENCODES(t, "", CLS, SEP);
    ENCODES(t, "Hello, World!", CLS, HELLO, 1010, WORLD, 999, SEP);
    ENCODES(t, "hello [MASK] world", CLS, HELLO, MASK, WORLD, SEP);
    ENCODES(t, "hello [mask]", CLS, HELLO, 1031, 7308, 1033, SEP); /* specials are exact */
    ENCODES(t, "unaffable", CLS, 14477, 20961, 3468, SEP);
    /* bytes that are not UTF-8 are dropped like the U+FFFD they decode to */
    ENCODES(t, "hel\xfflo", CLS, HELLO, SEP);
    ENCODES(t, "hel\xe2\x82lo", CLS, HELLO, SEP);         /* cut-short sequence */
    ENCODES(t, "hel\xc0\xaflo", CLS, HELLO, SEP);         /* overlong '/' */
    ENCODES(t, "hel\xed\xa0\x80lo", CLS, HELLO, SEP);     /* a surrogate */
    ENCODES(t, "hel\xef\xbf\xbdlo", CLS, HELLO, SEP);     /* U+FFFD itself */
    ENCODES(t, "hel\xf4\x90\x80\x80lo", CLS, HELLO, SEP); /* above U+10FFFF */
    ENCODES(t, "\xff\xfe", CLS, SEP);
    ENCODES(t, "hel\0lo", CLS, HELLO, SEP); /* NUL is U+0000: dropped */
    ENCODES(t, "\xe2\x82\xac", CLS, EURO, SEP);

    /* Truncation keeps [SEP]; padding is [PAD] with mask 0. */
    int32_t ids[8];
    float mask[8];
    int n_real = 0, n_unk = -1;
    CHECK_OK(mmp_tokenizer_encode(t, "hello world hello world", 4, ids, mask, &n_real, &n_unk));
    CHECK(ids[0] == CLS && ids[1] == HELLO && ids[2] == WORLD && ids[3] == SEP);
    CHECK(n_real == 4 && n_unk == 0 && mask[0] == 1 && mask[3] == 1);
    CHECK_OK(mmp_tokenizer_encode(t, "Hello", 6, ids, mask, &n_real, NULL));
    const int32_t padded[6] = {CLS, HELLO, SEP, PAD, PAD, PAD};
    const float padded_mask[6] = {1, 1, 1, 0, 0, 0};
    CHECK(memcmp(ids, padded, sizeof padded) == 0 && n_real == 3);
    CHECK(memcmp(mask, padded_mask, sizeof padded_mask) == 0);
    CHECK_OK(mmp_tokenizer_encode(t, "hello world", 2, ids, mask, &n_real, NULL));
    CHECK(ids[0] == CLS && ids[1] == SEP && n_real == 2 && mask[1] == 1);
    CHECK(mmp_tokenizer_encode(t, "hello", 1, ids, mask, &n_real, NULL) == MMP_ERR_INVALID);
    /* the 8th id would be the 7th token: the encoder stops without reading the rest */
    ids[7] = -7;
    CHECK_OK(mmp_tokenizer_encode(t, "a b c d e f g h i j k l", 7, ids, NULL, &n_real, NULL));
    CHECK(n_real == 7 && ids[6] == SEP && ids[7] == -7);
    /* [UNK] counts: a word past 100 characters, and one with no segmentation */
    char word[128];
    memset(word, 'a', 101);
    word[101] = 0;
    CHECK_OK(mmp_tokenizer_encode(t, word, 8, ids, NULL, &n_real, &n_unk));
    CHECK(n_real == 3 && ids[1] == UNK && n_unk == 1);
    word[100] = 0;
    CHECK_OK(mmp_tokenizer_encode(t, word, 8, ids, NULL, &n_real, &n_unk));
    CHECK(n_real == 8 && ids[1] != UNK && n_unk == 0);
    CHECK_OK(mmp_tokenizer_encode(t, "\xe2\x98\x83 hello", 8, ids, NULL, &n_real, &n_unk));
    CHECK(n_real == 4 && ids[1] == UNK && ids[2] == HELLO && n_unk == 1); /* U+2603 snowman */
}

static void test_unicode(void)
{
    uint32_t f[MMP_UC_FOLD_MAX];
    CHECK(mmp_unicode_fold('A', f) == 1 && f[0] == 'a');
    CHECK(mmp_unicode_fold(0x130, f) == 2 && f[0] == 'i' && f[1] == 0x307); /* İ */
    CHECK(mmp_unicode_fold(0xe9, f) == 2 && f[0] == 'e' && f[1] == 0x301);  /* é */
    CHECK(mmp_unicode_fold(0xd55c, f) == 3 && f[0] == 0x1112 && f[1] == 0x1161 &&
          f[2] == 0x11ab); /* 한 */
    CHECK(mmp_unicode_fold(0xac00, f) == 2 && f[0] == 0x1100 && f[1] == 0x1161);
    CHECK(mmp_unicode_fold(0xf900, f) == 1 && f[0] == 0x8c48); /* CJK compatibility ideograph */
    CHECK(mmp_unicode_fold(0xfb01, f) == 1 && f[0] == 0xfb01); /* ligatures stay (no NFKD) */
    CHECK(mmp_unicode_fold(0x1e9e, f) == 1 && f[0] == 0xdf);   /* ẞ -> ß */
    CHECK(mmp_unicode_flags('!') == MMP_UC_PUNCT && mmp_unicode_flags('a') == 0);
    CHECK(mmp_unicode_flags(0x2019) == MMP_UC_PUNCT && mmp_unicode_flags(0x20ac) == 0);
    CHECK(mmp_unicode_flags(0x301) == MMP_UC_MN && mmp_unicode_ccc(0x301) == 230);
    CHECK(mmp_unicode_flags(0x4e2d) == MMP_UC_CJK && mmp_unicode_flags(0x3042) == 0);
    CHECK(mmp_unicode_flags(0xa0) == MMP_UC_SPACE && mmp_unicode_flags(0x2028) == MMP_UC_SPACE);
    CHECK(mmp_unicode_flags(0x200b) == MMP_UC_DROP && mmp_unicode_flags(0x0b) == MMP_UC_DROP);
    CHECK(mmp_unicode_flags(0xfffd) == MMP_UC_DROP && mmp_unicode_flags(0xe000) == MMP_UC_DROP);
    CHECK(mmp_unicode_flags(0x110000) == MMP_UC_DROP && mmp_unicode_ccc(0x110000) == 0);
    CHECK(mmp_unicode_ccc(0x1d165) == 216 && mmp_unicode_flags(0x1d165) == 0); /* Mc, reorders */
}

/* NFD's canonical reordering changes ids only where the vocab holds the
 * reordered marks, which bert-base-uncased's does not: a vocab that does.
 * The ids below are transformers' BertTokenizer's over the same vocab. */
static void test_reordering(void)
{
    const char *dir = mmp_test_tmpdir("tokenizer_reorder");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    /* 5: x, 6: ##<U+1D165 ccc 216><U+1D16D ccc 226>, 7: ##<U+1D16D>, 8: ##<U+1D165> */
    if (!mmp_test_write_text(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n"
                                   "##\xf0\x9d\x85\xa5\xf0\x9d\x85\xad\n"
                                   "##\xf0\x9d\x85\xad\n##\xf0\x9d\x85\xa5\n")) {
        return;
    }
    mmp_tokenizer *t = NULL;
    CHECK_OK(mmp_tokenizer_load(&t, path));
    if (!t) {
        return;
    }
    ENCODES(t, "x\xf0\x9d\x85\xa5\xf0\x9d\x85\xad", 2, 5, 6, 3); /* in order */
    ENCODES(t, "x\xf0\x9d\x85\xad\xf0\x9d\x85\xa5", 2, 5, 6, 3); /* 226 before 216: sorted */
    /* an Mn mark (U+0301, ccc 230) between them is stripped after sorting */
    ENCODES(t, "x\xf0\x9d\x85\xad\xcc\x81\xf0\x9d\x85\xa5", 2, 5, 6, 3);
    /* so is a control character, which goes before NFD sees the marks */
    ENCODES(t, "x\xf0\x9d\x85\xad\x01\xf0\x9d\x85\xa5", 2, 5, 6, 3);
    /* an Mn starter (U+0900, ccc 0) ends the run though it is stripped too */
    ENCODES(t, "x\xf0\x9d\x85\xad\xe0\xa4\x80\xf0\x9d\x85\xa5", 2, 5, 7, 8, 3);
    ENCODES(t, "X\xf0\x9d\x85\xad \xf0\x9d\x85\xa5", 2, 5, 7, 1, 3); /* so does a space */
    mmp_tokenizer_destroy(t);
}

/* ---- concurrent encodes ------------------------------------------------------------ */

typedef struct worker {
    const mmp_tokenizer *t;
    const lines *corpus;
    const reference *r;
    size_t bad;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    int32_t got[CLI_MAX], want[CLI_MAX + 1];
    for (size_t i = 0; i < w->corpus->n; i++) {
        int n = 0;
        mmp_tokenizer_encode_n(w->t, w->corpus->at[i], w->corpus->len[i], CLI_MAX, got, NULL, &n,
                               NULL);
        int n_want = parse_ids(w->r->file.at[w->r->first + i], w->r->file.len[w->r->first + i],
                               want, CLI_MAX + 1);
        w->bad += n != n_want || memcmp(got, want, (size_t)n * 4) != 0;
    }
    return NULL;
}

static void test_threads(const mmp_tokenizer *t, const reference *r, const lines *corpus)
{
    enum { N = 4 };
    pthread_t th[N];
    worker w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker){.t = t, .corpus = corpus, .r = r};
        CHECK(pthread_create(&th[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].bad == 0);
    }
}

/* The reference corpus and the CLI against the committed reference file. */
static void test_reference(void)
{
    mmp_tokenizer *t = NULL;
    CHECK_OK(mmp_tokenizer_load(&t, VOCAB));
    if (!t) {
        return;
    }
    test_contract(t);
    reference r = {.n_lines = 0};
    lines corpus = {.n = 0};
    int have = reference_open(&r);
    CHECK(have);
    CHECK(lines_read(&corpus, CORPUS));
    if (have && corpus.data) {
        CHECK(corpus.n >= 2000);
        test_corpus(t, &r, &corpus);
        if (corpus.n == r.n_lines) {
            test_truncated(t, &r, &corpus);
            test_threads(t, &r, &corpus);
            test_cli(&r, &corpus);
        }
    }
    lines_free(&corpus);
    lines_free(&r.file);
    mmp_tokenizer_destroy(t);
}

MMP_TEST_LIST("test_tokenizer", MMP_TEST_CASE(test_unicode), MMP_TEST_CASE(test_reordering),
              MMP_TEST_CASE(test_reference))
