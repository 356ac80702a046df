/* The plan file: YAML parsed with libfyaml into an mmp_plan, checked against
 * one schema table.
 *
 * keys[] lists every leaf key once (dotted path, type, range, default, place
 * in mmp_plan). Defaults, parsing, "did you mean" hints and the JSON
 * rendering all walk that table, so a key added there is parsed, defaulted
 * and written without another edit. Every error names file:line:column (or
 * the --set override it came from) and the dotted key, and goes up through
 * mmp_errorf(). This file never prints (libfyaml's diagnostics are collected,
 * not written to stderr), never exits, and keeps no state between calls. */
#include "common/config.h"

#include <assert.h>
#include <errno.h>
#include <libfyaml.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/utf8.h"

/* ---- the schema ----------------------------------------------------------- */

typedef enum key_type {
    T_INT,        /* int or long long field (size tells which) */
    T_FLOAT,      /* float field */
    T_STRING,     /* char[size] field */
    T_BOOL,       /* int field, 0 or 1 */
    T_ENUM,       /* enum field; names[value] is its spelling */
    T_INT_LIST,   /* int[size]; count in count_field, or exactly size entries */
    T_FLOAT_LIST, /* float[size], exactly size entries */
    T_HOSTS,      /* the hosts sequence: n_hosts + hosts[] */
} key_type;

#define NO_FIELD ((size_t)-1)

typedef struct key_spec {
    const char *path; /* "train.optimizer.lr" */
    key_type type;
    size_t field;         /* offset in mmp_plan; NO_FIELD for keys checked but not stored */
    size_t size;          /* T_INT: bytes of the field; T_STRING: bytes; lists: capacity */
    size_t count_field;   /* variable-length lists: offset of the int count; else NO_FIELD */
    int min_len;          /* lists: fewest entries (capacity is the most) */
    long long imin, imax; /* T_INT, T_INT_LIST entries: closed range */
    double fmin, fmax;    /* T_FLOAT, T_FLOAT_LIST entries */
    char lo_bracket, hi_bracket; /* '[' / ']' closed, '(' / ')' open */
    bool increasing;             /* list entries strictly increasing */
    bool required;
    bool scalar_ok;           /* T_INT_LIST: a plain number is a one-entry list */
    const char *const *names; /* T_ENUM: NULL-terminated, index = value */
    double def;               /* numbers, bools, enum values */
    const char *def_str;
    const double *def_list;
    int def_len;
} key_spec;

static const char *const schedule_names[] = {"gpipe", "1f1b", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "fp16", NULL};
static const char *const balance_names[] = {"off", "dynamic", NULL};
static const char *const routing_names[] = {"weighted", "round_robin", NULL};
static const char *const bad_sample_names[] = {"fail", "skip", NULL};
static const char *const compute_names[] = {"real", "simulated", NULL};
static const char *const layers_names[] = {"all", NULL}; /* only whole branches, for now */

static_assert(MMP_SCHED_GPIPE == 0 && MMP_SCHED_1F1B == 1, "schedule_names order");
static_assert(MMP_PREC_FP32 == 0 && MMP_PREC_BF16 == 1 && MMP_PREC_FP16 == 2,
              "precision_names order");
static_assert(MMP_BALANCE_OFF == 0 && MMP_BALANCE_DYNAMIC == 1, "balance_names order");
static_assert(MMP_BAD_FAIL == 0 && MMP_BAD_SKIP == 1, "bad_sample_names order");
static_assert(MMP_COMPUTE_REAL == 0 && MMP_COMPUTE_SIMULATED == 1, "compute_names order");
/* Enum fields are stored through an int pointer. */
static_assert(sizeof(mmp_schedule) == sizeof(int) && sizeof(mmp_precision) == sizeof(int) &&
                  sizeof(mmp_balance_mode) == sizeof(int) && sizeof(mmp_bad_sample) == sizeof(int) &&
                  sizeof(mmp_compute) == sizeof(int),
              "enum fields are int-sized");

static const double imagenet_mean[] = {0.485, 0.456, 0.406};
static const double imagenet_std[] = {0.229, 0.224, 0.225};
static const double image_blocks_def[] = {1, 1, 1, 1};
static const double one_def[] = {1};
static const double image_channels_def[] = {16, 32, 64, 128};

#define OFF(m) offsetof(mmp_plan, m)
#define SIZE(m) sizeof(((mmp_plan *)0)->m)
#define LEN(m) (SIZE(m) / sizeof(((mmp_plan *)0)->m[0]))
#define DEFS(a) .def_list = a, .def_len = (int)(sizeof a / sizeof a[0])

#define INT(k, m, lo, hi, d)                                                                       \
    {.path = k, .type = T_INT, .field = OFF(m), .size = SIZE(m), .imin = lo, .imax = hi, .def = d}
#define FLOAT(k, m, lb, lo, hi, hb, d)                                                             \
    {.path = k, .type = T_FLOAT, .field = OFF(m), .fmin = lo, .fmax = hi, .lo_bracket = lb,        \
     .hi_bracket = hb, .def = d}
#define STR(k, m, d, req)                                                                          \
    {.path = k, .type = T_STRING, .field = OFF(m), .size = SIZE(m), .def_str = d, .required = req}
#define BOOL(k, m, d) {.path = k, .type = T_BOOL, .field = OFF(m), .def = d}
#define ENUM(k, m, n, d) {.path = k, .type = T_ENUM, .field = OFF(m), .names = n, .def = d}
#define CHECKED_ENUM(k, n) {.path = k, .type = T_ENUM, .field = NO_FIELD, .names = n}
#define INTS(k, m, count, minlen, lo, hi, incr, ...)                                               \
    {.path = k, .type = T_INT_LIST, .field = OFF(m), .size = LEN(m), .count_field = OFF(count),   \
     .min_len = minlen, .imin = lo, .imax = hi, .increasing = incr, __VA_ARGS__}
#define FLOATS(k, m, lb, lo, hi, hb, defs)                                                         \
    {.path = k, .type = T_FLOAT_LIST, .field = OFF(m), .size = LEN(m), .count_field = NO_FIELD,   \
     .min_len = (int)LEN(m), .fmin = lo, .fmax = hi, .lo_bracket = lb, .hi_bracket = hb,          \
     DEFS(defs)}
#define FLOAT_VEC(k, m, count, minlen, lb, lo, hi, hb)                                             \
    {.path = k, .type = T_FLOAT_LIST, .field = OFF(m), .size = LEN(m), .count_field = OFF(count), \
     .min_len = minlen, .fmin = lo, .fmax = hi, .lo_bracket = lb, .hi_bracket = hb}

/* Sections are contiguous: the JSON writer opens and closes objects as the
 * path prefix changes. Defaults follow config.h; min_lr, val_manifest and
 * vocab are resolved from other keys after loading (resolve_defaults). */
