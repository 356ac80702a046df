/* The manifest's JSON-line parser, file walker and sample index.
 *
 * The parser is a small, strict RFC 8259 recursive-descent parser for one
 * line: full syntax (escapes, \uXXXX with surrogate pairs to UTF-8, numbers,
 * literals, nested values skipped) so that a malformed line is caught where
 * it is malformed, not when the trainer reaches it. Every decoded string
 * lands in one arena the size of the line (a decoded string plus its NUL is
 * never longer than its quoted form), so parsing allocates once. This file
 * never opens images: existence checks belong to the dataset. */
#include "data/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/utf8.h"

#define MAX_DEPTH 64

/* ---- one line --------------------------------------------------------------- */

enum kind { K_NONE = 0, K_STRING, K_NUMBER, K_OTHER };

typedef struct field {
    int count;       /* times the key appeared */
    enum kind kind;  /* of the first value */
    const char *str; /* decoded string, or the number's text, in the arena */
    int has_nul;     /* a \u0000 inside the string */
} field;

typedef struct parser {
    const char *s;
    size_t n, i;
    char *arena; /* NULL: validate only */
    size_t used;
    char why[240];
    mmp_sample_problem kind; /* of the first failure */
} parser;

static int fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *p, const char *fmt, ...)
{
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->kind == MMP_PROBLEM_NONE) {
        p->kind = MMP_PROBLEM_JSON;
    }
    if (p->i >= p->n) {
        snprintf(p->why, sizeof p->why, "not valid JSON at the end of the line: %s", msg);
    } else {
        snprintf(p->why, sizeof p->why, "not valid JSON at column %zu: %s", p->i + 1, msg);
    }
    return 0;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\r' || p->s[p->i] == '\n')) {
        p->i++;
    }
}

static int hex4(parser *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        if (p->i >= p->n) {
            return fail(p, "\\u needs four hex digits");
        }
        char c = p->s[p->i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            return fail(p, "\\u needs four hex digits");
        }
        v = v * 16 + (uint32_t)d;
        p->i++;
    }
    *out = v;
    return 1;
}

static void put(parser *p, const char *bytes, size_t n)
{
    if (p->arena) {
        memcpy(p->arena + p->used, bytes, n);
    }
    p->used += n;
}

