/* One key's value: a YAML node read by the key's type (where it stands in the
 * file, what it is, whether it is in range), the key's default, and its JSON
 * text. The walk that finds the nodes is common/schema.c.
 *
 * Every error names file:line:column (or the --set override it came from)
 * and the key, through mmp_schema_fail(). Nothing here prints or keeps
 * state between calls. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/schema_yaml.h"

/* ---- positions and errors -------------------------------------------------- */

int mmp_yaml_diag_count(struct fy_diag *diag)
{
    int n = 0;
    void *iter = NULL;
    while (fy_diag_errors_iterate(diag, &iter)) {
        n++;
    }
    return n;
}

struct fy_diag_error *mmp_yaml_diag_error(struct fy_diag *diag, int i)
{
    void *iter = NULL;
    struct fy_diag_error *e;
    while ((e = fy_diag_errors_iterate(diag, &iter)) != NULL) {
        if (i-- == 0) {
            return e;
        }
    }
    return NULL;
}

/* The public API gives marks only for scalar tokens, so collections are
 * located by asking libfyaml to report at the node and reading back the
 * position. */
/* Whether collection n is, or holds, one changed after parsing. */
static bool touched(const mmp_schema_loader *L, struct fy_node *n)
{
    if (!n || fy_node_get_type(n) == FYNT_SCALAR || L->n_touched == 0) {
        return false;
    }
    for (int k = 0; k < L->n_touched; k++) {
        if (L->touched[k] == n) {
            return true;
        }
    }
    void *iter = NULL;
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(n, &iter)) != NULL) {
            if (touched(L, item)) {
                return true;
            }
        }
        return false;
    }
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(n, &iter)) != NULL) {
        if (touched(L, fy_node_pair_value(pair))) {
            return true;
        }
    }
    return false;
}

/* The first scalar of collection n, keys included, in its order. */
static struct fy_node *first_scalar(struct fy_node *n)
{
    void *iter = NULL;
    while (n && fy_node_get_type(n) != FYNT_SCALAR) {
        struct fy_node *next = NULL;
        if (fy_node_get_type(n) == FYNT_SEQUENCE) {
            next = fy_node_sequence_iterate(n, &iter);
        } else {
            struct fy_node_pair *pair = fy_node_mapping_iterate(n, &iter);
            next = pair ? fy_node_pair_key(pair) : NULL;
        }
        n = next;
        iter = NULL;
    }
    return n;
}

bool mmp_yaml_node_mark(mmp_schema_loader *L, struct fy_node *n, int *line, int *col)
{
    n = mmp_yaml_original(L, n); /* a merge key's copy has no place of its own */
    if (n && touched(L, n)) {
        n = first_scalar(n);
    }
    if (!n) {
        return false;
    }
    if (fy_node_get_type(n) == FYNT_SCALAR) {
        struct fy_token *t = fy_node_get_scalar_token(n);
        const struct fy_mark *m = t ? fy_token_start_mark(t) : NULL;
        if (!m) {
            return false;
        }
        /* a quoted scalar's token starts after its opening quote */
        enum fy_node_style style = fy_node_get_style(n);
        bool quoted = style == FYNS_SINGLE_QUOTED || style == FYNS_DOUBLE_QUOTED;
        *line = m->line + 1;
        *col = m->column + 1 - (quoted && m->column > 0);
        return true;
    }
    int before = mmp_yaml_diag_count(L->diag);
    fy_diag_node_report(L->diag, n, FYET_ERROR, "position");
    struct fy_diag_error *e = mmp_yaml_diag_error(L->diag, before);
    if (!e || e->line <= 0) {
        return false;
    }
    *line = e->line;
    *col = e->column;
    return true;
}

void mmp_schema_site_text(mmp_schema_loader *L, mmp_schema_site at, char *buf, size_t size)
{
    if (at.origin >= 0) {
        snprintf(buf, size, "--set %s", L->overrides[at.origin]);
        return;
    }
    int line = 1, col = 1;
    if (!mmp_yaml_node_mark(L, at.node, &line, &col)) {
        mmp_yaml_node_mark(L, at.key, &line, &col);
    }
    snprintf(buf, size, "%s:%d:%d", L->path, line, col);
}