static const key_spec keys[] = {
    STR("job.name", job.name, "job", false),
    INT("job.steps", job.steps, 1, 1000000000, 100),
    INT("job.seed", job.seed, 0, LLONG_MAX, 1),

    STR("data.manifest", data.manifest, "", true),
    STR("data.val_manifest", data.val_manifest, "", false),
    STR("data.vocab", data.vocab, "", false),
    INT("data.image_size", data.image_size, 8, 1024, 32),
    INT("data.max_text_len", data.max_text_len, 4, 512, 32),
    FLOATS("data.mean", data.mean, '[', -1000, 1000, ']', imagenet_mean),
    FLOATS("data.std", data.std, '(', 0, 1000, ']', imagenet_std),
    INT("data.workers", data.workers, 0, 64, 1),
    ENUM("data.on_bad_sample", data.on_bad_sample, bad_sample_names, MMP_BAD_FAIL),
    INT("data.val_samples", data.val_samples, 0, 1000000000, 256),
    BOOL("data.augment", data.augment, 0),

    INT("model.width", model.width, 1, 16384, 64),
    /* blocks and channels share n_stages; their lengths must agree (check_plan) */
    INTS("model.image.blocks", model.image.blocks, model.image.n_stages, 1, 1, 64, false,
         DEFS(image_blocks_def)),
    INTS("model.image.channels", model.image.channels, model.image.n_stages, 1, 1, 4096, false,
         DEFS(image_channels_def)),
    BOOL("model.image.stem_pool", model.image.stem_pool, 0),
    INT("model.text.layers", model.text.layers, 1, 256, 2),
    INT("model.text.heads", model.text.heads, 1, 256, 4),
    INT("model.text.ffn_mult", model.text.ffn_mult, 1, 64, 4),
    INT("model.fusion.layers", model.fusion.layers, 1, 64, 1),
    INT("model.fusion.heads", model.fusion.heads, 1, 256, 4),

    INT("train.batch", train.batch, 1, 1 << 20, 64),
    INT("train.microbatches", train.microbatches, 1, MMP_MAX_MICROBATCHES, 4),
    ENUM("train.schedule", train.schedule, schedule_names, MMP_SCHED_1F1B),
    ENUM("train.precision", train.precision, precision_names, MMP_PREC_FP32),
    FLOAT("train.optimizer.lr", train.optimizer.lr, '(', 0, 10, ']', 1e-3),
    FLOAT("train.optimizer.min_lr", train.optimizer.min_lr, '[', 0, 10, ']', 1e-4),
    FLOAT("train.optimizer.weight_decay", train.optimizer.weight_decay, '[', 0, 10, ']', 0.05),
    INT("train.optimizer.warmup", train.optimizer.warmup, 0, 1000000000, 20),
    FLOAT("train.optimizer.beta1", train.optimizer.beta1, '[', 0, 1, ')', 0.9),
    FLOAT("train.optimizer.beta2", train.optimizer.beta2, '[', 0, 1, ')', 0.999),
    FLOAT("train.optimizer.eps", train.optimizer.eps, '(', 0, 1, ']', 1e-8),
    FLOAT("train.clip_grad_norm", train.clip_grad_norm, '[', 0, 1e6, ']', 1.0),
    INT("train.eval_every", train.eval_every, 0, 1000000000, 50),
    BOOL("train.final_eval", train.final_eval, 1),
    INT("train.ckpt_every", train.ckpt_every, 0, 1000000000, 50),
    INT("train.ckpt_keep", train.ckpt_keep, 0, 1000000000, 3),
    INT("train.stall_timeout", train.stall_timeout, 0, 86400, 60),
    INT("train.max_restarts", train.max_restarts, 0, 1000, 0),
    INT("train.threads", train.threads, 1, 256, 1),
    FLOAT("train.init_temperature", train.init_temperature, '(', 0, 10, ']', 0.07),

    ENUM("balance.mode", balance.mode, balance_names, MMP_BALANCE_OFF),
    ENUM("balance.routing", balance.routing, routing_names, MMP_ROUTE_WEIGHTED),
    INT("balance.window", balance.window, 1, 1000, 3),
    FLOAT("balance.min_gain", balance.min_gain, '[', 0, 10, ']', 0.1),
    INT("balance.force.step", balance.force.step, 0, 1000000000, 0),
    STR("balance.force.set", balance.force.set, "", false),

    ENUM("compute", compute, compute_names, MMP_COMPUTE_REAL),
    FLOAT("sim.cost.image", sim.cost.image, '[', 0, 1e6, ']', 0),
    FLOAT("sim.cost.text", sim.cost.text, '[', 0, 1e6, ']', 0),
    FLOAT("sim.cost.fusion", sim.cost.fusion, '[', 0, 1e6, ']', 0),
    FLOAT("sim.bwd_factor", sim.bwd_factor, '[', 0, 1000, ']', 2),
    /* per device slot; empty = 1.0 everywhere */
    FLOAT_VEC("sim.slowdown", sim.slowdown, sim.n_slowdown, 0, '(', 0, 1000, ']'),
    INT("sim.change_step", sim.change_step, 0, 1000000000, 0),
    /* defaults are the sim.cost.* values (resolve_defaults) */
    FLOAT("sim.change.image", sim.change.image, '[', 0, 1e6, ']', 0),
    FLOAT("sim.change.text", sim.change.text, '[', 0, 1e6, ']', 0),
    FLOAT("sim.change.fusion", sim.change.fusion, '[', 0, 1e6, ']', 0),

    {.path = "hosts", .type = T_HOSTS, .field = NO_FIELD},

    INTS("stages.image.replicas", stages.image.replicas, stages.image.n_replicas, 1, 1, MMP_MAX_REPLICAS,
         false, DEFS(one_def), .scalar_ok = true),
    INTS("stages.image.split", stages.image.split, stages.image.n_split, 0, 1, 4096, true),
    CHECKED_ENUM("stages.image.layers", layers_names),
    INTS("stages.text.replicas", stages.text.replicas, stages.text.n_replicas, 1, 1, MMP_MAX_REPLICAS,
         false, DEFS(one_def), .scalar_ok = true),
    INTS("stages.text.split", stages.text.split, stages.text.n_split, 0, 1, 4096, true),
    INTS("stages.fusion.replicas", stages.fusion.replicas, stages.fusion.n_replicas, 1, 1, MMP_MAX_REPLICAS,
         false, DEFS(one_def), .scalar_ok = true),
};

#define N_KEYS (sizeof keys / sizeof keys[0])
#define KEY_MAX 256 /* longest dotted key we build, "hosts[15].devices[63]" included */

static int find_key(const char *path)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (strcmp(keys[i].path, path) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Whether path names a section (a strict prefix of some key, ending at a dot). */
static bool is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < N_KEYS; i++) {
        if (strncmp(keys[i].path, path, n) == 0 && keys[i].path[n] == '.') {
            return true;
        }
    }
    return false;
}

static void *field_of(mmp_plan *p, const key_spec *k)
{
    return (char *)p + k->field;
}

static const void *cfield_of(const mmp_plan *p, const key_spec *k)
{
    return (const char *)p + k->field;
}

static void store_int(mmp_plan *p, const key_spec *k, long long v)
{
    if (k->size == sizeof(long long)) {
        *(long long *)field_of(p, k) = v;
    } else {
        *(int *)field_of(p, k) = (int)v;
    }
}

static long long load_int(const mmp_plan *p, const key_spec *k)
{
    if (k->size == sizeof(long long)) {
        return *(const long long *)cfield_of(p, k);
    }
    return *(const int *)cfield_of(p, k);
}

/* ---- "did you mean" -------------------------------------------------------- */

static int edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    int row[KEY_MAX + 1];
    if (na > KEY_MAX || nb > KEY_MAX) {
        return INT_MAX;
    }
    for (size_t j = 0; j <= nb; j++) {
        row[j] = (int)j;
    }
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) {
                best = up + 1;
            }
            if (row[j - 1] + 1 < best) {
                best = row[j - 1] + 1;
            }
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

static int count_dots(const char *s, size_t n)
{
    int d = 0;
    for (size_t i = 0; i < n; i++) {
        d += s[i] == '.';
    }
    return d;
}

/* Writes " (did you mean 'K'?)" into hint when a known key or section K of
 * the same depth whose first parent_len characters equal key's is within
 * edit distance 2 of key; else "". A file's mapping passes its own path as
 * the parent (siblings only); an override passes 0 (any key). */
static void suggest(const char *key, size_t parent_len, char *hint, size_t size)
{
    size_t n = strlen(key);
    int depth = count_dots(key, n);
    int best = 3;
    const char *best_path = NULL;
    size_t best_len = 0;
    hint[0] = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *c = keys[i].path;
        for (size_t len = 1; len <= strlen(c); len++) {
            if ((c[len] != '.' && c[len] != 0) || count_dots(c, len) != depth ||
                len < parent_len || strncmp(c, key, parent_len) != 0) {
                continue;
            }
            int d = edit_distance(key, n, c, len);
            if (d < best) {
                best = d;
                best_path = c;
                best_len = len;
            }
        }
    }
    if (best_path) {
        snprintf(hint, size, " (did you mean '%.*s'?)", (int)best_len, best_path);
    }
}