/* Parses a string at p->i (a '"'); decoded into the arena when keep. */
static int parse_string(parser *p, int keep, const char **out, int *has_nul)
{
    char *saved_arena = p->arena;
    size_t start = p->used;
    if (!keep) {
        p->arena = NULL;
    }
    int ok = 1;
    *has_nul = 0;
    p->i++; /* the opening quote */
    for (;;) {
        if (p->i >= p->n) {
            ok = fail(p, "unterminated string");
            break;
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            ok = fail(p, "control character 0x%02x in a string (escape it)", c);
            break;
        }
        if (c != '\\') {
            size_t len = mmp_utf8_seq_len((const unsigned char *)p->s + p->i, p->n - p->i);
            if (len == 0) {
                p->kind = MMP_PROBLEM_UTF8;
                ok = fail(p, "invalid UTF-8 in a string");
                break;
            }
            put(p, p->s + p->i, len);
            p->i += len;
            continue;
        }
        p->i++;
        if (p->i >= p->n) {
            ok = fail(p, "unterminated string");
            break;
        }
        char e = p->s[p->i++];
        const char *simple = NULL;
        switch (e) {
        case '"':
            simple = "\"";
            break;
        case '\\':
            simple = "\\";
            break;
        case '/':
            simple = "/";
            break;
        case 'b':
            simple = "\b";
            break;
        case 'f':
            simple = "\f";
            break;
        case 'n':
            simple = "\n";
            break;
        case 'r':
            simple = "\r";
            break;
        case 't':
            simple = "\t";
            break;
        case 'u':
            break;
        default:
            p->i--;
            ok = (unsigned char)e >= 0x20 && (unsigned char)e < 0x7f
                     ? fail(p, "unknown escape '\\%c'", e)
                     : fail(p, "unknown escape: '\\' then byte 0x%02x", (unsigned char)e);
            break;
        }
        if (!ok) {
            break;
        }
        if (simple) {
            put(p, simple, 1);
            continue;
        }
        uint32_t cp = 0;
        if (!hex4(p, &cp)) {
            ok = 0;
            break;
        }
        if (cp >= 0xdc00 && cp <= 0xdfff) {
            p->kind = MMP_PROBLEM_UTF8; /* well-formed JSON, but no UTF-8 can hold it */
            ok = fail(p, "\\u%04x is a low surrogate without a high one", (unsigned)cp);
            break;
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t lo = 0;
            if (p->i + 1 >= p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                p->kind = MMP_PROBLEM_UTF8;
                ok = fail(p, "\\u%04x is a high surrogate without a low one", (unsigned)cp);
                break;
            }
            p->i += 2;
            if (!hex4(p, &lo)) {
                ok = 0;
                break;
            }
            if (lo < 0xdc00 || lo > 0xdfff) {
                p->kind = MMP_PROBLEM_UTF8;
                ok = fail(p, "\\u%04x after a high surrogate is not a low surrogate", (unsigned)lo);
                break;
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        char utf8[4];
        int len = mmp_utf8_encode(cp, utf8);
        *has_nul |= cp == 0;
        put(p, utf8, (size_t)len);
    }
    if (ok && keep) {
        put(p, "", 1);
        *out = p->arena + start;
    }
    if (!keep) {
        p->arena = saved_arena;
        p->used = start;
    }
    return ok;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int parse_number(parser *p)
{
    if (p->s[p->i] == '-') {
        p->i++;
    }
    if (p->i >= p->n || !is_digit(p->s[p->i])) {
        return fail(p, "a number needs digits");
    }
    if (p->s[p->i] == '0') {
        p->i++;
    } else {
        while (p->i < p->n && is_digit(p->s[p->i])) {
            p->i++;
        }
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || !is_digit(p->s[p->i])) {
            return fail(p, "a number needs digits after '.'");
        }
        while (p->i < p->n && is_digit(p->s[p->i])) {
            p->i++;
        }
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) {
            p->i++;
        }
        if (p->i >= p->n || !is_digit(p->s[p->i])) {
            return fail(p, "a number needs digits in its exponent");
        }
        while (p->i < p->n && is_digit(p->s[p->i])) {
            p->i++;
        }
    }
    return 1;
}

static int parse_value(parser *p, int depth, field *f);

/* Object or array at p->i; when fields is not NULL (the top level), the
 * values of "image", "text" and "id" are recorded. */
static int parse_container(parser *p, int depth, field *fields)
{
    static const char *const known[3] = {"image", "text", "id"};
    char open = p->s[p->i];
    char close = open == '{' ? '}' : ']';
    if (depth >= MAX_DEPTH) {
        return fail(p, "nested deeper than %d levels", MAX_DEPTH);
    }
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 1;
    }
    for (;;) {
        field *target = NULL;
        if (open == '{') {
            if (p->i >= p->n || p->s[p->i] != '"') {
                return fail(p, "expected a quoted key");
            }
            const char *key = NULL;
            int nul;
            size_t mark = p->used;
            if (!parse_string(p, fields != NULL, &key, &nul)) {
                return 0;
            }
            for (int k = 0; fields && k < 3; k++) {
                if (!nul && strcmp(key, known[k]) == 0) {
                    target = &fields[k];
                }
            }
            if (fields) {
                p->used = mark; /* the key is not needed any more */
            }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                return fail(p, "expected ':' after a key");
            }
            p->i++;
            skip_ws(p);
        }
        if (!parse_value(p, depth + 1, target)) {
            return 0;
        }
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_ws(p);
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return 1;
        }
        return fail(p, "expected ',' or '%c'", close);
    }
}

/* A value at p->i; f (may be NULL) records a known field's first value. */
static int parse_value(parser *p, int depth, field *f)
{
    if (p->i >= p->n) {
        return fail(p, "expected a value");
    }
    int first = f && f->count++ == 0;
    char c = p->s[p->i];
    size_t start = p->i;
    if (c == '"') {
        const char *s = NULL;
        int nul = 0;
        if (!parse_string(p, first, &s, &nul)) {
            return 0;
        }
        if (first) {
            f->kind = K_STRING, f->str = s, f->has_nul = nul;
        }
        return 1;
    }
    if (first) {
        f->kind = K_OTHER;
    }
    if (c == '{' || c == '[') {
        return parse_container(p, depth, NULL);
    }
    if (c == '-' || is_digit(c)) {
        if (!parse_number(p)) {
            return 0;
        }
        if (first) {
            f->kind = K_NUMBER;
            f->str = p->arena + p->used;
            put(p, p->s + start, p->i - start);
            put(p, "", 1);
        }
        return 1;
    }
    static const char *const literals[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(literals[k]);
        if (p->n - p->i >= len && memcmp(p->s + p->i, literals[k], len) == 0) {
            p->i += len;
            return 1;
        }
    }
    if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f) {
        return fail(p, "expected a value, found '%c'", c);
    }
    return fail(p, "expected a value, found byte 0x%02x", (unsigned char)c);
}