mmp_err mmp_schema_fail(mmp_schema_loader *L, mmp_schema_site at, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char where[PATH_MAX + 64];
    mmp_schema_site_text(L, at, where, sizeof where);
    return mmp_errorf(MMP_ERR_CONFIG, "%s: %s", where, msg);
}

/* ---- nodes ------------------------------------------------------------------ */

bool mmp_yaml_is_scalar(struct fy_node *n)
{
    return n && fy_node_get_type(n) == FYNT_SCALAR;
}

bool mmp_yaml_is_plain(struct fy_node *n)
{
    enum fy_node_style s = fy_node_get_style(n);
    return s == FYNS_PLAIN || s == FYNS_ANY;
}

bool mmp_yaml_is_null(struct fy_node *n)
{
    if (!n) {
        return true;
    }
    if (!mmp_yaml_is_scalar(n) || !mmp_yaml_is_plain(n)) {
        return false;
    }
    size_t len;
    const char *s = fy_node_get_scalar(n, &len);
    if (!s || len == 0) {
        return true;
    }
    static const char *const nulls[] = {"~", "null", "Null", "NULL"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
        if (len == strlen(nulls[i]) && memcmp(s, nulls[i], len) == 0) {
            return true;
        }
    }
    return false;
}

bool mmp_yaml_scalar_text(struct fy_node *n, char *buf, size_t size)
{
    size_t len = 0;
    const char *s = fy_node_get_scalar(n, &len);
    if (!s) {
        s = "";
        len = 0;
    }
    if (len >= size || memchr(s, 0, len)) {
        return false;
    }
    memcpy(buf, s, len);
    buf[len] = 0;
    return true;
}

const char *mmp_yaml_describe(struct fy_node *n, char *buf, size_t size)
{
    if (mmp_yaml_is_null(n)) {
        return "nothing";
    }
    if (fy_node_get_type(n) == FYNT_MAPPING) {
        return "a mapping";
    }
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        return "a list";
    }
    size_t len;
    const char *s = fy_node_get_scalar(n, &len);
    int shown = len > 40 ? 40 : (int)len;
    const char *more = len > 40 ? "..." : "";
    if (mmp_yaml_is_plain(n)) {
        snprintf(buf, size, "'%.*s%s'", shown, s, more);
    } else {
        snprintf(buf, size, "the quoted string \"%.*s%s\"", shown, s, more);
    }
    return buf;
}

const char *mmp_schema_describe(mmp_schema_site at, char *buf, size_t size)
{
    return mmp_yaml_describe(at.node, buf, size);
}

bool mmp_schema_is_mapping(mmp_schema_site at)
{
    return at.node && fy_node_get_type(at.node) == FYNT_MAPPING;
}

int mmp_schema_items(mmp_schema_site at)
{
    if (!at.node || fy_node_get_type(at.node) != FYNT_SEQUENCE) {
        return -1;
    }
    return fy_node_sequence_item_count(at.node);
}

bool mmp_schema_next_item(mmp_schema_site list, void **iter, mmp_schema_site *item)
{
    struct fy_node *n = fy_node_sequence_iterate(list.node, iter);
    *item = (mmp_schema_site){.node = n, .key = list.node, .origin = list.origin};
    return n != NULL;
}

bool mmp_schema_next_pair(mmp_schema_site map, void **iter, mmp_schema_site *key,
                          mmp_schema_site *value)
{
    struct fy_node_pair *pair = fy_node_mapping_iterate(map.node, iter);
    if (!pair) {
        return false;
    }
    struct fy_node *k = fy_node_pair_key(pair);
    *key = (mmp_schema_site){.node = k, .key = k, .origin = map.origin};
    *value = (mmp_schema_site){.node = fy_node_pair_value(pair), .key = k, .origin = map.origin};
    return true;
}

bool mmp_schema_text(mmp_schema_site at, char *buf, size_t size, bool *plain)
{
    if (plain) {
        *plain = mmp_yaml_is_scalar(at.node) && mmp_yaml_is_plain(at.node);
    }
    return mmp_yaml_is_scalar(at.node) && mmp_yaml_scalar_text(at.node, buf, size);
}

/* ---- scalar values --------------------------------------------------------- */

bool mmp_schema_is_integer(const char *s)
{
    s += *s == '-' || *s == '+';
    return *s && strspn(s, "0123456789") == strlen(s);
}