/* ---- the loader ------------------------------------------------------------ */

/* Where a value came from: its node (and key, for a position when the value
 * has none, as an empty value does), and the --set override that put it in
 * the tree (-1 = the file). */
typedef struct site {
    struct fy_node *node;
    struct fy_node *key;
    int origin;
} site;

typedef struct loader {
    const char *path;
    const char *const *overrides;
    int n_overrides;
    struct fy_diag *diag; /* collects libfyaml's errors instead of printing them */
    struct fy_parser *fyp;
    struct fy_document *fyd;
    bool fyd_parsed; /* fyd came from fyp (else fy_document_create) */
    struct fy_node **override_nodes; /* [n_overrides]: the subtree each override added */
    bool seen[N_KEYS];
    site sites[N_KEYS];
    int list_len[N_KEYS]; /* entries given for list keys (their default length if not given) */
} loader;

static int diag_count(struct fy_diag *diag)
{
    int n = 0;
    void *iter = NULL;
    while (fy_diag_errors_iterate(diag, &iter)) {
        n++;
    }
    return n;
}

/* The i-th collected diagnostic, or NULL. */
static struct fy_diag_error *diag_error(struct fy_diag *diag, int i)
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

/* 1-based line and column of node n in the file; false if it has none. The
 * public API gives marks only for scalar tokens, so collections are located
 * by asking libfyaml to report at the node and reading back the position. */
static bool node_mark(loader *L, struct fy_node *n, int *line, int *col)
{
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
    int before = diag_count(L->diag);
    fy_diag_node_report(L->diag, n, FYET_ERROR, "position");
    struct fy_diag_error *e = diag_error(L->diag, before);
    if (!e || e->line <= 0) {
        return false;
    }
    *line = e->line;
    *col = e->column;
    return true;
}

/* Records "FILE:LINE:COL: msg" (or "--set K=V: msg") and returns MMP_ERR_CONFIG. */
static mmp_err fail(loader *L, site at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static mmp_err fail(loader *L, site at, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at.origin >= 0) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: %s", L->overrides[at.origin], msg);
    }
    int line = 1, col = 1;
    if (!node_mark(L, at.node, &line, &col)) {
        node_mark(L, at.key, &line, &col);
    }
    return mmp_errorf(MMP_ERR_CONFIG, "%s:%d:%d: %s", L->path, line, col, msg);
}

static int origin_of(const loader *L, struct fy_node *n)
{
    for (int i = 0; i < L->n_overrides; i++) {
        if (L->override_nodes[i] && L->override_nodes[i] == n) {
            return i;
        }
    }
    return -1;
}

static bool is_scalar(struct fy_node *n)
{
    return n && fy_node_get_type(n) == FYNT_SCALAR;
}

static bool is_plain(struct fy_node *n)
{
    enum fy_node_style s = fy_node_get_style(n);
    return s == FYNS_PLAIN || s == FYNS_ANY;
}

static bool is_null(struct fy_node *n)
{
    if (!n) {
        return true;
    }
    if (!is_scalar(n) || !is_plain(n)) {
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

/* Copies a scalar's text into buf; false if it does not fit or holds a NUL. */
static bool scalar_text(struct fy_node *n, char *buf, size_t size)
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

/* What a node is, for "expected X, got Y". */
static const char *describe(struct fy_node *n, char *buf, size_t size)
{
    if (is_null(n)) {
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
    if (is_plain(n)) {
        snprintf(buf, size, "'%.*s%s'", shown, s, more);
    } else {
        snprintf(buf, size, "the quoted string \"%.*s%s\"", shown, s, more);
    }
    return buf;
}

/* The pair in map whose key's text is name[0..n) (our own lookup: libfyaml's
 * *_by_string variants parse the key as YAML first). */
static struct fy_node_pair *lookup_pair(struct fy_node *map, const char *name, size_t n)
{
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        size_t len;
        const char *s = is_scalar(k) ? fy_node_get_scalar(k, &len) : NULL;
        if (s && len == n && memcmp(s, name, n) == 0) {
            return pair;
        }
    }
    return NULL;
}

/* ---- scalar values --------------------------------------------------------- */

/* Optional sign, then decimal digits only (no 0x, no 1e3, no 1_000). */
static bool is_integer(const char *s)
{
    s += *s == '-' || *s == '+';
    return *s && strspn(s, "0123456789") == strlen(s);
}

static mmp_err parse_int(loader *L, const char *name, site at, long long lo, long long hi,
                         long long *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    if (!is_scalar(n) || !is_plain(n) || is_null(n) || !scalar_text(n, text, sizeof text)) {
        return fail(L, at, "%s: expected an integer, got %s", name, describe(n, got, sizeof got));
    }
    if (!is_integer(text)) {
        return fail(L, at, "%s: expected an integer, got %s", name, describe(n, got, sizeof got));
    }
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) {
        return fail(L, at, "%s: %s is out of range [%lld, %lld]", name, text, lo, hi);
    }
    *out = v;
    return MMP_OK;
}

static mmp_err parse_float(loader *L, const char *name, site at, const key_spec *k, double *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    if (!is_scalar(n) || !is_plain(n) || is_null(n) || !scalar_text(n, text, sizeof text) ||
        strspn(text, "0123456789+-.eE") != strlen(text)) {
        return fail(L, at, "%s: expected a number, got %s", name, describe(n, got, sizeof got));
    }
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != 0) {
        return fail(L, at, "%s: expected a number, got %s", name, describe(n, got, sizeof got));
    }
    bool lo_ok = k->lo_bracket == '(' ? v > k->fmin : v >= k->fmin;
    bool hi_ok = k->hi_bracket == ')' ? v < k->fmax : v <= k->fmax;
    if (errno == ERANGE || !isfinite(v) || !lo_ok || !hi_ok) {
        return fail(L, at, "%s: %s is out of range %c%g, %g%c", name, text, k->lo_bracket, k->fmin,
                    k->fmax, k->hi_bracket);
    }
    *out = v;
    return MMP_OK;
}

static mmp_err parse_bool(loader *L, const char *name, site at, int *out)
{
    static const char *const yes[] = {"true", "True", "TRUE"};
    static const char *const no[] = {"false", "False", "FALSE"};
    char text[16], got[96];
    struct fy_node *n = at.node;
    if (is_scalar(n) && is_plain(n) && scalar_text(n, text, sizeof text)) {
        for (int i = 0; i < 3; i++) {
            if (strcmp(text, yes[i]) == 0 || strcmp(text, no[i]) == 0) {
                *out = strcmp(text, yes[i]) == 0;
                return MMP_OK;
            }
        }
    }
    return fail(L, at, "%s: expected true or false, got %s", name, describe(n, got, sizeof got));
}