static int blank(const char *s)
{
    for (; *s; s++) {
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r' && *s != '\f' && *s != '\v') {
            return 0;
        }
    }
    return 1;
}

/* Parses line s[0..n) with arena (>= n + 1 bytes); fills e's strings or
 * writes the reason to why and its kind to e->problem. */
static int parse_entry(const char *s, size_t n, char *arena, mmp_manifest_entry *e, char *why,
                       size_t why_n)
{
    static const char *const names[3] = {"image", "text", "id"};
    parser p = {.s = s, .n = n, .arena = arena};
    field fields[3] = {{0}};
    skip_ws(&p);
    if (p.i >= p.n || p.s[p.i] != '{') {
        snprintf(why, why_n, "not a JSON object (a line is {\"image\": ..., \"text\": ...})");
        e->problem = MMP_PROBLEM_JSON;
        return 0;
    }
    int ok = parse_container(&p, 0, fields);
    if (ok) {
        skip_ws(&p);
        if (p.i < p.n) {
            ok = fail(&p, "unexpected data after the object");
        }
    }
    if (!ok) {
        snprintf(why, why_n, "%s", p.why);
        e->problem = p.kind;
        return 0;
    }
    for (int k = 0; k < 3; k++) {
        const field *f = &fields[k];
        if (f->count > 1) {
            snprintf(why, why_n, "duplicate field \"%s\"", names[k]);
            e->problem = MMP_PROBLEM_DUPLICATE_FIELD;
            return 0;
        }
        if (k < 2 && f->count == 0) {
            snprintf(why, why_n, "missing field \"%s\"", names[k]);
            e->problem = MMP_PROBLEM_MISSING_FIELD;
            return 0;
        }
        if (k < 2 && f->kind != K_STRING) {
            snprintf(why, why_n, "expected a string for \"%s\"", names[k]);
            e->problem = MMP_PROBLEM_FIELD_TYPE;
            return 0;
        }
        if (k == 2 && f->count && f->kind != K_STRING && f->kind != K_NUMBER) {
            snprintf(why, why_n, "expected a string or a number for \"id\"");
            e->problem = MMP_PROBLEM_FIELD_TYPE;
            return 0;
        }
        if (f->has_nul) {
            snprintf(why, why_n, "\"%s\" contains a NUL character (\\u0000)", names[k]);
            e->problem = MMP_PROBLEM_UTF8;
            return 0;
        }
    }
    if (fields[0].str[0] == 0) {
        snprintf(why, why_n, "empty image path");
        e->problem = MMP_PROBLEM_EMPTY_PATH;
        return 0;
    }
    if (blank(fields[1].str)) {
        snprintf(why, why_n, "empty caption");
        e->problem = MMP_PROBLEM_EMPTY_CAPTION;
        return 0;
    }
    e->image = fields[0].str;
    e->text = fields[1].str;
    e->id = fields[2].count ? fields[2].str : NULL;
    return 1;
}

const char *mmp_sample_problem_name(mmp_sample_problem p)
{
    static const char *const names[MMP_PROBLEM_KINDS] = {
        [MMP_PROBLEM_NONE] = "no problem",
        [MMP_PROBLEM_JSON] = "malformed JSON",
        [MMP_PROBLEM_MISSING_FIELD] = "missing field",
        [MMP_PROBLEM_FIELD_TYPE] = "non-string field",
        [MMP_PROBLEM_DUPLICATE_FIELD] = "duplicate field",
        [MMP_PROBLEM_UTF8] = "invalid UTF-8",
        [MMP_PROBLEM_EMPTY_PATH] = "empty image path",
        [MMP_PROBLEM_EMPTY_CAPTION] = "empty caption",
        [MMP_PROBLEM_LONG_LINE] = "line too long",
        [MMP_PROBLEM_MISSING_IMAGE] = "missing image",
        [MMP_PROBLEM_EMPTY_IMAGE] = "zero-size image",
        [MMP_PROBLEM_BAD_IMAGE] = "undecodable image",
        [MMP_PROBLEM_BAD_CAPTION] = "caption without tokens",
        [MMP_PROBLEM_LARGE_IMAGE] = "image over the pixel limit",
    };
    return p >= 0 && p < MMP_PROBLEM_KINDS && names[p] ? names[p] : "unknown problem";
}