mmp_err mmp_schema_parse_int(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                             long long lo, long long hi, long long *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    if (!mmp_yaml_is_scalar(n) || !mmp_yaml_is_plain(n) || mmp_yaml_is_null(n) ||
        !mmp_yaml_scalar_text(n, text, sizeof text) || !mmp_schema_is_integer(text)) {
        return mmp_schema_fail(L, at, "%s: expected an integer, got %s", name,
                               mmp_yaml_describe(n, got, sizeof got));
    }
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) {
        return mmp_schema_fail(L, at, "%s: %s is out of range [%lld, %lld]", name, text, lo, hi);
    }
    *out = v;
    return MMP_OK;
}

static mmp_err parse_float(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                           const mmp_key_spec *k, double *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    char *end = NULL;
    double v = 0;
    if (mmp_yaml_is_scalar(n) && mmp_yaml_is_plain(n) && !mmp_yaml_is_null(n) &&
        mmp_yaml_scalar_text(n, text, sizeof text) &&
        strspn(text, "0123456789+-.eE") == strlen(text)) {
        errno = 0;
        v = strtod(text, &end);
    }
    if (!end || end == text || *end != 0) {
        return mmp_schema_fail(L, at, "%s: expected a number, got %s", name,
                               mmp_yaml_describe(n, got, sizeof got));
    }
    bool lo_ok = k->lo_bracket == '(' ? v > k->fmin : v >= k->fmin;
    bool hi_ok = k->hi_bracket == ')' ? v < k->fmax : v <= k->fmax;
    if (errno == ERANGE || !isfinite(v) || !lo_ok || !hi_ok) {
        return mmp_schema_fail(L, at, "%s: %s is out of range %c%g, %g%c", name, text,
                               k->lo_bracket, k->fmin, k->fmax, k->hi_bracket);
    }
    *out = v;
    return MMP_OK;
}

static mmp_err parse_bool(mmp_schema_loader *L, const char *name, mmp_schema_site at, int *out)
{
    static const char *const yes[] = {"true", "True", "TRUE"};
    static const char *const no[] = {"false", "False", "FALSE"};
    char text[16], got[96];
    struct fy_node *n = at.node;
    if (mmp_yaml_is_scalar(n) && mmp_yaml_is_plain(n) &&
        mmp_yaml_scalar_text(n, text, sizeof text)) {
        for (int i = 0; i < 3; i++) {
            if (strcmp(text, yes[i]) == 0 || strcmp(text, no[i]) == 0) {
                *out = strcmp(text, yes[i]) == 0;
                return MMP_OK;
            }
        }
    }
    return mmp_schema_fail(L, at, "%s: expected true or false, got %s", name,
                           mmp_yaml_describe(n, got, sizeof got));
}

static mmp_err parse_enum(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                          const char *const *names, int *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    if (!mmp_yaml_is_scalar(n) || mmp_yaml_is_null(n)) {
        return mmp_schema_fail(L, at, "%s: expected a name, got %s", name,
                               mmp_yaml_describe(n, got, sizeof got));
    }
    if (mmp_yaml_scalar_text(n, text, sizeof text)) {
        for (int i = 0; names[i]; i++) {
            if (strcmp(text, names[i]) == 0) {
                *out = i;
                return MMP_OK;
            }
        }
    }
    char accepted[256] = "";
    for (int i = 0; names[i]; i++) {
        size_t used = strlen(accepted);
        snprintf(accepted + used, sizeof accepted - used, "%s%s", i ? ", " : "", names[i]);
    }
    return mmp_schema_fail(L, at, "%s: unknown value %s (accepted: %s)", name,
                           mmp_yaml_describe(n, got, sizeof got), accepted);
}

mmp_err mmp_schema_parse_string(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                                char *out, size_t size)
{
    char got[96];
    struct fy_node *n = at.node;
    if (!mmp_yaml_is_scalar(n) || mmp_yaml_is_null(n)) {
        return mmp_schema_fail(L, at, "%s: expected a string, got %s", name,
                               mmp_yaml_describe(n, got, sizeof got));
    }
    if (!mmp_yaml_scalar_text(n, out, size)) {
        return mmp_schema_fail(L, at,
                               "%s: expected a string of at most %zu bytes without NUL characters",
                               name, size - 1);
    }
    return MMP_OK;
}

