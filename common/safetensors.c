/* safetensors reader and writer (see safetensors.h for the layout).
 *
 * The header is parsed by a small strict JSON parser for exactly the shape
 * the format allows (an object of tensor objects and one metadata object of
 * strings), not a general JSON library: every byte of an untrusted header
 * is either understood or refused with its offset. This file must never
 * allocate from a number it has not checked against the file's size. */
#include "common/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fsutil.h"
#include "common/json.h"

#define NAME_CAP ((int)sizeof(((mmp_ckpt_entry *)0)->name))

static const struct {
    const char *name;
    mmp_dtype dtype;
} DTYPES[] = {{"F32", MMP_F32}, {"I32", MMP_I32}, {"BF16", MMP_BF16}, {"F16", MMP_F16}};

static const char *dtype_st_name(mmp_dtype t)
{
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++) {
        if (DTYPES[i].dtype == t) {
            return DTYPES[i].name;
        }
    }
    return NULL;
}

mmp_err mmp_st_meta_set(mmp_st_meta *m, const char *key, const char *value)
{
    if (m->count >= MMP_ST_META_MAX || strlen(key) >= sizeof m->key[0] ||
        strlen(value) >= sizeof m->value[0]) {
        return mmp_errorf(MMP_ERR_INVALID, "safetensors metadata '%s': full or too long", key);
    }
    snprintf(m->key[m->count], sizeof m->key[0], "%s", key);
    snprintf(m->value[m->count], sizeof m->value[0], "%s", value);
    m->count++;
    return MMP_OK;
}

const char *mmp_st_meta_get(const mmp_st_meta *m, const char *key)
{
    for (int i = 0; m && i < m->count; i++) {
        if (strcmp(m->key[i], key) == 0) {
            return m->value[i];
        }
    }
    return NULL;
}

/* ---- writer ------------------------------------------------------------------ */

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_put(strbuf *s, const char *text)
{
    size_t n = strlen(text);
    if (s->oom) {
        return;
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1) {
            cap *= 2;
        }
        char *g = realloc(s->p, cap);
        if (!g) {
            s->oom = 1;
            return;
        }
        s->p = g;
        s->cap = cap;
    }
    memcpy(s->p + s->len, text, n + 1);
    s->len += n;
}

static void sb_string(strbuf *s, const char *text)
{
    char esc[6 * 256 + 1];
    sb_put(s, "\"");
    sb_put(s, mmp_json_escape(text, esc, sizeof esc));
    sb_put(s, "\"");
}

static mmp_err check_items(const mmp_st_item *items, int n)
{
    for (int i = 0; i < n; i++) {
        const char *name = items[i].name;
        size_t len = strlen(name);
        if (len == 0 || len >= (size_t)NAME_CAP || strcmp(name, "__metadata__") == 0) {
            return mmp_errorf(MMP_ERR_INVALID, "safetensors: bad tensor name '%s'", name);
        }
        if (!dtype_st_name(items[i].t->dtype) || items[i].t->device != MMP_DEV_CPU) {
            return mmp_errorf(MMP_ERR_INVALID, "safetensors: %s: not a CPU tensor of a known dtype",
                              name);
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(items[j].name, name) == 0) {
                return mmp_errorf(MMP_ERR_INVALID, "safetensors: tensor %s given twice", name);
            }
        }
    }
    return MMP_OK;
}

/* The JSON header for items, padded with spaces to a multiple of 8 bytes
 * after the 8-byte length, into s. */
static void build_header(strbuf *s, const mmp_st_item *items, int n, const mmp_st_meta *meta)
{
    char num[64];
    uint64_t off = 0;
    sb_put(s, "{");
    if (meta && meta->count > 0) {
        sb_put(s, "\"__metadata__\":{");
        for (int i = 0; i < meta->count; i++) {
            sb_put(s, i ? "," : "");
            sb_string(s, meta->key[i]);
            sb_put(s, ":");
            sb_string(s, meta->value[i]);
        }
        sb_put(s, "}");
    }
    for (int i = 0; i < n; i++) {
        const mmp_tensor *t = items[i].t;
        sb_put(s, i || (meta && meta->count > 0) ? "," : "");
        sb_string(s, items[i].name);
        sb_put(s, ":{\"dtype\":\"");
        sb_put(s, dtype_st_name(t->dtype));
        sb_put(s, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            sb_put(s, num);
        }
        uint64_t bytes = mmp_tensor_bytes(t);
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        sb_put(s, num);
        off += bytes;
    }
    sb_put(s, "}");
    while (!s->oom && (8 + s->len) % 8 != 0) {
        sb_put(s, " ");
    }
}