void mmp_manifest_entry_fini(mmp_manifest_entry *e)
{
    if (!e) {
        return;
    }
    free(e->storage);
    memset(e, 0, sizeof *e);
}

mmp_err mmp_manifest_parse_line(const char *line, size_t len, mmp_manifest_entry *e)
{
    memset(e, 0, sizeof *e);
    e->length = len;
    char *arena = malloc(len + 1);
    if (!arena) {
        return mmp_errorf(MMP_ERR_NOMEM, "%zu bytes to parse a manifest line", len + 1);
    }
    char why[256];
    if (!parse_entry(line, len, arena, e, why, sizeof why)) {
        mmp_sample_problem kind = e->problem;
        free(arena);
        memset(e, 0, sizeof *e);
        e->problem = kind;
        return mmp_errorf(MMP_ERR_DATA, "%s", why);
    }
    e->storage = arena;
    return MMP_OK;
}

/* ---- the file ----------------------------------------------------------------- */

mmp_err mmp_manifest_scan(const char *path, mmp_manifest_visit visit, void *user)
{
    mmp_err ret = MMP_OK;
    char *line = NULL, *arena = NULL;
    size_t line_cap = 0, arena_cap = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    uint64_t offset = 0;
    for (int64_t lineno = 1;; lineno++) {
        errno = 0;
        ssize_t got = getline(&line, &line_cap, f);
        if (got < 0) {
            if (ferror(f)) {
                ret = mmp_errorf(MMP_ERR_IO, "%s:%lld: read failed: %s", path, (long long)lineno,
                                 strerror(errno));
            }
            break;
        }
        mmp_manifest_entry e = {.line = lineno, .offset = offset};
        offset += (uint64_t)got;
        size_t n = (size_t)got;
        char *s = line;
        if (n > 0 && s[n - 1] == '\n') {
            n--;
        }
        if (n > 0 && s[n - 1] == '\r') {
            n--;
        }
        if (lineno == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
            s += 3, n -= 3, e.offset += 3;
        }
        e.length = n;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t')) {
            k++;
        }
        if (k == n) {
            continue; /* blank lines are not samples */
        }
        char why[256];
        const char *problem = NULL;
        char full[2048];
        if (n > MMP_MANIFEST_MAX_LINE) {
            snprintf(why, sizeof why, "line longer than %d bytes", MMP_MANIFEST_MAX_LINE);
            problem = why;
            e.problem = MMP_PROBLEM_LONG_LINE;
        } else {
            if (arena_cap < n + 1) {
                free(arena);
                arena_cap = n + 1 > 4096 ? n + 1 : 4096;
                arena = malloc(arena_cap);
                if (!arena) {
                    ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes to parse a line", path, n);
                    break;
                }
            }
            if (!parse_entry(s, n, arena, &e, why, sizeof why)) {
                problem = why;
            }
        }
        if (problem) {
            snprintf(full, sizeof full, "%s:%lld: %s", path, (long long)lineno, problem);
            e.image = e.text = e.id = NULL;
        }
        ret = visit(user, &e, problem ? full : NULL);
        if (ret != MMP_OK) {
            break;
        }
    }
    free(line);
    free(arena);
    fclose(f);
    return ret;
}

mmp_err mmp_manifest_resolve(const char *manifest_path, const char *image, char *out, size_t n)
{
    const char *slash = strrchr(manifest_path, '/');
    int w;
    if (image[0] == '/' || !slash) {
        w = snprintf(out, n, "%s", image);
    } else {
        w = snprintf(out, n, "%.*s/%s", (int)(slash - manifest_path), manifest_path, image);
    }
    if (w < 0 || (size_t)w >= n) {
        return mmp_errorf(MMP_ERR_INVALID, "image path too long: %s", image);
    }
    return MMP_OK;
}

/* ---- the index ---------------------------------------------------------------- */

/* One uint64 per sample: the line's byte offset in the high 40 bits (files up
 * to 1 TiB) and its length in the low 24. Line numbers are not stored per
 * sample: line(i) = i + 1 + (lines before sample i that are not samples:
 * blank or left out), and that count changes only where such a line occurs,
 * so `jumps` records it at each change; a clean manifest has none. */