/* ---- fields ------------------------------------------------------------------ */

static void *field_of(void *obj, const mmp_key_spec *k)
{
    return (char *)obj + k->field;
}

static const void *cfield_of(const void *obj, const mmp_key_spec *k)
{
    return (const char *)obj + k->field;
}

static void store_int(void *obj, const mmp_key_spec *k, long long v)
{
    if (k->size == sizeof(long long)) {
        *(long long *)field_of(obj, k) = v;
    } else {
        *(int *)field_of(obj, k) = (int)v;
    }
}

static void store_count(void *obj, const mmp_key_spec *k, int n)
{
    if (k->count_field != MMP_KEY_NO_FIELD) {
        *(int *)((char *)obj + k->count_field) = n;
    }
}

/* ---- lists ------------------------------------------------------------------- */

mmp_err mmp_schema_check_list(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                              int min_len, int max_len, int *count)
{
    char got[96];
    int n = mmp_schema_items(at);
    if (n < 0) {
        return mmp_schema_fail(L, at, "%s: expected a list, got %s", name,
                               mmp_yaml_describe(at.node, got, sizeof got));
    }
    if (min_len == max_len && n != min_len) {
        return mmp_schema_fail(L, at, "%s: expected %d values, got %d", name, min_len, n);
    }
    if (n < min_len || n > max_len) {
        return mmp_schema_fail(L, at, "%s: expected %d to %d values, got %d", name, min_len,
                               max_len, n);
    }
    *count = n;
    return MMP_OK;
}

static mmp_err load_list(mmp_schema_loader *L, void *obj, int idx, mmp_schema_site at)
{
    const mmp_key_spec *k = &L->schema->keys[idx];
    int n;
    if (k->scalar_ok && mmp_yaml_is_scalar(at.node)) {
        long long v = 0;
        MMP_TRY(mmp_schema_parse_int(L, k->path, at, k->imin, k->imax, &v));
        ((int *)field_of(obj, k))[0] = (int)v;
        store_count(obj, k, 1);
        L->keys[idx].list_len = 1;
        return MMP_OK;
    }
    MMP_TRY(mmp_schema_check_list(L, k->path, at, k->min_len, (int)k->size, &n));
    void *iter = NULL;
    mmp_schema_site is;
    for (int i = 0; mmp_schema_next_item(at, &iter, &is); i++) {
        char name[MMP_SCHEMA_KEY_MAX];
        snprintf(name, sizeof name, "%s[%d]", k->path, i);
        if (k->type == MMP_KEY_INT_LIST) {
            long long v = 0;
            int *out = field_of(obj, k);
            MMP_TRY(mmp_schema_parse_int(L, name, is, k->imin, k->imax, &v));
            if (k->increasing && i > 0 && v <= out[i - 1]) {
                return mmp_schema_fail(L, is, "%s: %lld must be greater than the %s before it (%d)",
                                       name, v, k->increasing, out[i - 1]);
            }
            out[i] = (int)v;
        } else {
            double v = 0;
            MMP_TRY(parse_float(L, name, is, k, &v));
            ((float *)field_of(obj, k))[i] = (float)v;
        }
    }
    store_count(obj, k, n);
    L->keys[idx].list_len = n;
    return MMP_OK;
}

/* ---- a key's value ------------------------------------------------------------ */

mmp_err mmp_schema_load_value(mmp_schema_loader *L, void *obj, int idx, mmp_schema_site at)
{
    const mmp_key_spec *k = &L->schema->keys[idx];
    L->keys[idx].seen = true;
    L->keys[idx].site = at;
    switch (k->type) {
    case MMP_KEY_INT: {
        long long v = 0;
        MMP_TRY(mmp_schema_parse_int(L, k->path, at, k->imin, k->imax, &v));
        store_int(obj, k, v);
        return MMP_OK;
    }
    case MMP_KEY_FLOAT: {
        double v = 0;
        MMP_TRY(parse_float(L, k->path, at, k, &v));
        *(float *)field_of(obj, k) = (float)v;
        return MMP_OK;
    }
    case MMP_KEY_STRING:
        return mmp_schema_parse_string(L, k->path, at, field_of(obj, k), k->size);
    case MMP_KEY_BOOL:
        return parse_bool(L, k->path, at, field_of(obj, k));
    case MMP_KEY_ENUM: {
        int v = 0;
        MMP_TRY(parse_enum(L, k->path, at, k->names, &v));
        if (k->field != MMP_KEY_NO_FIELD) {
            *(int *)field_of(obj, k) = v;
        }
        return MMP_OK;
    }
    case MMP_KEY_INT_LIST:
    case MMP_KEY_FLOAT_LIST:
        return load_list(L, obj, idx, at);
    case MMP_KEY_CUSTOM:
        return k->load(L, obj, at);
    }
    return mmp_errorf(MMP_ERR_INTERNAL, "key %s has no type", k->path);
}

