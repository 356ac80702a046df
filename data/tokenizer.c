/* vocab.txt loading, the basic pre-tokenizer and WordPiece.
 *
 * The vocab lives in one arena (the file's bytes with line ends replaced by
 * NULs) indexed by an open-addressing hash table, so a lookup of "##" + a
 * piece of a word needs no allocation. Encoding allocates nothing and never
 * writes past max_len. Must never mutate the tokenizer after load: it is
 * shared read-only between loader threads. */
#include "data/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/utf8.h"

/* A word of at most MMP_TOKENIZER_MAX_WORD_CHARS characters of valid UTF-8
 * fits; anything longer becomes [UNK] without being copied. */
#define MAX_WORD_BYTES (4 * MMP_TOKENIZER_MAX_WORD_CHARS + 4)

struct mmp_tokenizer {
    int32_t n;
    char *arena;   /* every token, NUL-terminated, in id order */
    uint32_t *off; /* id -> offset of the token in arena */
    uint32_t *len; /* id -> length in bytes */
    int32_t *slot; /* hash table of ids, -1 = empty; size cap_mask + 1 (a power of two) */
    uint64_t cap_mask;
    mmp_special_ids sp;
};

/* FNV-1a, continued over several pieces (prefix, then the bytes). */
static uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_OFFSET 0xcbf29ce484222325ull

static int32_t find(const mmp_tokenizer *t, const char *prefix, size_t plen, const char *s,
                    size_t n)
{
    uint64_t h = fnv1a(fnv1a(FNV_OFFSET, prefix, plen), s, n);
    for (uint64_t i = h & t->cap_mask;; i = (i + 1) & t->cap_mask) {
        int32_t id = t->slot[i];
        if (id < 0) {
            return -1;
        }
        const char *tok = t->arena + t->off[id];
        if (t->len[id] == plen + n && memcmp(tok, prefix, plen) == 0 &&
            memcmp(tok + plen, s, n) == 0) {
            return id;
        }
    }
}

int32_t mmp_tokenizer_id(const mmp_tokenizer *t, const char *s, size_t len)
{
    return find(t, "", 0, s, len);
}

const char *mmp_tokenizer_token(const mmp_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n ? t->arena + t->off[id] : NULL;
}

int mmp_tokenizer_vocab_size(const mmp_tokenizer *t)
{
    return t->n;
}

mmp_special_ids mmp_tokenizer_specials(const mmp_tokenizer *t)
{
    return t->sp;
}

void mmp_tokenizer_destroy(mmp_tokenizer *t)
{
    if (!t) {
        return;
    }
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->slot);
    free(t);
}

static mmp_err read_whole(const char *path, char **out, size_t *len)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: not a readable regular file", path);
        goto exit;
    }
    if ((uint64_t)st.st_size >= UINT32_MAX) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: vocab larger than 4 GiB", path);
        goto exit;
    }
    *len = (size_t)st.st_size;
    *out = malloc(*len + 1);
    if (!*out) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes", path, *len);
        goto exit;
    }
    if (*len && fread(*out, 1, *len, f) != *len) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: short read", path);
        free(*out);
        *out = NULL;
        goto exit;
    }
    (*out)[*len] = 0;
exit:
    fclose(f);
    return ret;
}

mmp_err mmp_tokenizer_load(mmp_tokenizer **out, const char *path)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    mmp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        return mmp_errorf(MMP_ERR_NOMEM, "tokenizer");
    }
    size_t size = 0;
    ret = read_whole(path, &t->arena, &size);
    if (ret != MMP_OK) {
        goto fail;
    }
    size_t lines = 0;
    for (size_t i = 0; i < size; i++) {
        lines += t->arena[i] == '\n';
    }
    lines += size > 0 && t->arena[size - 1] != '\n'; /* a last line without its '\n' */
    if (lines == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: empty vocab", path);
        goto fail;
    }
    if (lines > INT32_MAX / 4) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: too many tokens (%zu)", path, lines);
        goto fail;
    }
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)lines) {
        cap *= 2;
    }
    t->off = malloc(lines * sizeof *t->off);
    t->len = malloc(lines * sizeof *t->len);
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->off || !t->len || !t->slot) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: tables for %zu tokens", path, lines);
        goto fail;
    }
    memset(t->slot, 0xff, cap * sizeof *t->slot);
    t->cap_mask = cap - 1;

    size_t at = 0;
    for (size_t line = 1; at < size; line++) {
        char *s = t->arena + at;
        char *nl = memchr(s, '\n', size - at);
        size_t n = nl ? (size_t)(nl - s) : size - at;
        at += n + 1;
        if (n > 0 && s[n - 1] == '\r') {
            n--;
        }
        s[n] = 0;
        if (n == 0) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%zu: empty line (a vocab has one token per line)",
                             path, line);
            goto fail;
        }
        size_t bad = mmp_utf8_check(s, n);
        if (bad < n) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%zu: invalid UTF-8 at byte %zu of the token", path,
                             line, bad + 1);
            goto fail;
        }
        int32_t dup = find(t, "", 0, s, n);
        if (dup >= 0) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%zu: duplicate token '%s' (also on line %d)", path,
                             line, s, dup + 1);
            goto fail;
        }
        int32_t id = t->n++;
        t->off[id] = (uint32_t)(s - t->arena);
        t->len[id] = (uint32_t)n;
        uint64_t i = fnv1a(FNV_OFFSET, s, n) & t->cap_mask;
        while (t->slot[i] >= 0) {
            i = (i + 1) & t->cap_mask;
        }
        t->slot[i] = id;
    }

    static const char *const required[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]"};
    int32_t *dst[] = {&t->sp.pad, &t->sp.unk, &t->sp.cls, &t->sp.sep};
    for (int k = 0; k < 4; k++) {
        *dst[k] = mmp_tokenizer_id(t, required[k], strlen(required[k]));
        if (*dst[k] < 0) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: no %s token", path, required[k]);
            goto fail;
        }
    }
    t->sp.mask = mmp_tokenizer_id(t, "[MASK]", 6);
    *out = t;
    return MMP_OK;
