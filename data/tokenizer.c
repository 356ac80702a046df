/* vocab.txt loading, BERT's basic pre-tokenizer and WordPiece.
 *
 * The vocab lives in one arena (the file's bytes with line ends replaced by
 * NULs) indexed by an open-addressing hash table, so a lookup of "##" + a
 * piece of a word needs no allocation. Encoding streams over the text once:
 * each code point is looked up in data/unicode.h's tables, folded, and added
 * to the current word, which is handed to WordPiece when a separator ends it.
 * Encoding allocates nothing and never writes past max_len. Must never
 * mutate the tokenizer after load: it is shared read-only between loader
 * threads. */
#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/unicode.h"
#include "common/fsutil.h"
#include "common/utf8.h"

/* A word of at most MMP_TOKENIZER_MAX_WORD_CHARS characters of valid UTF-8
 * fits; anything longer becomes [UNK] without being copied. */
#define MAX_WORD_BYTES (4 * MMP_TOKENIZER_MAX_WORD_CHARS + 4)

/* The reference's special tokens (BertTokenizer's defaults): matched in the
 * raw text before anything else, each a token of its own. */
static const char *const SPECIALS[] = {"[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"};
#define N_SPECIALS (sizeof SPECIALS / sizeof SPECIALS[0])

struct mmp_tokenizer {
    int32_t n;
    char *arena;   /* every token, NUL-terminated, in id order */
    uint32_t *off; /* id -> offset of the token in arena */
    uint32_t *len; /* id -> length in bytes */
    int32_t *slot; /* hash table of ids, -1 = empty; size cap_mask + 1 (a power of two) */
    uint64_t cap_mask;
    uint32_t max_token_len; /* longest token in bytes: WordPiece never tries longer pieces */
    mmp_special_ids sp;
    int n_specials;
    int32_t special_id[N_SPECIALS]; /* the SPECIALS the vocab has, in that order */
    uint8_t special_len[N_SPECIALS];
    const char *special_str[N_SPECIALS];
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

mmp_err mmp_tokenizer_load(mmp_tokenizer **out, const char *path)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    mmp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        return mmp_errorf(MMP_ERR_NOMEM, "tokenizer");
    }
    size_t size = 0;
    unsigned char *text = NULL;
    /* the offsets and lengths are 32-bit */
    MMP_TRY_GOTO(mmp_fs_read_file(path, MMP_ERR_IO, UINT32_MAX - 1, &text, &size), ret, fail);
    t->arena = (char *)text;
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
        if (n > t->max_token_len) {
            t->max_token_len = (uint32_t)n;
        }
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
    for (size_t k = 0; k < N_SPECIALS; k++) {
        int32_t id = mmp_tokenizer_id(t, SPECIALS[k], strlen(SPECIALS[k]));
        if (id >= 0) {
            t->special_id[t->n_specials] = id;
            t->special_len[t->n_specials] = (uint8_t)strlen(SPECIALS[k]);
            t->special_str[t->n_specials++] = SPECIALS[k];
        }
    }
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