static mmp_err parse_enum(loader *L, const char *name, site at, const char *const *names,
                          int *out)
{
    char text[64], got[96];
    struct fy_node *n = at.node;
    if (!is_scalar(n) || is_null(n)) {
        return fail(L, at, "%s: expected a name, got %s", name, describe(n, got, sizeof got));
    }
    if (scalar_text(n, text, sizeof text)) {
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
    return fail(L, at, "%s: unknown value %s (accepted: %s)", name, describe(n, got, sizeof got),
                accepted);
}

static mmp_err parse_string(loader *L, const char *name, site at, char *out, size_t size)
{
    char got[96];
    struct fy_node *n = at.node;
    if (!is_scalar(n) || is_null(n)) {
        return fail(L, at, "%s: expected a string, got %s", name, describe(n, got, sizeof got));
    }
    if (!scalar_text(n, out, size)) {
        return fail(L, at, "%s: expected a string of at most %zu bytes without NUL characters",
                    name, size - 1);
    }
    return MMP_OK;
}

/* ---- lists and hosts ------------------------------------------------------- */

static site item_site(struct fy_node *item, struct fy_node *list, int origin)
{
    return (site){.node = item, .key = list, .origin = origin};
}

static mmp_err check_list(loader *L, const char *name, site at, int min_len, int max_len,
                          int *count)
{
    char got[96];
    if (!at.node || fy_node_get_type(at.node) != FYNT_SEQUENCE) {
        return fail(L, at, "%s: expected a list, got %s", name,
                    describe(at.node, got, sizeof got));
    }
    int n = fy_node_sequence_item_count(at.node);
    if (min_len == max_len && n != min_len) {
        return fail(L, at, "%s: expected %d values, got %d", name, min_len, n);
    }
    if (n < min_len || n > max_len) {
        return fail(L, at, "%s: expected %d to %d values, got %d", name, min_len, max_len, n);
    }
    *count = n;
    return MMP_OK;
}

static mmp_err load_list(loader *L, mmp_plan *p, int idx, site at)
{
    const key_spec *k = &keys[idx];
    int n;
    if (k->scalar_ok && at.node && fy_node_get_type(at.node) == FYNT_SCALAR) {
        long long v = 0;
        MMP_TRY(parse_int(L, k->path, at, k->imin, k->imax, &v));
        ((int *)field_of(p, k))[0] = (int)v;
        *(int *)((char *)p + k->count_field) = 1;
        L->list_len[idx] = 1;
        return MMP_OK;
    }
    MMP_TRY(check_list(L, k->path, at, k->min_len, (int)k->size, &n));
    void *iter = NULL;
    struct fy_node *item;
    for (int i = 0; (item = fy_node_sequence_iterate(at.node, &iter)) != NULL; i++) {
        char name[KEY_MAX];
        snprintf(name, sizeof name, "%s[%d]", k->path, i);
        site is = item_site(item, at.node, at.origin);
        if (k->type == T_INT_LIST) {
            long long v = 0;
            int *out = field_of(p, k);
            MMP_TRY(parse_int(L, name, is, k->imin, k->imax, &v));
            if (k->increasing && i > 0 && v <= out[i - 1]) {
                return fail(L, is, "%s: %lld must be greater than the split point before it (%d)",
                            name, v, out[i - 1]);
            }
            out[i] = (int)v;
        } else {
            double v = 0;
            MMP_TRY(parse_float(L, name, is, k, &v));
            ((float *)field_of(p, k))[i] = (float)v;
        }
    }
    if (k->count_field != NO_FIELD) {
        *(int *)((char *)p + k->count_field) = n;
    }
    L->list_len[idx] = n;
    return MMP_OK;
}

static mmp_err load_host(loader *L, mmp_plan *p, int i, site at)
{
    char name[KEY_MAX], got[96];
    mmp_host *h = &p->hosts[i];
    memset(h, 0, sizeof *h);
    if (!at.node || fy_node_get_type(at.node) != FYNT_MAPPING) {
        return fail(L, at, "hosts[%d]: expected a mapping {name, devices}, got %s", i,
                    describe(at.node, got, sizeof got));
    }
    bool have_name = false, have_devices = false;
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(at.node, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        site vs = {.node = fy_node_pair_value(pair), .key = k, .origin = at.origin};
        char key[64];
        if (!is_scalar(k) || !scalar_text(k, key, sizeof key)) {
            snprintf(key, sizeof key, "?");
        }
        if (strcmp(key, "name") == 0) {
            snprintf(name, sizeof name, "hosts[%d].name", i);
            MMP_TRY(parse_string(L, name, vs, h->name, sizeof h->name));
            for (int j = 0; j < i; j++) {
                if (strcmp(p->hosts[j].name, h->name) == 0) {
                    return fail(L, vs, "%s: '%s' is already the name of hosts[%d]", name, h->name,
                                j);
                }
            }
            have_name = true;
        } else if (strcmp(key, "devices") == 0) {
            snprintf(name, sizeof name, "hosts[%d].devices", i);
            MMP_TRY(check_list(L, name, vs, 1, MMP_MAX_DEVICES, &h->n_devices));
            void *it = NULL;
            struct fy_node *item;
            for (int d = 0; (item = fy_node_sequence_iterate(vs.node, &it)) != NULL; d++) {
                char text[16];
                long long ordinal = 0;
                site is = item_site(item, vs.node, at.origin);
                snprintf(name, sizeof name, "hosts[%d].devices[%d]", i, d);
                bool plain = is_scalar(item) && is_plain(item) && scalar_text(item, text, sizeof text);
                /* "cpu" may be quoted: plan.json writes it so. */
                bool is_cpu = is_scalar(item) && scalar_text(item, text, sizeof text) &&
                              strcmp(text, "cpu") == 0;
                if (is_cpu) {
                    h->devices[d] = -1;
                    continue;
                }
                if (!plain || !is_integer(text)) {
                    return fail(L, is, "%s: expected 'cpu' or a CUDA device ordinal, got %s", name,
                                describe(item, got, sizeof got));
                }
                MMP_TRY(parse_int(L, name, is, 0, 1023, &ordinal));
                h->devices[d] = (int)ordinal;
            }
            have_devices = true;
        } else {
            static const char *const host_keys[] = {"name", "devices"};
            char hint[128] = "";
            for (int c = 0; c < 2; c++) {
                if (edit_distance(key, strlen(key), host_keys[c], strlen(host_keys[c])) <= 2) {
                    snprintf(hint, sizeof hint, " (did you mean 'hosts[%d].%s'?)", i,
                             host_keys[c]);
                    break;
                }
            }
            return fail(L, (site){.node = k, .key = k, .origin = at.origin},
                        "unknown key 'hosts[%d].%s'%s", i, key, hint);
        }
    }
    if (!have_name || !have_devices) {
        return fail(L, at, "hosts[%d].%s: required key is missing", i,
                    have_name ? "devices" : "name");
    }
    return MMP_OK;
}

static mmp_err load_hosts(loader *L, mmp_plan *p, site at)
{
    char got[96];
    if (!at.node || fy_node_get_type(at.node) != FYNT_SEQUENCE) {
        return fail(L, at, "hosts: expected a list of {name, devices}, got %s",
                    describe(at.node, got, sizeof got));
    }
    int n = fy_node_sequence_item_count(at.node);
    if (n < 1 || n > MMP_MAX_HOSTS) {
        return fail(L, at, "hosts: expected 1 to %d hosts, got %d", MMP_MAX_HOSTS, n);
    }
    void *iter = NULL;
    struct fy_node *item;
    for (int i = 0; (item = fy_node_sequence_iterate(at.node, &iter)) != NULL; i++) {
        MMP_TRY(load_host(L, p, i, item_site(item, at.node, at.origin)));
    }
    p->n_hosts = n;
    return MMP_OK;
}

/* ---- the tree walk --------------------------------------------------------- */

static mmp_err load_value(loader *L, mmp_plan *p, int idx, site at)
{
    const key_spec *k = &keys[idx];
    L->seen[idx] = true;
    L->sites[idx] = at;
    switch (k->type) {
    case T_INT: {
        long long v = 0;
        MMP_TRY(parse_int(L, k->path, at, k->imin, k->imax, &v));
        store_int(p, k, v);
        return MMP_OK;
    }
    case T_FLOAT: {
        double v = 0;
        MMP_TRY(parse_float(L, k->path, at, k, &v));
        *(float *)field_of(p, k) = (float)v;
        return MMP_OK;
    }
    case T_STRING: return parse_string(L, k->path, at, field_of(p, k), k->size);
    case T_BOOL: return parse_bool(L, k->path, at, field_of(p, k));
    case T_ENUM: {
        int v = 0;
        MMP_TRY(parse_enum(L, k->path, at, k->names, &v));
        if (k->field != NO_FIELD) {
            *(int *)field_of(p, k) = v;
        }
        return MMP_OK;
    }
    case T_INT_LIST:
    case T_FLOAT_LIST: return load_list(L, p, idx, at);
    case T_HOSTS: return load_hosts(L, p, at);
    }
    return mmp_errorf(MMP_ERR_INTERNAL, "key %s has no type", k->path);
}

/* Loads the mapping at.node, whose dotted path is prefix ("" for the top). */
static mmp_err load_mapping(loader *L, mmp_plan *p, site at, const char *prefix)
{
    char got[96];
    if (prefix[0] && is_null(at.node)) {
        return MMP_OK; /* "train:" with nothing under it */
    }
    if (!at.node || fy_node_get_type(at.node) != FYNT_MAPPING) {
        if (!prefix[0]) {
            return fail(L, at, "expected a mapping of sections (job, data, model, ...), got %s",
                        describe(at.node, got, sizeof got));
        }
        return fail(L, at, "%s: expected a mapping, got %s", prefix,
                    describe(at.node, got, sizeof got));
    }
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(at.node, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        int origin = origin_of(L, v);
        site vs = {.node = v, .key = k, .origin = origin >= 0 ? origin : at.origin};
        site ks = {.node = k, .key = k, .origin = vs.origin};
        char key[64], path[KEY_MAX];
        if (!is_scalar(k) || is_null(k) || !scalar_text(k, key, sizeof key)) {
            return fail(L, ks, "%s%skeys must be short names, got %s", prefix,
                        prefix[0] ? ": " : "", describe(k, got, sizeof got));
        }
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", key);
        int idx = find_key(path);
        if (strcmp(path, "stages") == 0 && is_scalar(v) && !is_null(v)) {
            char word[16];
            if (!scalar_text(v, word, sizeof word) || strcmp(word, "auto") != 0) {
                return fail(L, vs, "stages: expected a mapping (image, text, fusion) or 'auto', "
                                   "got %s",
                            describe(v, got, sizeof got));
            }
            p->stages_auto = 1;
        } else if (idx >= 0) {
            MMP_TRY(load_value(L, p, idx, vs));
        } else if (is_section(path)) {
            MMP_TRY(load_mapping(L, p, vs, path));
        } else {
            char hint[KEY_MAX + 32];
            suggest(path, prefix[0] ? strlen(prefix) + 1 : 0, hint, sizeof hint);
            return fail(L, ks, "unknown key '%s'%s", path, hint);
        }
    }
    return MMP_OK;
}

/* Rejects a key given twice in one mapping. libfyaml can do this itself, but
 * its message names neither the dotted key nor the first occurrence. */
static mmp_err check_duplicates(loader *L, struct fy_node *n, const char *path, int origin)
{
    void *iter = NULL;
    if (!n) {
        return MMP_OK;
    }
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        struct fy_node *item;
        for (int i = 0; (item = fy_node_sequence_iterate(n, &iter)) != NULL; i++) {
            char sub[KEY_MAX];
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            MMP_TRY(check_duplicates(L, item, sub, origin));
        }
        return MMP_OK;
    }
    if (fy_node_get_type(n) != FYNT_MAPPING) {
        return MMP_OK;
    }
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(n, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        char key[64], sub[KEY_MAX];
        if (!is_scalar(k) || !scalar_text(k, key, sizeof key)) {
            continue; /* load_mapping rejects it with a better message */
        }
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", key);
        void *prev_iter = NULL;
        struct fy_node_pair *prev;
        while ((prev = fy_node_mapping_iterate(n, &prev_iter)) != pair) {
            struct fy_node *pk = fy_node_pair_key(prev);
            char prev_key[64];
            if (is_scalar(pk) && scalar_text(pk, prev_key, sizeof prev_key) &&
                strcmp(prev_key, key) == 0) {
                site at = {.node = k, .key = k, .origin = origin};
                int line, col;
                if (origin >= 0 || !node_mark(L, pk, &line, &col)) {
                    return fail(L, at, "duplicate key '%s'", sub);
                }
                return fail(L, at, "duplicate key '%s' (first given at line %d, column %d)", sub,
                            line, col);
            }
        }
        MMP_TRY(check_duplicates(L, fy_node_pair_value(pair), sub, origin));
    }
    return MMP_OK;
}