#define LENGTH_BITS 24
#define OFFSET_LIMIT (1ull << (64 - LENGTH_BITS))
_Static_assert(MMP_MANIFEST_MAX_LINE < (1 << LENGTH_BITS), "a line's length must fit its field");

/* Warnings for lines left out, before they are only counted. */
#define DROP_LOG_MAX 10

typedef struct line_jump {
    int64_t first; /* the first sample it applies to */
    int64_t extra; /* lines before that sample which are not samples */
} line_jump;

struct mmp_manifest {
    char *path;
    int fd;
    int64_t n, cap;
    uint64_t *slot; /* (n) offset << LENGTH_BITS | length */
    int64_t n_jumps, jumps_cap;
    line_jump *jumps;
    int64_t dropped; /* bad lines left out (skip) */
};

typedef struct open_state {
    mmp_manifest *m;
    mmp_manifest_visit check;
    void *user;
    int skip;
} open_state;

/* Grows *buf (of *cap elements of size elem) to hold at least need. */
static int grow(void **buf, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap) {
        return 1;
    }
    int64_t next = *cap ? 2 * *cap : 1024;
    void *p = realloc(*buf, (size_t)next * elem);
    if (!p) {
        return 0;
    }
    *buf = p;
    *cap = next;
    return 1;
}

static mmp_err drop_line(open_state *st, const char *why)
{
    mmp_manifest *m = st->m;
    if (m->dropped < DROP_LOG_MAX) {
        MMP_WARN("%s (left out: data.on_bad_sample is skip)", why);
    } else if (m->dropped == DROP_LOG_MAX) {
        MMP_WARN("%s: more bad lines left out, not listed", m->path);
    }
    m->dropped++;
    return MMP_OK;
}

static mmp_err index_line(void *user, const mmp_manifest_entry *e, const char *problem)
{
    open_state *st = user;
    mmp_manifest *m = st->m;
    if (problem) {
        return st->skip ? drop_line(st, problem) : mmp_errorf(MMP_ERR_DATA, "%s", problem);
    }
    if (st->check) {
        mmp_err ret = st->check(st->user, e, NULL);
        if (ret == MMP_ERR_DATA && st->skip) {
            return drop_line(st, mmp_last_error());
        }
        MMP_TRY(ret);
    }
    if (e->offset >= OFFSET_LIMIT) {
        return mmp_errorf(MMP_ERR_DATA, "%s:%lld: manifest larger than %llu bytes (split it)",
                          m->path, (long long)e->line, OFFSET_LIMIT);
    }
    /* Only a file that grew since it was counted needs more room. */
    if (!grow((void **)&m->slot, &m->cap, m->n + 1, sizeof *m->slot)) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: index of %lld samples", m->path,
                          (long long)(2 * m->cap));
    }
    const int64_t extra = e->line - 1 - m->n;
    const int64_t last = m->n_jumps ? m->jumps[m->n_jumps - 1].extra : 0;
    if (extra != last) {
        if (!grow((void **)&m->jumps, &m->jumps_cap, m->n_jumps + 1, sizeof *m->jumps)) {
            return mmp_errorf(MMP_ERR_NOMEM, "%s: line table of %lld entries", m->path,
                              (long long)(2 * m->jumps_cap));
        }
        m->jumps[m->n_jumps++] = (line_jump){.first = m->n, .extra = extra};
    }
    m->slot[m->n++] = e->offset << LENGTH_BITS | (uint64_t)e->length;
    return MMP_OK;
}

/* Lines in the file at path (its newlines, plus one for a last line without
 * one). The index is allocated once at this size: growing it by doubling
 * would leave freed copies resident when the allocator serves it from the
 * heap, making memory depend on allocation history. */
static mmp_err count_lines(const char *path, int64_t *out)
{
    enum { CHUNK = 1 << 18 };
    mmp_err ret = MMP_OK;
    *out = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return mmp_errorf(MMP_ERR_NOMEM, "%s: %d bytes to count lines", path, CHUNK);
    }
    int64_t lines = 0;
    char last = '\n';
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        if (got == 0) {
            break;
        }
        for (const char *p = buf, *end = buf + got; (p = memchr(p, '\n', (size_t)(end - p))); p++) {
            lines++;
        }
        last = buf[got - 1];
    }
    *out = lines + (last != '\n');
    free(buf);
    close(fd);
    return ret;
}