/* Greedy longest-match-first segmentation of one folded word w[0..n). */
static void wordpiece(const mmp_tokenizer *t, const char *w, size_t n, emitter *e)
{
    int32_t pieces[MMP_TOKENIZER_MAX_WORD_CHARS];
    int n_pieces = 0;
    size_t start = 0;
    while (start < n) {
        size_t prefix = start ? 2 : 0;
        size_t end = n;
        if (t->max_token_len < prefix + (n - start)) {
            /* no token is longer: start at the last character boundary that fits */
            end = start + (t->max_token_len > prefix ? t->max_token_len - prefix : 0);
            while (end > start && ((unsigned char)w[end] & 0xc0) == 0x80) {
                end--;
            }
        }
        int32_t cur = -1;
        while (end > start) {
            cur = find(t, "##", prefix, w + start, end - start);
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

/* The word being built: folded code points without their Mn marks, in NFD's
 * canonical order. Characters past the 100th are only counted. */
typedef struct word {
    uint32_t cp[MMP_TOKENIZER_MAX_WORD_CHARS];
    uint8_t ccc[MMP_TOKENIZER_MAX_WORD_CHARS];
    int n;
    int run; /* where the current run of non-starters begins: reordering stays after it */
} word;

static void word_end(const mmp_tokenizer *t, word *w, emitter *e)
{
    if (w->n == 0) {
        return;
    }
    if (w->n > MMP_TOKENIZER_MAX_WORD_CHARS) {
        emit(e, t->sp.unk);
    } else {
        char bytes[MAX_WORD_BYTES];
        size_t len = 0;
        for (int i = 0; i < w->n; i++) {
            len += (size_t)mmp_utf8_encode(w->cp[i], bytes + len);
        }
        wordpiece(t, bytes, len, e);
    }
    w->n = w->run = 0;
}

/* NFD's canonical ordering is a stable sort of each run of non-starters by
 * combining class. Marks of category Mn are removed afterwards, so only the
 * others need sorting, and sorting them alone gives the same order. */
static void word_add(word *w, uint32_t cp, unsigned ccc)
{
    if (w->n < MMP_TOKENIZER_MAX_WORD_CHARS) {
        int i = w->n;
        while (ccc > 0 && i > w->run && w->ccc[i - 1] > ccc) {
            w->cp[i] = w->cp[i - 1];
            w->ccc[i] = w->ccc[i - 1];
            i--;
        }
        w->cp[i] = cp;
        w->ccc[i] = (uint8_t)ccc;
    }
    w->n++;
    if (ccc == 0) {
        w->run = w->n;
    }
}

/* One code point of a folded character. */
static void add_folded(const mmp_tokenizer *t, word *w, uint32_t cp, emitter *e)
{
    unsigned flags = mmp_unicode_flags(cp), ccc = mmp_unicode_ccc(cp);
    if (flags & MMP_UC_MN) {
        if (ccc == 0) {
            w->run = w->n; /* a starter even though it is stripped: it still bounds the run */
        }
        return;
    }
    if (flags & MMP_UC_PUNCT) {
        word_end(t, w, e);
        word_add(w, cp, ccc);
        word_end(t, w, e);
        return;
    }
    word_add(w, cp, ccc);
}

/* Decodes the UTF-8 sequence at s[0..n) (n >= 1); *cp is U+FFFD for a byte
 * that does not start a valid sequence. Returns the bytes consumed. */
static size_t decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t len = mmp_utf8_seq_len(s, n);
    if (len == 0) {
        *cp = 0xfffd;
        return 1;
    }
    static const unsigned char lead_mask[5] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    uint32_t c = s[0] & lead_mask[len];
    for (size_t i = 1; i < len; i++) {
        c = (c << 6) | (s[i] & 0x3f);
    }
    *cp = c;
    return len;
}

/* The basic pre-tokenizer over text[0..len), which holds no special token:
 * feeds each word to WordPiece. */
static void basic_tokenize(const mmp_tokenizer *t, const char *text, size_t len, emitter *e)
{
    word w = {.n = 0};
    const unsigned char *s = (const unsigned char *)text;
    size_t at = 0;
    while (at < len && e->n < e->cap) {
        uint32_t cp;
        at += decode(s + at, len - at, &cp);
        unsigned flags = mmp_unicode_flags(cp);
        if (flags & MMP_UC_DROP) {
            continue; /* dropped before anything else: the characters around it meet */
        }
        if (flags & MMP_UC_SPACE) {
            word_end(t, &w, e);
            continue;
        }
        uint32_t folded[MMP_UC_FOLD_MAX];
        int n = mmp_unicode_fold(cp, folded);
        if (flags & MMP_UC_CJK) {
            word_end(t, &w, e);
        }
        for (int i = 0; i < n; i++) {
            add_folded(t, &w, folded[i], e);
        }
        if (flags & MMP_UC_CJK) {
            word_end(t, &w, e);
        }
    }
    word_end(t, &w, e);
}

/* The special token that text[0..len) starts with, as an index into t's
 * specials, or -1. */
static int special_at(const mmp_tokenizer *t, const char *text, size_t len)
{
    for (int k = 0; k < t->n_specials; k++) {
        if (len >= t->special_len[k] && memcmp(text, t->special_str[k], t->special_len[k]) == 0) {
            return k;
        }
    }
    return -1;
}

mmp_err mmp_tokenizer_encode_n(const mmp_tokenizer *t, const char *text, size_t len, int max_len,
                               int32_t *ids, float *mask, int *n_real, int *n_unk)
{
    if (max_len < 2) {
        return mmp_errorf(MMP_ERR_INVALID, "max text length %d < 2 (room for [CLS] and [SEP])",
                          max_len);
    }
    emitter e = {.ids = ids + 1, .cap = max_len - 2, .unk_id = t->sp.unk};
    ids[0] = t->sp.cls;
    size_t at = 0;
    while (at < len && e.n < e.cap) {
        /* the next special token splits the text; no special token holds a '[' but its first */
        size_t end = at;
        int k = -1;
        for (; end < len; end++) {
            if (text[end] == '[' && (k = special_at(t, text + end, len - end)) >= 0) {
                break;
            }
        }
        basic_tokenize(t, text + at, end - at, &e);
        if (k < 0) {
            break;
        }
        emit(&e, t->special_id[k]);
        at = end + t->special_len[k];
    }
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

mmp_err mmp_tokenizer_encode(const mmp_tokenizer *t, const char *text, int max_len, int32_t *ids,
                             float *mask, int *n_real, int *n_unk)
{
    return mmp_tokenizer_encode_n(t, text, strlen(text), max_len, ids, mask, n_real, n_unk);
}