mmp_err mmp_safetensors_write(const char *path, const mmp_st_item *items, int n,
                              const mmp_st_meta *meta)
{
    MMP_TRY(check_items(items, n));
    mmp_err ret = MMP_OK;
    strbuf s = {0};
    mmp_atomic_file a;
    build_header(&s, items, n, meta);
    if (s.oom) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "safetensors header for %d tensors", n);
        goto exit;
    }
    MMP_TRY_GOTO(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE), ret, exit);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) {
        len[i] = (unsigned char)((uint64_t)s.len >> (8 * i)); /* little-endian on any host */
    }
    fwrite(len, 1, 8, a.f);
    fwrite(s.p, 1, s.len, a.f);
    for (int i = 0; i < n && !ferror(a.f); i++) {
        size_t bytes = mmp_tensor_bytes(items[i].t);
        if (bytes) {
            fwrite(items[i].t->data, 1, bytes, a.f);
        }
    }
    ret = mmp_atomic_commit(&a);
exit:
    free(s.p);
    return ret;
}

/* ---- header parser -------------------------------------------------------------- */

typedef struct parser {
    const char *path;
    const unsigned char *p, *begin, *end; /* the header bytes */
    mmp_err err;
} parser;

/* Records the first error, at the parser's position as a file offset. */
static int fail_at(parser *ps, const char *why, const char *name)
{
    if (ps->err == MMP_OK) {
        long long off = 8 + (long long)(ps->p - ps->begin);
        if (name) {
            ps->err = mmp_errorf(MMP_ERR_DATA, "%s:%lld: tensor %s: %s", ps->path, off, name, why);
        } else {
            ps->err = mmp_errorf(MMP_ERR_DATA, "%s:%lld: %s", ps->path, off, why);
        }
    }
    return 0;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) {
        ps->p++;
    }
}

static int expect(parser *ps, char c)
{
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != (unsigned char)c) {
        char why[48];
        snprintf(why, sizeof why, "expected '%c' in the JSON header", c);
        return fail_at(ps, why, NULL);
    }
    ps->p++;
    return 1;
}

/* Peeks at the next non-blank byte: 1 and consumes it when it is c. */
static int accept(parser *ps, char c)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (unsigned char)c) {
        ps->p++;
        return 1;
    }
    return 0;
}

static int hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
        if (d < 0) {
            return 0;
        }
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 1;
}

/* A JSON string into out (cap bytes with the NUL); too long is an error. */
static int parse_string(parser *ps, char *out, size_t cap)
{
    if (!expect(ps, '"')) {
        return 0;
    }
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned c = *ps->p++;
        char enc[4];
        size_t k = 1;
        enc[0] = (char)c;
        if (c < 0x20) {
            return fail_at(ps, "control character in a string", NULL);
        }
        if (c == '\\') {
            if (ps->p >= ps->end) {
                break;
            }
            c = *ps->p++;
            const char *simple = strchr("\"\\/bfnrt", (int)c);
            if (c && simple) {
                enc[0] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            } else if (c == 'u' && ps->end - ps->p >= 4 && hex4(ps->p, &c) && c != 0 &&
                       (c < 0xd800 || c > 0xdfff)) {
                ps->p += 4;
                /* UTF-8 of a BMP code point (no surrogate pairs in tensor names) */
                if (c < 0x80) {
                    enc[0] = (char)c;
                } else if (c < 0x800) {
                    enc[0] = (char)(0xc0 | (c >> 6)), enc[1] = (char)(0x80 | (c & 0x3f)), k = 2;
                } else {
                    enc[0] = (char)(0xe0 | (c >> 12)), enc[1] = (char)(0x80 | ((c >> 6) & 0x3f));
                    enc[2] = (char)(0x80 | (c & 0x3f)), k = 3;
                }
            } else {
                return fail_at(ps, "bad escape in a string", NULL);
            }
        }
        if (n + k >= cap) {
            return fail_at(ps, "string too long", NULL);
        }
        memcpy(out + n, enc, k);
        n += k;
    }
    if (ps->p >= ps->end) {
        return fail_at(ps, "unterminated string", NULL);
    }
    ps->p++;
    out[n] = 0;
    return 1;
}