/* ---- --set overrides ------------------------------------------------------- */

/* YAML text must be UTF-8 without NULs before libfyaml sees it: Debian's
 * libfyaml 0.8 loops for ever on a directive holding an invalid byte
 * ("%\xf7 1:", found by tests/fuzz/fuzz_plan.c). Returns the offset of the
 * first bad byte, or len. */
static size_t bad_text_at(const char *text, size_t len)
{
    size_t bad = mmp_utf8_check(text, len);
    const char *nul = memchr(text, 0, bad);
    return nul ? (size_t)(nul - text) : bad;
}

/* Puts node into map under name, or into pair's value when pair is given;
 * 0 on success. On failure node is not attached and stays the caller's. */
static int attach(struct fy_document *fyd, struct fy_node *map, struct fy_node_pair *pair,
                  const char *name, size_t len, struct fy_node *node)
{
    if (pair) {
        return fy_node_pair_set_value(pair, node);
    }
    struct fy_node *k = fy_node_create_scalar_copy(fyd, name, len);
    if (!k || fy_node_mapping_append(map, k, node) != 0) {
        if (k) {
            fy_node_free(k);
        }
        return -1;
    }
    return 0;
}

/* Puts override i ("a.b.c=value") into the tree: the value is parsed as YAML
 * (so "[1,2]" is a list) and missing mappings on the way are created. */
static mmp_err apply_override(loader *L, int i)
{
    const char *s = L->overrides[i];
    const char *eq = strchr(s, '=');
    char key[KEY_MAX], hint[KEY_MAX + 32], got[96];
    if (!eq || eq == s) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: expected KEY=VALUE", s);
    }
    if ((size_t)(eq - s) >= sizeof key) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: key too long", s);
    }
    memcpy(key, s, (size_t)(eq - s));
    key[eq - s] = 0;
    if (find_key(key) < 0 && !is_section(key)) {
        suggest(key, 0, hint, sizeof hint);
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: unknown key '%s'%s", s, key, hint);
    }

    /* Follow the mappings already on the path; stop at the first component
     * that is missing, empty ("train:" alone) or the last one. */
    struct fy_node *map = fy_document_root(L->fyd);
    struct fy_node_pair *pair;
    const char *part = key, *dot;
    int origin = -1;
    for (;;) {
        dot = strchr(part, '.');
        pair = lookup_pair(map, part, dot ? (size_t)(dot - part) : strlen(part));
        if (!pair || !dot) {
            break;
        }
        struct fy_node *v = fy_node_pair_value(pair);
        origin = origin_of(L, v) >= 0 ? origin_of(L, v) : origin;
        if (is_null(v)) {
            break;
        }
        if (fy_node_get_type(v) != FYNT_MAPPING) {
            /* the file (or an earlier override) put something else here */
            return fail(L, (site){.node = v, .key = fy_node_pair_key(pair), .origin = origin},
                        "%.*s: expected a mapping, got %s", (int)(dot - key), key,
                        describe(v, got, sizeof got));
        }
        map = v;
        part = dot + 1;
    }

    const char *text = eq[1] ? eq + 1 : "~"; /* "key=" sets nothing: a null */
    if (bad_text_at(text, strlen(text)) < strlen(text)) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: invalid YAML value: not UTF-8 text", key);
    }
    int before = diag_count(L->diag);
    struct fy_node *value = fy_node_build_from_string(L->fyd, text, FY_NT);
    if (!value) {
        struct fy_diag_error *e = diag_error(L->diag, before);
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: invalid YAML value: %s", s,
                          e && e->msg ? e->msg : "cannot parse");
    }
    mmp_err ret = check_duplicates(L, value, key, i);
    if (ret != MMP_OK) {
        fy_node_free(value);
        return ret;
    }
    struct fy_node *added = NULL; /* the topmost node this override creates */
    for (; (dot = strchr(part, '.')) != NULL; part = dot + 1) {
        struct fy_node *m = fy_node_create_mapping(L->fyd);
        if (!m || attach(L->fyd, map, pair, part, (size_t)(dot - part), m) != 0) {
            if (m) {
                fy_node_free(m);
            }
            fy_node_free(value);
            return mmp_errorf(MMP_ERR_NOMEM, "--set %s: out of memory", s);
        }
        added = added ? added : m;
        map = m;
        pair = NULL;
    }
    if (attach(L->fyd, map, pair, part, strlen(part), value) != 0) {
        fy_node_free(value);
        return mmp_errorf(MMP_ERR_NOMEM, "--set %s: out of memory", s);
    }
    L->override_nodes[i] = added ? added : value;
    return MMP_OK;
}