static mmp_err open_index(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                          void *user, int skip)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    mmp_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        return mmp_errorf(MMP_ERR_NOMEM, "manifest");
    }
    m->fd = -1;
    m->path = strdup(path);
    if (!m->path) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "manifest path");
        goto fail;
    }
    int64_t lines;
    ret = count_lines(path, &lines);
    if (ret != MMP_OK) {
        goto fail;
    }
    if (lines > 0) {
        m->slot = malloc((size_t)lines * sizeof *m->slot);
        if (!m->slot) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "%s: index of %lld lines (%zu bytes)", path,
                             (long long)lines, (size_t)lines * sizeof *m->slot);
            goto fail;
        }
        m->cap = lines;
    }
    open_state st = {.m = m, .check = check, .user = user, .skip = skip};
    ret = mmp_manifest_scan(path, index_line, &st);
    if (ret != MMP_OK) {
        goto fail;
    }
    if (m->n == 0) {
        ret = m->dropped ? mmp_errorf(MMP_ERR_DATA, "%s: no samples (all %lld lines are bad)", path,
                                      (long long)m->dropped)
                         : mmp_errorf(MMP_ERR_DATA, "%s: no samples (the manifest is empty)", path);
        goto fail;
    }
    if (m->dropped) {
        MMP_WARN("%s: %lld bad lines left out, %lld samples kept", path, (long long)m->dropped,
                 (long long)m->n);
    }
    /* Blank and left-out lines have slots; give them back (in place). */
    uint64_t *fit = realloc(m->slot, (size_t)m->n * sizeof *m->slot);
    if (fit) {
        m->slot = fit;
        m->cap = m->n;
    }
    m->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (m->fd < 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    *out = m;
    return MMP_OK;
fail:
    mmp_manifest_close(m);
    return ret;
}

mmp_err mmp_manifest_open(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                          void *user)
{
    return open_index(out, path, check, user, 0);
}

mmp_err mmp_manifest_open_skip(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                               void *user)
{
    return open_index(out, path, check, user, 1);
}

void mmp_manifest_close(mmp_manifest *m)
{
    if (!m) {
        return;
    }
    if (m->fd >= 0) {
        close(m->fd);
    }
    free(m->path);
    free(m->slot);
    free(m->jumps);
    free(m);
}

int64_t mmp_manifest_size(const mmp_manifest *m)
{
    return m->n;
}

int64_t mmp_manifest_dropped(const mmp_manifest *m)
{
    return m->dropped;
}

const char *mmp_manifest_path(const mmp_manifest *m)
{
    return m->path;
}

int64_t mmp_manifest_line(const mmp_manifest *m, int64_t i)
{
    MMP_ASSERT(i >= 0 && i < m->n);
    /* The last jump at or before i. */
    int64_t lo = 0, hi = m->n_jumps;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (m->jumps[mid].first <= i) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return i + 1 + (lo ? m->jumps[lo - 1].extra : 0);
}

size_t mmp_manifest_index_bytes(const mmp_manifest *m)
{
    return (size_t)m->cap * sizeof *m->slot + (size_t)m->jumps_cap * sizeof *m->jumps;
}

mmp_err mmp_manifest_read(const mmp_manifest *m, int64_t i, mmp_manifest_entry *e)
{
    memset(e, 0, sizeof *e);
    if (i < 0 || i >= m->n) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: sample %lld out of range [0, %lld)", m->path,
                          (long long)i, (long long)m->n);
    }
    const uint64_t offset = m->slot[i] >> LENGTH_BITS;
    const size_t len = (size_t)(m->slot[i] & ((1u << LENGTH_BITS) - 1));
    const long long line = mmp_manifest_line(m, i);
    char *buf = malloc(len + 1);
    if (!buf) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s:%lld: %zu bytes", m->path, line, len);
    }
    size_t done = 0;
    while (done < len) {
        ssize_t got = pread(m->fd, buf + done, len - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            free(buf);
            return mmp_errorf(MMP_ERR_IO, "%s:%lld: %s", m->path, line,
                              got < 0 ? strerror(errno) : "file shorter than when it was opened");
        }
        done += (size_t)got;
    }
    mmp_err ret = mmp_manifest_parse_line(buf, len, e);
    free(buf);
    if (ret != MMP_OK) {
        return mmp_error_prefix(ret, "%s:%lld: changed since it was opened", m->path, line);
    }
    e->line = line;
    e->offset = offset;
    return MMP_OK;
}