/* A non-negative integer below 2^53 (what JSON numbers hold exactly). */
static int parse_uint(parser *ps, uint64_t *out, const char *name)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '-') {
        return fail_at(ps, "negative number", name);
    }
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') {
        return fail_at(ps, "expected a non-negative integer", name);
    }
    uint64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (uint64_t)(*ps->p++ - '0');
        if (v > (1ull << 53)) {
            return fail_at(ps, "number too large", name);
        }
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E')) {
        return fail_at(ps, "expected an integer", name);
    }
    *out = v;
    return 1;
}

/* One tensor as the header describes it, before its bytes are checked. */
typedef struct st_desc {
    char name[NAME_CAP];
    mmp_dtype dtype;
    int ndim;
    int64_t shape[MMP_MAX_DIMS];
    uint64_t begin, end;
    long long at; /* file offset of its entry, for errors */
} st_desc;

static int parse_tensor(parser *ps, st_desc *d)
{
    int seen_dtype = 0, seen_shape = 0, seen_off = 0;
    char key[32], dt[16];
    if (!expect(ps, '{')) {
        return 0;
    }
    if (accept(ps, '}')) {
        return fail_at(ps, "empty tensor entry", d->name);
    }
    do {
        if (!parse_string(ps, key, sizeof key) || !expect(ps, ':')) {
            return 0;
        }
        if (strcmp(key, "dtype") == 0 && !seen_dtype++) {
            if (!parse_string(ps, dt, sizeof dt)) {
                return 0;
            }
            size_t i = 0;
            while (i < sizeof DTYPES / sizeof DTYPES[0] && strcmp(DTYPES[i].name, dt) != 0) {
                i++;
            }
            if (i == sizeof DTYPES / sizeof DTYPES[0]) {
                return fail_at(ps, "dtype not one of F32, I32, BF16, F16", d->name);
            }
            d->dtype = DTYPES[i].dtype;
        } else if (strcmp(key, "shape") == 0 && !seen_shape++) {
            if (!expect(ps, '[')) {
                return 0;
            }
            if (!accept(ps, ']')) {
                do {
                    uint64_t v;
                    if (d->ndim == MMP_MAX_DIMS) {
                        return fail_at(ps, "more than 6 dimensions", d->name);
                    }
                    if (!parse_uint(ps, &v, d->name)) {
                        return 0;
                    }
                    d->shape[d->ndim++] = (int64_t)v;
                } while (accept(ps, ','));
                if (!expect(ps, ']')) {
                    return 0;
                }
            }
        } else if (strcmp(key, "data_offsets") == 0 && !seen_off++) {
            if (!expect(ps, '[') || !parse_uint(ps, &d->begin, d->name) || !expect(ps, ',') ||
                !parse_uint(ps, &d->end, d->name) || !expect(ps, ']')) {
                return 0;
            }
        } else {
            return fail_at(ps, "unknown or repeated key in a tensor entry", d->name);
        }
    } while (accept(ps, ','));
    if (!expect(ps, '}')) {
        return 0;
    }
    if (!seen_dtype || !seen_shape || !seen_off) {
        return fail_at(ps, "entry lacks dtype, shape or data_offsets", d->name);
    }
    return 1;
}

static int parse_meta(parser *ps, mmp_st_meta *meta)
{
    mmp_st_meta sink;
    memset(&sink, 0, sizeof sink);
    if (!meta) {
        meta = &sink;
    }
    if (!expect(ps, '{')) {
        return 0;
    }
    if (accept(ps, '}')) {
        return 1;
    }
    do {
        char key[sizeof meta->key[0]], value[sizeof meta->value[0]];
        if (!parse_string(ps, key, sizeof key) || !expect(ps, ':') ||
            !parse_string(ps, value, sizeof value)) {
            return 0;
        }
        if (mmp_st_meta_set(meta, key, value) != MMP_OK) {
            return fail_at(ps, "more than 16 metadata entries", NULL);
        }
    } while (accept(ps, ','));
    return expect(ps, '}');
}