/* ---- after loading --------------------------------------------------------- */

/* The site of the first of keys a, b that the file or an override gave. */
static site site_of(const loader *L, const char *a, const char *b)
{
    int ia = find_key(a), ib = b ? find_key(b) : -1;
    if (ia >= 0 && L->seen[ia]) {
        return L->sites[ia];
    }
    if (ib >= 0 && L->seen[ib]) {
        return L->sites[ib];
    }
    return (site){.node = NULL, .key = NULL, .origin = -1};
}

static bool given(const loader *L, const char *path)
{
    int i = find_key(path);
    return i >= 0 && L->seen[i];
}

/* "dir/train.jsonl" + "val.jsonl" -> "dir/val.jsonl". */
static bool beside(const char *file, const char *name, char *out, size_t size)
{
    const char *slash = strrchr(file, '/');
    int dir = slash ? (int)(slash - file + 1) : 0;
    return snprintf(out, size, "%.*s%s", dir, file, name) < (int)size;
}

static mmp_err resolve_defaults(loader *L, mmp_plan *p)
{
    if (!given(L, "train.optimizer.min_lr")) {
        p->train.optimizer.min_lr = 0.1f * p->train.optimizer.lr;
    }
    if (!given(L, "sim.change.image")) {
        p->sim.change.image = p->sim.cost.image;
    }
    if (!given(L, "sim.change.text")) {
        p->sim.change.text = p->sim.cost.text;
    }
    if (!given(L, "sim.change.fusion")) {
        p->sim.change.fusion = p->sim.cost.fusion;
    }
    if ((!given(L, "data.val_manifest") &&
         !beside(p->data.manifest, "val.jsonl", p->data.val_manifest, sizeof p->data.val_manifest)) ||
        (!given(L, "data.vocab") &&
         !beside(p->data.manifest, "vocab.txt", p->data.vocab, sizeof p->data.vocab))) {
        return fail(L, site_of(L, "data.manifest", NULL),
                    "data.manifest: path too long to put val.jsonl / vocab.txt beside it");
    }
    return MMP_OK;
}

/* Layers of each branch, as nn/model.h counts them: image = stem, each
 * BasicBlock, projection; text = embedding, each transformer layer, final
 * LayerNorm. A split point k cuts between layers k-1 and k. */
static mmp_err check_split(loader *L, const char *key, const mmp_stage_cfg *s, int layers,
                           const char *why)
{
    for (int i = 0; i < s->n_split; i++) {
        if (s->split[i] >= layers) {
            return fail(L, site_of(L, key, NULL),
                        "%s[%d]: %d is not below the %d layers of the branch (%s)", key, i,
                        s->split[i], layers, why);
        }
    }
    return MMP_OK;
}

/* One entry for every sub-stage, or one per sub-stage. */
static mmp_err check_replicas(loader *L, const char *key, const char *split_key,
                              const mmp_stage_cfg *s)
{
    int subs = s->n_split + 1;
    if (s->n_replicas != 1 && s->n_replicas != subs) {
        return fail(L, site_of(L, key, split_key),
                    "%s: %d values for %d sub-stage%s (%s%s): give one number for all, or one "
                    "per sub-stage",
                    key, s->n_replicas, subs, subs == 1 ? "" : "s", split_key ? split_key : "",
                    split_key ? " cuts the branch" : "fusion is never cut");
    }
    return MMP_OK;
}

static mmp_err check_plan(loader *L, mmp_plan *p)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (keys[i].required && !L->seen[i]) {
            char section[64];
            snprintf(section, sizeof section, "%.*s", (int)strcspn(keys[i].path, "."),
                     keys[i].path);
            struct fy_node *root = fy_document_root(L->fyd);
            struct fy_node_pair *pair = lookup_pair(root, section, strlen(section));
            site at = {.node = pair ? fy_node_pair_key(pair) : NULL,
                       .key = NULL,
                       .origin = pair ? origin_of(L, fy_node_pair_value(pair)) : -1};
            return fail(L, at, "%s: required key is missing", keys[i].path);
        }
    }
    if (p->train.microbatches > p->train.batch) {
        return fail(L, site_of(L, "train.microbatches", "train.batch"),
                    "train.microbatches (%d) is more than train.batch (%d)",
                    p->train.microbatches, p->train.batch);
    }
    if (p->model.width % p->model.text.heads != 0) {
        return fail(L, site_of(L, "model.text.heads", "model.width"),
                    "model.width (%d) is not divisible by model.text.heads (%d)", p->model.width,
                    p->model.text.heads);
    }
    if (p->model.width % p->model.fusion.heads != 0) {
        return fail(L, site_of(L, "model.fusion.heads", "model.width"),
                    "model.width (%d) is not divisible by model.fusion.heads (%d)",
                    p->model.width, p->model.fusion.heads);
    }
    int nb = L->list_len[find_key("model.image.blocks")];
    int nc = L->list_len[find_key("model.image.channels")];
    if (nb != nc) {
        return fail(L, site_of(L, "model.image.channels", "model.image.blocks"),
                    "model.image.channels has %d values but model.image.blocks has %d", nc, nb);
    }
    p->model.image.n_stages = nb;
    if (p->train.optimizer.min_lr > p->train.optimizer.lr) {
        return fail(L, site_of(L, "train.optimizer.min_lr", "train.optimizer.lr"),
                    "train.optimizer.min_lr (%g) is more than train.optimizer.lr (%g)",
                    (double)p->train.optimizer.min_lr, (double)p->train.optimizer.lr);
    }
    (void)nb;
    MMP_TRY(check_split(L, "stages.image.split", &p->stages.image, mmp_plan_image_layers(p),
                        "stem, model.image.blocks, projection"));
    MMP_TRY(check_split(L, "stages.text.split", &p->stages.text, mmp_plan_text_layers(p),
                        "embedding, model.text.layers, final norm"));
    MMP_TRY(check_replicas(L, "stages.image.replicas", "stages.image.split", &p->stages.image));
    MMP_TRY(check_replicas(L, "stages.text.replicas", "stages.text.split", &p->stages.text));
    MMP_TRY(check_replicas(L, "stages.fusion.replicas", NULL, &p->stages.fusion));
    return MMP_OK;
}

/* ---- public ---------------------------------------------------------------- */

int mmp_plan_image_layers(const mmp_plan *p)
{
    int n = 2; /* stem, projection */
    for (int i = 0; i < p->model.image.n_stages; i++) {
        n += p->model.image.blocks[i];
    }
    return n;
}

int mmp_plan_mb_size(const mmp_plan *p, int mb)
{
    int B = p->train.batch, m = p->train.microbatches;
    return B / m + (mb < B % m ? 1 : 0);
}

int mmp_plan_mb_offset(const mmp_plan *p, int mb)
{
    int B = p->train.batch, m = p->train.microbatches;
    return mb * (B / m) + (mb < B % m ? mb : B % m);
}

int mmp_plan_text_layers(const mmp_plan *p)
{
    return p->model.text.layers + 2; /* embedding, layers, final norm */
}