fail:
    mmp_tokenizer_destroy(t);
    return ret;
}

/* ---- encoding ------------------------------------------------------------- */

typedef struct emitter {
    int32_t *ids; /* room for cap ids */
    int cap, n, unk;
    int32_t unk_id;
} emitter;

static void emit(emitter *e, int32_t id)
{
    if (e->n < e->cap) {
        e->ids[e->n++] = id;
        e->unk += id == e->unk_id;
    }
}

/* Greedy longest-match-first segmentation of one (lowercased) word. */
static void wordpiece(const mmp_tokenizer *t, const char *w, size_t n, int too_long, emitter *e)
{
    if (too_long) {
        emit(e, t->sp.unk);
        return;
    }
    int32_t pieces[MAX_WORD_BYTES];
    int n_pieces = 0;
    size_t start = 0;
    while (start < n) {
        size_t end = n;
        int32_t cur = -1;
        while (end > start) {
            cur = start ? find(t, "##", 2, w + start, end - start) : find(t, "", 0, w, end);
            if (cur >= 0) {
                break;
            }
            end--;
            while (end > start && ((unsigned char)w[end] & 0xc0) == 0x80) {
                end--; /* never split inside a UTF-8 sequence */
            }
        }
        if (cur < 0) {
            emit(e, t->sp.unk); /* no full segmentation: the whole word is unknown */
            return;
        }
        pieces[n_pieces++] = cur;
        start = end;
    }
    for (int i = 0; i < n_pieces; i++) {
        emit(e, pieces[i]);
    }
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_control(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

/* BERT's ASCII punctuation: every printable non-alphanumeric character. */
static int is_punct(unsigned char c)
{
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
}

/* The basic pre-tokenizer: feeds each word of text, lowercased, to wordpiece. */
static void basic_tokenize(const mmp_tokenizer *t, const char *text, emitter *e)
{
    char word[MAX_WORD_BYTES];
    size_t len = 0, chars = 0;
    int too_long = 0;
    for (const unsigned char *p = (const unsigned char *)text;; p++) {
        unsigned char c = *p;
        int ends_word = c == 0 || is_space(c) || is_punct(c);
        if (ends_word && (len > 0 || too_long)) {
            wordpiece(t, word, len, too_long, e);
            len = chars = 0;
            too_long = 0;
        }
        if (c == 0 || e->n >= e->cap) {
            return;
        }
        if (is_punct(c)) {
            wordpiece(t, (const char *)p, 1, 0, e);
        } else if (!ends_word && !is_control(c)) {
            chars += (c & 0xc0) != 0x80;
            if (chars > MMP_TOKENIZER_MAX_WORD_CHARS || len >= sizeof word) {
                too_long = 1;
            } else {
                word[len++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
            }
        }
    }
}

mmp_err mmp_tokenizer_encode(const mmp_tokenizer *t, const char *text, int max_len, int32_t *ids,
                             float *mask, int *n_real, int *n_unk)
{
    if (max_len < 2) {
        return mmp_errorf(MMP_ERR_INVALID, "max text length %d < 2 (room for [CLS] and [SEP])",
                          max_len);
    }
    emitter e = {.ids = ids + 1, .cap = max_len - 2, .unk_id = t->sp.unk};
    ids[0] = t->sp.cls;
    basic_tokenize(t, text, &e);
    int real = e.n + 2;
    ids[real - 1] = t->sp.sep;
    for (int i = real; i < max_len; i++) {
        ids[i] = t->sp.pad;
    }
    if (mask) {
        for (int i = 0; i < max_len; i++) {
            mask[i] = i < real ? 1.0f : 0.0f;
        }
    }
    if (n_real) {
        *n_real = real;
    }
    if (n_unk) {
        *n_unk = e.unk;
    }
    return MMP_OK;
}