/* The whole header into *descs (malloc'd, *n of them). */
static int parse_header(parser *ps, st_desc **descs, int *n, mmp_st_meta *meta)
{
    int cap = 0, seen_meta = 0;
    *descs = NULL;
    *n = 0;
    if (!expect(ps, '{')) {
        return 0;
    }
    if (!accept(ps, '}')) {
        do {
            char name[NAME_CAP];
            skip_ws(ps);
            long long at = 8 + (long long)(ps->p - ps->begin);
            if (!parse_string(ps, name, sizeof name) || !expect(ps, ':')) {
                return 0;
            }
            if (strcmp(name, "__metadata__") == 0) {
                if (seen_meta++) {
                    return fail_at(ps, "__metadata__ twice", NULL);
                }
                if (!parse_meta(ps, meta)) {
                    return 0;
                }
                continue;
            }
            if (name[0] == 0) {
                return fail_at(ps, "empty tensor name", NULL);
            }
            if (*n == cap) {
                cap = cap ? 2 * cap : 64;
                st_desc *g = realloc(*descs, (size_t)cap * sizeof *g);
                if (!g) {
                    ps->err = mmp_errorf(MMP_ERR_NOMEM, "%s: header of %d tensors", ps->path, cap);
                    return 0;
                }
                *descs = g;
            }
            st_desc *d = &(*descs)[(*n)++];
            memset(d, 0, sizeof *d);
            memcpy(d->name, name, sizeof name);
            d->at = at;
            if (!parse_tensor(ps, d)) {
                return 0;
            }
        } while (accept(ps, ','));
        if (!expect(ps, '}')) {
            return 0;
        }
    }
    skip_ws(ps);
    if (ps->p != ps->end) {
        return fail_at(ps, "bytes after the JSON header's object", NULL);
    }
    return 1;
}

/* ---- reader -------------------------------------------------------------------- */

static int by_name(const void *a, const void *b)
{
    return strcmp(((const st_desc *)a)->name, ((const st_desc *)b)->name);
}

static int by_begin(const void *a, const void *b)
{
    const st_desc *x = *(const st_desc *const *)a, *y = *(const st_desc *const *)b;
    if (x->begin != y->begin) {
        return x->begin < y->begin ? -1 : 1;
    }
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const mmp_ckpt_entry *)a)->name, ((const mmp_ckpt_entry *)b)->name);
}

/* Shapes, sizes and the tiling of the data against data_len bytes. */
static mmp_err check_descs(const char *path, st_desc *d, int n, uint64_t data_len)
{
    mmp_err ret = MMP_OK;
    for (int i = 0; i < n; i++) {
        uint64_t esize = mmp_dtype_size(d[i].dtype), numel = 1;
        int empty = 0;
        for (int k = 0; k < d[i].ndim; k++) {
            uint64_t s = (uint64_t)d[i].shape[k];
            empty |= s == 0;
            /* bounded by the data length, so the product never overflows */
            numel = s == 0 || numel == UINT64_MAX      ? numel
                    : numel > data_len / esize / s + 1 ? UINT64_MAX
                                                       : numel * s;
        }
        /* an empty tensor too: its other dims are multiplied out where it is used */
        uint64_t bytes = numel == UINT64_MAX ? UINT64_MAX : empty ? 0 : numel * esize;
        if (d[i].begin > d[i].end || d[i].end > data_len) {
            return mmp_errorf(MMP_ERR_DATA,
                              "%s:%lld: tensor %s: data_offsets [%llu, %llu] outside the %llu "
                              "data bytes (file truncated?)",
                              path, d[i].at, d[i].name, (unsigned long long)d[i].begin,
                              (unsigned long long)d[i].end, (unsigned long long)data_len);
        }
        if (bytes == UINT64_MAX) {
            return mmp_errorf(MMP_ERR_DATA,
                              "%s:%lld: tensor %s: shape and dtype make more bytes than the file "
                              "holds",
                              path, d[i].at, d[i].name);
        }
        if (bytes != d[i].end - d[i].begin) {
            return mmp_errorf(MMP_ERR_DATA,
                              "%s:%lld: tensor %s: shape and dtype make %llu bytes, data_offsets "
                              "span %llu",
                              path, d[i].at, d[i].name, (unsigned long long)bytes,
                              (unsigned long long)(d[i].end - d[i].begin));
        }
    }
    if (n > 1) { /* qsort and memcpy want real pointers even for nothing */
        qsort(d, (size_t)n, sizeof *d, by_name);
    }
    for (int i = 1; i < n; i++) {
        if (strcmp(d[i - 1].name, d[i].name) == 0) {
            return mmp_errorf(MMP_ERR_DATA, "%s:%lld: tensor %s appears twice", path, d[i].at,
                              d[i].name);
        }
    }
    const st_desc **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: %d tensors", path, n);
    }
    for (int i = 0; i < n; i++) {
        order[i] = &d[i];
    }
    if (n > 1) {
        qsort(order, (size_t)n, sizeof *order, by_begin);
    }
    uint64_t at = 0;
    for (int i = 0; i < n && ret == MMP_OK; i++) {
        if (order[i]->begin != at) {
            ret = mmp_errorf(MMP_ERR_DATA,
                             "%s:%lld: tensor %s: data starts at %llu, expected %llu (tensors "
                             "must tile the data with no gap or overlap)",
                             path, order[i]->at, order[i]->name,
                             (unsigned long long)order[i]->begin, (unsigned long long)at);
        }
        at = order[i]->end;
    }
    if (ret == MMP_OK && at != data_len) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: %llu bytes after the last tensor's data", path,
                         (unsigned long long)(data_len - at));
    }
    free(order);
    return ret;
}