void mmp_schema_defaults(const mmp_schema *s, void *obj)
{
    for (int i = 0; i < s->n_keys; i++) {
        const mmp_key_spec *k = &s->keys[i];
        if (k->field == MMP_KEY_NO_FIELD) {
            continue;
        }
        switch (k->type) {
        case MMP_KEY_INT:
            store_int(obj, k, (long long)k->def);
            break;
        case MMP_KEY_FLOAT:
            *(float *)field_of(obj, k) = (float)k->def;
            break;
        case MMP_KEY_STRING:
            snprintf(field_of(obj, k), k->size, "%s", k->def_str);
            break;
        case MMP_KEY_BOOL:
        case MMP_KEY_ENUM:
            *(int *)field_of(obj, k) = (int)k->def;
            break;
        case MMP_KEY_INT_LIST:
        case MMP_KEY_FLOAT_LIST:
            for (int j = 0; j < k->def_len; j++) {
                if (k->type == MMP_KEY_INT_LIST) {
                    ((int *)field_of(obj, k))[j] = (int)k->def_list[j];
                } else {
                    ((float *)field_of(obj, k))[j] = (float)k->def_list[j];
                }
            }
            store_count(obj, k, k->def_len);
            break;
        case MMP_KEY_CUSTOM:
            break;
        }
    }
}

/* ---- JSON ----------------------------------------------------------------------- */

void mmp_schema_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c == '\t') {
            fputs("\\t", f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

/* The shortest %g that reads back as the same float. */
static void put_float(FILE *f, float v)
{
    char buf[32];
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) {
            break;
        }
    }
    fputs(buf, f);
}

void mmp_schema_put_json(FILE *f, const mmp_key_spec *k, const void *obj)
{
    if (k->type == MMP_KEY_ENUM && k->field == MMP_KEY_NO_FIELD) {
        mmp_schema_put_string(f, k->names[0]); /* checked only: its one accepted value */
        return;
    }
    switch (k->type) {
    case MMP_KEY_INT:
        fprintf(f, "%lld",
                k->size == sizeof(long long) ? *(const long long *)cfield_of(obj, k)
                                             : (long long)*(const int *)cfield_of(obj, k));
        break;
    case MMP_KEY_FLOAT:
        put_float(f, *(const float *)cfield_of(obj, k));
        break;
    case MMP_KEY_STRING:
        mmp_schema_put_string(f, cfield_of(obj, k));
        break;
    case MMP_KEY_BOOL:
        fputs(*(const int *)cfield_of(obj, k) ? "true" : "false", f);
        break;
    case MMP_KEY_ENUM: {
        int v = *(const int *)cfield_of(obj, k), n = 0;
        while (k->names[n]) {
            n++;
        }
        mmp_schema_put_string(f, v >= 0 && v < n ? k->names[v] : "?");
        break;
    }
    case MMP_KEY_INT_LIST:
    case MMP_KEY_FLOAT_LIST: {
        int n = k->count_field != MMP_KEY_NO_FIELD
                    ? *(const int *)((const char *)obj + k->count_field)
                    : (int)k->size;
        fputc('[', f);
        for (int i = 0; i < n && i < (int)k->size; i++) {
            fputs(i ? ", " : "", f);
            if (k->type == MMP_KEY_INT_LIST) {
                fprintf(f, "%d", ((const int *)cfield_of(obj, k))[i]);
            } else {
                put_float(f, ((const float *)cfield_of(obj, k))[i]);
            }
        }
        fputc(']', f);
        break;
    }
    case MMP_KEY_CUSTOM:
        k->put_json(f, obj);
        break;
    }
}