int mmp_plan_replicas(const mmp_plan *p, mmp_branch b, int sub)
{
    const mmp_stage_cfg *s = b == MMP_BRANCH_IMAGE  ? &p->stages.image
                             : b == MMP_BRANCH_TEXT ? &p->stages.text
                                                    : &p->stages.fusion;
    if (s->n_replicas <= 1) {
        return s->n_replicas == 1 ? s->replicas[0] : 1;
    }
    return sub >= 0 && sub < s->n_replicas ? s->replicas[sub] : 1;
}

int mmp_plan_slots(const mmp_plan *p)
{
    int n = 0;
    for (int i = 0; i < p->n_hosts; i++) {
        n += p->hosts[i].n_devices;
    }
    return n;
}

double mmp_plan_sim_ms(const mmp_plan *p, mmp_branch b, int first, int last, int n, int step,
                       int backward, int slot)
{
    int changed = p->sim.change_step > 0 && step + 1 >= p->sim.change_step;
    double per_sample = 0, share = 1;
    switch (b) {
    case MMP_BRANCH_IMAGE:
        per_sample = changed ? p->sim.change.image : p->sim.cost.image;
        share = (double)(last - first) / mmp_plan_image_layers(p);
        break;
    case MMP_BRANCH_TEXT:
        per_sample = changed ? p->sim.change.text : p->sim.cost.text;
        share = (double)(last - first) / mmp_plan_text_layers(p);
        break;
    case MMP_BRANCH_FUSION: per_sample = changed ? p->sim.change.fusion : p->sim.cost.fusion; break;
    }
    double slowdown = slot >= 0 && slot < p->sim.n_slowdown ? p->sim.slowdown[slot] : 1.0;
    return per_sample * n * share * slowdown * (backward ? p->sim.bwd_factor : 1.0);
}

void mmp_plan_defaults(mmp_plan *p)
{
    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_spec *k = &keys[i];
        if (k->field == NO_FIELD) {
            continue;
        }
        switch (k->type) {
        case T_INT: store_int(p, k, (long long)k->def); break;
        case T_FLOAT: *(float *)field_of(p, k) = (float)k->def; break;
        case T_STRING: snprintf(field_of(p, k), k->size, "%s", k->def_str); break;
        case T_BOOL:
        case T_ENUM: *(int *)field_of(p, k) = (int)k->def; break;
        case T_INT_LIST:
        case T_FLOAT_LIST:
            for (int j = 0; j < k->def_len; j++) {
                if (k->type == T_INT_LIST) {
                    ((int *)field_of(p, k))[j] = (int)k->def_list[j];
                } else {
                    ((float *)field_of(p, k))[j] = (float)k->def_list[j];
                }
            }
            if (k->count_field != NO_FIELD) {
                *(int *)((char *)p + k->count_field) = k->def_len;
            }
            break;
        case T_HOSTS: break;
        }
    }
    p->train.optimizer.min_lr = 0.1f * p->train.optimizer.lr;
    p->n_hosts = 1;
    snprintf(p->hosts[0].name, sizeof p->hosts[0].name, "localhost");
    p->hosts[0].n_devices = 3;
    for (int d = 0; d < 3; d++) {
        p->hosts[0].devices[d] = -1;
    }
}

static void discard_diag(struct fy_diag *diag, void *user, const char *buf, size_t len)
{
    (void)diag, (void)user, (void)buf, (void)len;
}

static mmp_err read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f), saved = errno;
    fclose(f);
    if (!buf) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory reading it", path);
    }
    if (failed) {
        free(buf);
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(saved));
    }
    *out = buf;
    *len = n;
    return MMP_OK;
}

static mmp_err yaml_error(loader *L, int first)
{
    struct fy_diag_error *e = diag_error(L->diag, first);
    return mmp_errorf(MMP_ERR_CONFIG, "%s:%d:%d: invalid YAML: %s", L->path, e ? e->line : 1,
                      e ? e->column : 1, e && e->msg ? e->msg : "cannot parse");
}

/* Parses text into L->fyd (with L->fyp, which must outlive it): exactly one
 * document, or an empty one for a file without any (empty, or comments). */
static mmp_err parse_text(loader *L, const char *text, size_t len)
{
    size_t bad = bad_text_at(text, len);
    if (bad < len) {
        int line = 1, col = 1;
        for (size_t i = 0; i < bad; i++) {
            line += text[i] == '\n';
            col = text[i] == '\n' ? 1 : col + 1;
        }
        return mmp_errorf(MMP_ERR_CONFIG, "%s:%d:%d: invalid YAML: byte 0x%02x is not UTF-8 text",
                          L->path, line, col, (unsigned char)text[bad]);
    }
    /* Duplicates are let through so check_duplicates can name them properly;
     * aliases are resolved only after that check, as merges can repeat keys. */
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_ALLOW_DUPLICATE_KEYS, .diag = L->diag};
    if (len > 0) {
        L->fyp = fy_parser_create(&cfg);
        if (!L->fyp || fy_parser_set_string(L->fyp, text, len) != 0) {
            return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
        }
        L->fyd = fy_parse_load_document(L->fyp);
        if (diag_count(L->diag) > 0) {
            return yaml_error(L, 0);
        }
    }
    if (!L->fyd) {
        L->fyd = fy_document_create(&cfg);
        return L->fyd ? MMP_OK : mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
    }
    L->fyd_parsed = true;
    struct fy_document *next = fy_parse_load_document(L->fyp);
    mmp_err ret = MMP_OK;
    if (diag_count(L->diag) > 0) {
        ret = yaml_error(L, 0);
    } else if (next && !is_null(fy_document_root(next))) {
        site at = {.node = fy_document_root(next), .key = NULL, .origin = -1};
        ret = fail(L, at, "a plan is one YAML document; this starts a second one");
    }
    if (next) {
        fy_parse_document_destroy(L->fyp, next);
    }
    return ret;
}

mmp_err mmp_plan_load(mmp_plan *p, const char *path, const char *const *overrides,
                      int n_overrides)
{
    loader L = {.path = path, .overrides = overrides, .n_overrides = n_overrides};
    char *text = NULL;
    size_t len = 0;
    mmp_err ret = MMP_OK;

    mmp_plan_defaults(p);
    for (size_t i = 0; i < N_KEYS; i++) {
        L.list_len[i] = keys[i].def_len;
    }
    if (snprintf(p->path, sizeof p->path, "%s", path) >= (int)sizeof p->path) {
        return mmp_errorf(MMP_ERR_CONFIG, "%.64s...: plan path too long", path);
    }
    MMP_TRY(read_file(path, &text, &len));

    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = discard_diag;
    dcfg.level = FYET_ERROR;
    L.diag = fy_diag_create(&dcfg);
    L.override_nodes = calloc(n_overrides > 0 ? (size_t)n_overrides : 1, sizeof(struct fy_node *));
    if (!L.diag || !L.override_nodes) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", path);
        goto exit;
    }
    fy_diag_set_collect_errors(L.diag, true);
    if ((ret = parse_text(&L, text, len)) != MMP_OK ||
        (ret = check_duplicates(&L, fy_document_root(L.fyd), "", -1)) != MMP_OK) {
        goto exit;
    }
    int before = diag_count(L.diag);
    if (fy_document_resolve(L.fyd) != 0) {
        ret = yaml_error(&L, before);
        goto exit;
    }
    struct fy_node *root = fy_document_root(L.fyd);
    if (is_null(root)) {
        /* an empty file (or just comments): every key takes its default */
        root = fy_node_create_mapping(L.fyd);
        if (!root || fy_document_set_root(L.fyd, root) != 0) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", path);
            goto exit;
        }
    }
    site top = {.node = root, .key = NULL, .origin = -1};
    if (fy_node_get_type(root) != FYNT_MAPPING) {
        ret = load_mapping(&L, p, top, ""); /* fails, naming what the top level is */
        goto exit;
    }
    for (int i = 0; i < n_overrides; i++) {
        if ((ret = apply_override(&L, i)) != MMP_OK) {
            goto exit;
        }
    }
    if ((ret = load_mapping(&L, p, top, "")) != MMP_OK ||
        (ret = resolve_defaults(&L, p)) != MMP_OK || (ret = check_plan(&L, p)) != MMP_OK) {
        goto exit;
    }