mmp_err mmp_safetensors_read(mmp_ckpt *c, const char *path, mmp_st_meta *meta)
{
    mmp_err ret = MMP_OK;
    unsigned char *buf = NULL;
    st_desc *descs = NULL;
    int n = 0, old_count = c->count;
    if (meta) {
        memset(meta, 0, sizeof *meta);
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    struct stat st;
    unsigned char len8[8];
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: not a regular file", path);
        goto exit;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8 || fread(len8, 1, 8, f) != 8) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s:0: shorter than the 8-byte header length", path);
        goto exit;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) {
        hlen = hlen << 8 | len8[i];
    }
    if (hlen < 2 || hlen > MMP_ST_HEADER_MAX || hlen > size - 8) {
        ret =
            mmp_errorf(MMP_ERR_DATA,
                       "%s:0: header length %llu is impossible (file has %llu bytes, limit %u): "
                       "not a safetensors file, or truncated",
                       path, (unsigned long long)hlen, (unsigned long long)size, MMP_ST_HEADER_MAX);
        goto exit;
    }
    buf = malloc(size - 8 ? size - 8 : 1);
    if (!buf) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %llu bytes", path, (unsigned long long)size);
        goto exit;
    }
    if (fread(buf, 1, size - 8, f) != size - 8) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: short read", path);
        goto exit;
    }
    parser ps = {.path = path, .p = buf, .begin = buf, .end = buf + hlen, .err = MMP_OK};
    if (!parse_header(&ps, &descs, &n, meta)) {
        ret = ps.err;
        goto exit;
    }
    const unsigned char *data = buf + hlen;
    MMP_TRY_GOTO(check_descs(path, descs, n, size - 8 - hlen), ret, exit);
    mmp_ckpt_entry *grown = realloc(c->entries, (size_t)(c->count + n + 1) * sizeof *grown);
    if (!grown) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: index of %d tensors", path, n);
        goto exit;
    }
    c->entries = grown;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (int i = 0; i < n; i++) {
        if (mmp_ckpt_find(c, descs[i].name)) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%lld: tensor %s is already loaded", path,
                             descs[i].at, descs[i].name);
            goto exit;
        }
        mmp_ckpt_entry *e = &c->entries[c->count];
        memset(e, 0, sizeof *e);
        memcpy(e->name, descs[i].name, sizeof e->name);
        snprintf(e->file, sizeof e->file, "%s", base);
        if ((ret = mmp_tensor_init(&e->t, descs[i].dtype, descs[i].ndim, descs[i].shape)) !=
            MMP_OK) {
            goto exit;
        }
        if (descs[i].end > descs[i].begin) {
            memcpy(e->t.data, data + descs[i].begin, (size_t)(descs[i].end - descs[i].begin));
        }
        c->count++;
    }
    if (c->count > 1) {
        qsort(c->entries, (size_t)c->count, sizeof *c->entries, cmp_entry);
    }
exit:
    /* New entries sit after the old ones until the final sort: a failure
     * gives back exactly what this call added. */
    for (; ret != MMP_OK && c->count > old_count; c->count--) {
        mmp_tensor_fini(&c->entries[c->count - 1].t);
    }
    free(descs);
    free(buf);
    fclose(f);
    return ret;
}
