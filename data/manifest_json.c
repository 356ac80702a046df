/* One manifest line: a small, strict RFC 8259 recursive-descent parser:
 * full syntax (escapes, \uXXXX with surrogate pairs to UTF-8, numbers,
 * literals, nested values skipped) so that a malformed line is caught where
 * it is malformed, not when the trainer reaches it. Every decoded string
 * lands in one arena the size of the line (a decoded string plus its NUL is
 * never longer than its quoted form), so parsing allocates once. */
#include "data/manifest_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int mmp_manifest_parse_entry(const char *s, size_t n, char *arena, mmp_manifest_entry *e, char *why,
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
        [MMP_PROBLEM_UTF8] = "text not UTF-8 or with a NUL",
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
    if (!mmp_manifest_parse_entry(line, len, arena, e, why, sizeof why)) {
        mmp_sample_problem kind = e->problem;
        free(arena);
        memset(e, 0, sizeof *e);
        e->problem = kind;
        return mmp_errorf(MMP_ERR_DATA, "%s", why);
    }
    e->storage = arena;
    return MMP_OK;
}