exit:
    if (L.fyd_parsed) {
        fy_parse_document_destroy(L.fyp, L.fyd);
    } else if (L.fyd) {
        fy_document_destroy(L.fyd);
    }
    if (L.fyp) {
        fy_parser_destroy(L.fyp);
    }
    if (L.diag) {
        fy_diag_destroy(L.diag);
    }
    free(L.override_nodes);
    free(text);
    return ret;
}

/* ---- plan.json ------------------------------------------------------------- */

static void put_string(FILE *f, const char *s)
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

static void put_value(FILE *f, const mmp_plan *p, const key_spec *k)
{
    if (k->type == T_ENUM && k->field == NO_FIELD) { /* checked only: its one accepted value */
        put_string(f, k->names[0]);
        return;
    }
    switch (k->type) {
    case T_INT: fprintf(f, "%lld", load_int(p, k)); break;
    case T_FLOAT: put_float(f, *(const float *)cfield_of(p, k)); break;
    case T_STRING: put_string(f, cfield_of(p, k)); break;
    case T_BOOL: fputs(*(const int *)cfield_of(p, k) ? "true" : "false", f); break;
    case T_ENUM: {
        int v = *(const int *)cfield_of(p, k), n = 0;
        while (k->names[n]) {
            n++;
        }
        put_string(f, v >= 0 && v < n ? k->names[v] : "?");
        break;
    }
    case T_INT_LIST:
    case T_FLOAT_LIST: {
        int n = k->count_field != NO_FIELD ? *(const int *)((const char *)p + k->count_field)
                                           : (int)k->size;
        fputc('[', f);
        for (int i = 0; i < n && i < (int)k->size; i++) {
            fputs(i ? ", " : "", f);
            if (k->type == T_INT_LIST) {
                fprintf(f, "%d", ((const int *)cfield_of(p, k))[i]);
            } else {
                put_float(f, ((const float *)cfield_of(p, k))[i]);
            }
        }
        fputc(']', f);
        break;
    }
    case T_HOSTS:
        fputc('[', f);
        for (int i = 0; i < p->n_hosts && i < MMP_MAX_HOSTS; i++) {
            const mmp_host *h = &p->hosts[i];
            fputs(i ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
            put_string(f, h->name);
            fputs(", \"devices\": [", f);
            for (int d = 0; d < h->n_devices && d < MMP_MAX_DEVICES; d++) {
                fputs(d ? ", " : "", f);
                if (h->devices[d] < 0) {
                    fputs("\"cpu\"", f);
                } else {
                    fprintf(f, "%d", h->devices[d]);
                }
            }
            fputs("]}", f);
        }
        fputs("\n  ]", f);
        break;
    }
}

/* Splits "a.b.c" into its parts; returns how many. */
static int split_path(const char *path, char parts[][64], int max)
{
    int n = 0;
    while (n < max) {
        size_t len = strcspn(path, ".");
        snprintf(parts[n++], 64, "%.*s", (int)len, path);
        if (!path[len]) {
            break;
        }
        path += len + 1;
    }
    return n;
}

/* Starts the next item of an object at nesting level (0 = the top). */
static void next_item(FILE *f, bool *first, int level)
{
    fputs(first[level] ? "\n" : ",\n", f);
    first[level] = false;
    fprintf(f, "%*s", 2 * (level + 1), "");
}

mmp_err mmp_plan_write_json(const mmp_plan *p, const char *path)
{
    enum { DEPTH = 8 };
    FILE *f = fopen(path, "w");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char open[DEPTH][64]; /* the sections now open, outermost first */
    bool first[DEPTH + 1] = {true};
    int n_open = 0;
    /* Every key of the schema and nothing else, so plan.json loads back as a
     * plan (JSON is YAML): stage processes load the resolved plan from it. */
    fputs("{", f);
    for (size_t i = 0; i < N_KEYS; i++) {
        char parts[DEPTH][64];
        int n = split_path(keys[i].path, parts, DEPTH);
        int common = 0;
        while (common < n_open && common < n - 1 && strcmp(open[common], parts[common]) == 0) {
            common++;
        }
        while (n_open > common) { /* close the sections this key is not in */
            n_open--;
            fprintf(f, "\n%*s}", 2 * (n_open + 1), "");
        }
        while (n_open < n - 1) { /* open the ones it is in */
            next_item(f, first, n_open);
            fprintf(f, "\"%s\": {", parts[n_open]);
            snprintf(open[n_open], sizeof open[n_open], "%s", parts[n_open]);
            first[++n_open] = true;
        }
        next_item(f, first, n_open);
        fprintf(f, "\"%s\": ", parts[n - 1]);
        put_value(f, p, &keys[i]);
    }
    while (n_open > 0) {
        n_open--;
        fprintf(f, "\n%*s}", 2 * (n_open + 1), "");
    }
    fputs("\n}\n", f);
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        return mmp_errorf(MMP_ERR_IO, "%s: write failed", path);
    }
    return MMP_OK;
}

/* ---- keys as text (checkpoint fingerprints) ---------------------------------- */

int mmp_plan_key_count(void)
{
    return (int)N_KEYS;
}

const char *mmp_plan_key_name(int i)
{
    return i >= 0 && i < (int)N_KEYS ? keys[i].path : NULL;
}

mmp_err mmp_plan_key_text(const mmp_plan *p, int i, char *buf, size_t n)
{
    if (i < 0 || i >= (int)N_KEYS || n == 0) {
        return mmp_errorf(MMP_ERR_INVALID, "plan key %d: no such key", i);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        return mmp_errorf(MMP_ERR_NOMEM, "plan key %s: %s", keys[i].path, strerror(errno));
    }
    put_value(f, p, &keys[i]);
    fclose(f);
    if (!text) {
        return mmp_errorf(MMP_ERR_NOMEM, "plan key %s", keys[i].path);
    }
    int fits = len < n;
    snprintf(buf, n, "%s", text);
    free(text);
    return fits ? MMP_OK
                : mmp_errorf(MMP_ERR_INVALID, "plan key %s: value longer than %zu bytes",
                             keys[i].path, n - 1);
}

int mmp_plan_evaluates(const mmp_plan *p)
{
    return p->train.eval_every > 0 || p->train.final_eval;
}

int mmp_plan_eval_due(const mmp_plan *p, int steps_done)
{
    return (p->train.eval_every > 0 && steps_done % p->train.eval_every == 0) ||
           (p->train.final_eval && steps_done == p->job.steps);
}

const char *mmp_schedule_name(mmp_schedule s)
{
    return (unsigned)s < 2 ? schedule_names[s] : "?";
}

const char *mmp_precision_name(mmp_precision p)
{
    return (unsigned)p < 3 ? precision_names[p] : "?";
}

mmp_err mmp_plan_check_runnable(const mmp_plan *p)
{
    const struct {
        int bad;
        const char *key, *why;
    } rules[] = {
        {p->train.precision != MMP_PREC_FP32, "train.precision", "mixed precision (GPU only)"},
        {p->n_hosts > 1, "hosts", "more than one host"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (rules[i].bad) {
            return mmp_errorf(MMP_ERR_INVALID, "%s: %s is not supported yet", rules[i].key,
                              rules[i].why);
        }
    }
    for (int h = 0; h < p->n_hosts; h++) {
        for (int d = 0; d < p->hosts[h].n_devices; d++) {
            if (p->hosts[h].devices[d] >= 0) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "hosts[%d].devices[%d]: GPU stages are not supported yet (use cpu)",
                                  h, d);
            }
        }
    }
    return MMP_OK;
}
