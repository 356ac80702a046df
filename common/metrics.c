/* metrics.jsonl reader and writer (common/metrics.h). libfyaml parses each
 * line (JSON is YAML); the writer prints the schema's order by hand, the
 * same bytes the coordinator has always written. Never prints. */
#include "common/metrics.h"

#include <errno.h>
#include <libfyaml.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/json.h"
#include "common/stats.h"

static void stage_clear(mmp_metrics_stage *s)
{
    memset(s, 0, sizeof *s);
    s->replica = s->microbatches = s->max_inflight = s->act_slots = -1;
    s->state_bytes = NAN;
    s->busy_ms = s->idle_ms = s->wall_ms = s->data_wait_ms = NAN;
    s->fwd_ms = s->bwd_ms = s->load_ms = s->peak_mem_bytes = s->wgt_ms = s->cpu_ms = NAN;
}

void mmp_metrics_step_clear(mmp_metrics_step *m)
{
    memset(m, 0, sizeof *m);
    m->step = m->skipped_samples = m->step_skipped = m->chained = -1;
    m->loss_scale = m->cpu_ms = NAN;
    m->loss = m->itc_loss = m->itm_loss = m->lr = m->grad_norm = NAN;
    m->samples_per_s = m->step_ms = m->data_ms = m->bubble = NAN;
    m->efficiency = m->val_i2t_r1 = m->val_t2i_r1 = NAN;
    for (int i = 0; i < MMP_METRICS_MAX_STAGES; i++) {
        stage_clear(&m->stages[i]);
    }
}

double mmp_metrics_cpu_ms(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        return NAN;
    }
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* ---- reading -------------------------------------------------------------------- */

/* The number under key in mapping node: 1, 0 when absent (no key, or null:
 * how the writer puts a number that is not finite), -1 when not a finite
 * number. */
static int json_number(struct fy_node *node, const char *key, double *out)
{
    struct fy_node *v = fy_node_mapping_lookup_value_by_simple_key(node, key, strlen(key));
    if (!v) {
        return 0;
    }
    size_t len;
    const char *text = fy_node_is_scalar(v) ? fy_node_get_scalar(v, &len) : NULL;
    /* room for any finite double the writer prints ("%.4f" of 1e308 is 314
     * characters) */
    char buf[352];
    if (text && fy_node_get_style(v) == FYNS_PLAIN && len == 4 && memcmp(text, "null", 4) == 0) {
        return 0;
    }
    if (!text || len == 0 || len >= sizeof buf) {
        return -1;
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && isfinite(*out) ? 1 : -1;
}

/* The schema as data: every number field, where it lives, how the writer
 * prints it. The reader and the writer both walk this one table. */
enum { IN_STEP, IN_STAGE, IN_BALANCE, IN_EVAL };

typedef struct field {
    const char *key;
    int in;          /* IN_*: the object it belongs to */
    size_t off;      /* offsetof into mmp_metrics_step (mmp_metrics_stage for IN_STAGE) */
    int is_int;      /* an int field, else a double */
    const char *fmt; /* the writer's format */
    int optional;    /* the writer leaves it out when absent (NAN, -1) */
    int lenient;     /* the reader takes a value that is no number as absent */
} field;

#define STEP(k, fmt, len)                                                                          \
    {                                                                                              \
#k, IN_STEP, offsetof(mmp_metrics_step, k), 0, fmt, 0, len                                 \
    }
#define STEP_INT(k)                                                                                \
    {                                                                                              \
#k, IN_STEP, offsetof(mmp_metrics_step, k), 1, "%d", 0, 0                                  \
    }
#define STAGE(k)                                                                                   \
    {                                                                                              \
#k, IN_STAGE, offsetof(mmp_metrics_stage, k), 0, "%.4g", 1, 0                              \
    }
#define STAGE_INT(k, opt)                                                                          \
    {                                                                                              \
#k, IN_STAGE, offsetof(mmp_metrics_stage, k), 1, "%d", opt, 0                              \
    }

static const field FIELDS[] = {
    STEP_INT(step),
    STEP(loss, "%.6g", 1),
    STEP(itc_loss, "%.6g", 1),
    STEP(itm_loss, "%.6g", 1),
    STEP(lr, "%.6g", 1),
    STEP(grad_norm, "%.6g", 1),
    STEP(samples_per_s, "%.4g", 0),
    STEP(step_ms, "%.4g", 0),
    STEP(data_ms, "%.4g", 0),
    STEP_INT(skipped_samples),
    STEP(bubble, "%.4f", 0),
    /* optional: a line without them (older runs) still reads */
    {"loss_scale", IN_STEP, offsetof(mmp_metrics_step, loss_scale), 0, "%.9g", 1, 0},
    {"step_skipped", IN_STEP, offsetof(mmp_metrics_step, step_skipped), 1, "%d", 1, 0},
    {"cpu_ms", IN_STEP, offsetof(mmp_metrics_step, cpu_ms), 0, "%.4g", 1, 0},
    {"chained", IN_STEP, offsetof(mmp_metrics_step, chained), 1, "%d", 1, 0},
    STAGE_INT(replica, 0),
    STAGE_INT(microbatches, 1),
    STAGE(busy_ms),
    STAGE(idle_ms),
    STAGE(wall_ms),
    STAGE(data_wait_ms),
    STAGE(fwd_ms),
    STAGE(bwd_ms),
    STAGE(wgt_ms),
    STAGE(load_ms),
    STAGE_INT(max_inflight, 1),
    {"peak_mem_bytes", IN_STAGE, offsetof(mmp_metrics_stage, peak_mem_bytes), 0, "%.0f", 1, 0},
    STAGE(cpu_ms),
    {"state_bytes", IN_STAGE, offsetof(mmp_metrics_stage, state_bytes), 0, "%.0f", 1, 0},
    STAGE_INT(act_slots, 1),
    {"efficiency", IN_BALANCE, offsetof(mmp_metrics_step, efficiency), 0, "%.4f", 0, 0},
    {"val_i2t_r1", IN_EVAL, offsetof(mmp_metrics_step, val_i2t_r1), 0, "%.4f", 0, 1},
    {"val_t2i_r1", IN_EVAL, offsetof(mmp_metrics_step, val_t2i_r1), 0, "%.4f", 0, 1},
};
#define N_FIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))

/* Reads the fields of group `in` from node into base; the first one that
 * is not a number is an error naming where (what: "" or "stage NAME: "). */
static mmp_err read_fields(struct fy_node *node, int in, void *base, const char *what)
{
    for (int k = 0; k < N_FIELDS; k++) {
        const field *f = &FIELDS[k];
        double v = 0; /* set by json_number when it returns 1 */
        int got = f->in == in ? json_number(node, f->key, &v) : 0;
        if (got < 0 && !f->lenient) {
            return mmp_errorf(MMP_ERR_DATA, "%s%s is not a number", what, f->key);
        }
        if (got == 1 && f->is_int && !(v == floor(v) && v >= INT_MIN && v <= INT_MAX)) {
            return mmp_errorf(MMP_ERR_DATA, "%s%s is not an integer in %d..%d", what, f->key,
                              INT_MIN, INT_MAX);
        }
        if (got == 1 && f->is_int) {
            *(int *)((char *)base + f->off) = (int)v;
        } else if (got == 1) {
            *(double *)((char *)base + f->off) = v;
        }
    }
    return MMP_OK;
}

static mmp_err read_stage(struct fy_node *item, mmp_metrics_stage *s)
{
    stage_clear(s);
    const char *name = fy_node_is_mapping(item)
                           ? fy_node_mapping_lookup_scalar0_by_simple_key(item, "name", 4)
                           : NULL;
    if (!name) {
        return mmp_errorf(MMP_ERR_DATA, "a stages entry without a name");
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    char what[80];
    snprintf(what, sizeof what, "stage %s: ", s->name);
    return read_fields(item, IN_STAGE, s, what);
}

static mmp_err read_root(struct fy_node *root, mmp_metrics_step *m)
{
    if (!fy_node_is_mapping(root)) {
        return mmp_errorf(MMP_ERR_DATA, "not a JSON object");
    }
    MMP_TRY(read_fields(root, IN_STEP, m, ""));
    MMP_TRY(read_fields(root, IN_EVAL, m, ""));
    m->has_eval = fy_node_mapping_lookup_value_by_simple_key(root, "val_i2t_r1", 10) != NULL;
    struct fy_node *stages = fy_node_mapping_lookup_value_by_simple_key(root, "stages", 6);
    if (stages) {
        if (!fy_node_is_sequence(stages)) {
            return mmp_errorf(MMP_ERR_DATA, "\"stages\" is not a list");
        }
        m->has_stages = 1;
        void *iter = NULL;
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(stages, &iter)) != NULL) {
            if (m->n_stages == MMP_METRICS_MAX_STAGES) {
                return mmp_errorf(MMP_ERR_DATA, "more than %d stages entries",
                                  MMP_METRICS_MAX_STAGES);
            }
            MMP_TRY(read_stage(item, &m->stages[m->n_stages]));
            m->n_stages++;
        }
    }
    struct fy_node *bal = fy_node_mapping_lookup_value_by_simple_key(root, "balance", 7);
    if (bal) {
        if (!fy_node_is_mapping(bal)) {
            return mmp_errorf(MMP_ERR_DATA, "\"balance\" is not an object");
        }
        m->has_balance = 1;
        MMP_TRY(read_fields(bal, IN_BALANCE, m, "balance: "));
        const char *pl = fy_node_mapping_lookup_scalar0_by_simple_key(bal, "placement", 9);
        if (pl) {
            if (strlen(pl) >= sizeof m->placement) {
                return mmp_errorf(MMP_ERR_DATA, "balance: placement longer than %zu bytes",
                                  sizeof m->placement - 1);
            }
            snprintf(m->placement, sizeof m->placement, "%s", pl);
        }
    }
    return MMP_OK;
}

static void quiet(struct fy_diag *diag, void *user, const char *buf, size_t len)
{
    (void)diag, (void)user, (void)buf, (void)len;
}

/* Parses with diag (errors collected, nothing printed); *column gets the
 * parser's column of a JSON error (0: none). */
static mmp_err parse_with(struct fy_diag *diag, const char *line, size_t len, mmp_metrics_step *m,
                          int *column)
{
    mmp_metrics_step_clear(m);
    *column = 0;
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_JSON_FORCE, .diag = diag};
    struct fy_document *doc = fy_document_build_from_string(&cfg, line, len);
    struct fy_node *root = doc ? fy_document_root(doc) : NULL;
    mmp_err ret;
    if (!root) {
        void *iter = NULL;
        struct fy_diag_error *e = diag ? fy_diag_errors_iterate(diag, &iter) : NULL;
        *column = e && e->column > 0 ? e->column : 1;
        ret = mmp_errorf(MMP_ERR_DATA, "malformed JSON: %s", e && e->msg ? e->msg : "cannot parse");
    } else {
        ret = read_root(root, m);
    }
    fy_document_destroy(doc);
    return ret;
}

static struct fy_diag *quiet_diag(void)
{
    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = quiet;
    dcfg.level = FYET_ERROR;
    struct fy_diag *diag = fy_diag_create(&dcfg);
    if (diag) {
        fy_diag_set_collect_errors(diag, true);
    }
    return diag;
}

mmp_err mmp_metrics_parse(const char *line, size_t len, mmp_metrics_step *m)
{
    struct fy_diag *diag = quiet_diag();
    if (!diag) {
        return mmp_errorf(MMP_ERR_NOMEM, "metrics: parser diagnostics");
    }
    int column;
    mmp_err e = parse_with(diag, line, len, m, &column);
    fy_diag_destroy(diag);
    return e;
}

mmp_err mmp_metrics_open(mmp_metrics_reader *r, const char *path)
{
    memset(r, 0, sizeof *r);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(r->path, sizeof r->path, "%s/metrics.jsonl", path);
    } else {
        snprintf(r->path, sizeof r->path, "%s", path);
    }
    r->f = fopen(r->path, "r");
    if (!r->f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", r->path, strerror(errno));
    }
    r->diag = quiet_diag();
    if (!r->diag) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: parser diagnostics", r->path);
    }
    return MMP_OK;
}

mmp_err mmp_metrics_next(mmp_metrics_reader *r, mmp_metrics_step *m, int *got)
{
    *got = 0;
    ssize_t len;
    while ((len = getline(&r->line, &r->cap, r->f)) >= 0) {
        r->lineno++;
        while (len > 0 && strchr(" \t\r\n", r->line[len - 1])) {
            r->line[--len] = 0; /* keeps the parser's column on this line */
        }
        if (strspn(r->line, " \t") == (size_t)len) {
            continue;
        }
        int column;
        mmp_err e = parse_with(r->diag, r->line, (size_t)len, m, &column);
        if (e != MMP_OK) {
            if (column > 0) {
                return mmp_error_prefix(e, "%s:%d:%d", r->path, r->lineno, column);
            }
            return mmp_error_prefix(e, "%s:%d", r->path, r->lineno);
        }
        *got = 1;
        return MMP_OK;
    }
    if (ferror(r->f)) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", r->path, strerror(errno));
    }
    return MMP_OK;
}

void mmp_metrics_close(mmp_metrics_reader *r)
{
    if (!r) {
        return;
    }
    free(r->line);
    r->line = NULL;
    r->cap = 0;
    if (r->diag) {
        fy_diag_destroy(r->diag);
        r->diag = NULL;
    }
    if (r->f) {
        fclose(r->f);
        r->f = NULL;
    }
}

/* ---- writing -------------------------------------------------------------------- */

/* Writes the fields of group `in` from base as ",\"key\":value" (the first
 * without its comma when first); returns whether it wrote any. */
static int put_fields(FILE *f, int in, const void *base, int first)
{
    for (int k = 0; k < N_FIELDS; k++) {
        const field *fd = &FIELDS[k];
        if (fd->in != in) {
            continue;
        }
        const char *at = (const char *)base + fd->off;
        int absent = fd->is_int ? *(const int *)at < 0 : isnan(*(const double *)at);
        if (fd->optional && absent) {
            continue;
        }
        fprintf(f, "%s\"%s\":", first ? "" : ",", fd->key);
        if (fd->is_int) {
            fprintf(f, fd->fmt, *(const int *)at);
        } else if (!isfinite(*(const double *)at)) {
            fputs("null", f); /* a diverged or skipped step's norm: JSON has no inf/nan */
        } else {
            fprintf(f, fd->fmt, *(const double *)at);
        }
        first = 0;
    }
    return !first;
}

/* m as one JSON line, newline included, onto f. */
static void put_line(FILE *f, const mmp_metrics_step *m)
{
    fputc('{', f);
    put_fields(f, IN_STEP, m, 1);
    fputs(",\"stages\":[", f);
    for (int i = 0; i < m->n_stages; i++) {
        fprintf(f, "%s{\"name\":", i ? "," : "");
        mmp_json_put_string(f, m->stages[i].name);
        put_fields(f, IN_STAGE, &m->stages[i], 0);
        fputc('}', f);
    }
    fputc(']', f);
    if (m->has_balance) {
        fputs(",\"balance\":{", f);
        put_fields(f, IN_BALANCE, m, 1);
        fputs(",\"placement\":", f);
        mmp_json_put_string(f, m->placement);
        fprintf(f, ",\"decision\":%s}", m->decision && m->decision[0] ? m->decision : "null");
    }
    if (m->has_eval) {
        put_fields(f, IN_EVAL, m, 0);
    }
    if (m->restarts) {
        fprintf(f, ",\"restarts\":%s", m->restarts);
    }
    fputs("}\n", f);
}

mmp_err mmp_metrics_write(FILE *f, const mmp_metrics_step *m)
{
    /* the line is made in memory and written at once; a write that fails
     * part way (a full disk) is cut back off, so the file keeps whole
     * lines only */
    char *line = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&line, &len);
    if (!mem) {
        return mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: a line");
    }
    put_line(mem, m);
    if (fclose(mem) != 0 || !line) {
        free(line);
        return mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: a line");
    }
    off_t at = ftello(f);
    size_t put = fwrite(line, 1, len, f);
    int bad = put != len || fflush(f) != 0 || ferror(f);
    int why = errno;
    free(line);
    if (!bad) {
        return MMP_OK;
    }
    clearerr(f);
    if (at >= 0 && ftruncate(fileno(f), at) == 0) {
        (void)fseeko(f, at, SEEK_SET);
    }
    return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s (this step's line left out)",
                      strerror(why ? why : EIO));
}

/* Replaces f from offset `at` to its end with text (len bytes, whole
 * lines): a last line rewritten in place. */
static mmp_err replace_tail(FILE *f, off_t at, const char *text, size_t len)
{
    if (ftruncate(fileno(f), at) != 0 || fseeko(f, at, SEEK_SET) != 0 ||
        fwrite(text, 1, len, f) != len || fflush(f) != 0) {
        return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno));
    }
    return MMP_OK;
}

/* f's last line: where it starts (*start) and its text without the newline
 * (*line, malloc'd, *len bytes); *line NULL when the file is empty. The file
 * holds whole lines (mmp_metrics_continue, mmp_metrics_write): its last byte
 * is the last line's newline. */
static mmp_err last_line(FILE *f, off_t *start, char **line, size_t *len)
{
    *line = NULL;
    *start = 0;
    *len = 0;
    struct stat st;
    if (fflush(f) != 0 || fstat(fileno(f), &st) != 0) {
        return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno));
    }
    off_t end = st.st_size;
    if (end <= 0) {
        return MMP_OK;
    }
    char buf[4096];
    off_t from = 0;
    for (off_t pos = end - 1; pos > 0 && !from;) {
        size_t n = pos > (off_t)sizeof buf ? sizeof buf : (size_t)pos;
        pos -= (off_t)n;
        if (pread(fileno(f), buf, n, pos) != (ssize_t)n) {
            return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno));
        }
        for (size_t k = n; k-- > 0;) {
            if (buf[k] == '\n') {
                from = pos + (off_t)k + 1;
                break;
            }
        }
    }
    size_t n = (size_t)(end - from);
    char *text = malloc(n + 1);
    if (!text) {
        return mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: its last line");
    }
    if (pread(fileno(f), text, n, from) != (ssize_t)n) {
        free(text);
        return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno));
    }
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) {
        n--;
    }
    text[n] = 0;
    *line = text;
    *start = from;
    *len = n;
    return MMP_OK;
}

mmp_err mmp_metrics_eval_pending(FILE *f, int step, off_t *at)
{
    *at = -1;
    off_t start;
    char *line;
    size_t len;
    MMP_TRY(last_line(f, &start, &line, &len));
    if (!line) {
        return MMP_OK;
    }
    static mmp_metrics_step m;
    mmp_err ret = mmp_metrics_parse(line, len, &m);
    free(line);
    if (ret == MMP_OK && m.step == step && !m.has_eval) {
        *at = start;
    }
    return ret;
}

mmp_err mmp_metrics_add_restarts(FILE *f, const char *array)
{
    size_t an = array ? strlen(array) : 0;
    if (an < 2 || array[0] != '[' || array[an - 1] != ']') {
        return mmp_errorf(MMP_ERR_INVALID, "metrics.jsonl: restarts '%.40s' is not an array",
                          array ? array : "");
    }
    off_t start;
    char *line, *out = NULL;
    size_t len, out_len = 0;
    MMP_TRY(last_line(f, &start, &line, &len));
    mmp_err ret = MMP_OK;
    /* "restarts" is the line's last field (put_line's order): the new
     * records join its array, or the field goes before the closing brace */
    char *close = line ? strrchr(line, '}') : NULL;
    char *has = line ? strstr(line, ",\"restarts\":[") : NULL;
    char *at = has ? strrchr(line, ']') : close;
    FILE *o = at ? open_memstream(&out, &out_len) : NULL;
    if (!o) {
        ret = mmp_errorf(at ? MMP_ERR_NOMEM : MMP_ERR_DATA,
                         "metrics.jsonl: no last line to add the restarts to");
        goto exit;
    }
    fwrite(line, 1, (size_t)(at - line), o);
    if (has) {
        fputc(',', o);
        fwrite(array + 1, 1, an - 1, o); /* its records and its "]" */
        fputs(at + 1, o);
    } else {
        fprintf(o, ",\"restarts\":%s%s", array, at);
    }
    fputc('\n', o);
    ret = fclose(o) == 0 ? replace_tail(f, start, out, out_len)
                         : mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: the last line");
exit:
    free(line);
    free(out);
    return ret;
}

mmp_err mmp_metrics_add_eval(FILE *f, off_t at, double i2t, double t2i)
{
    struct stat st;
    if (fflush(f) != 0 || fstat(fileno(f), &st) != 0 || at < 0 || at >= st.st_size) {
        return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: no line to add the evaluation to");
    }
    size_t len = (size_t)(st.st_size - at);
    char *line = malloc(len + 1), *eval = NULL, *out = NULL;
    size_t eval_len = 0, out_len = 0;
    mmp_err ret = MMP_OK;
    if (!line || pread(fileno(f), line, len, at) != (ssize_t)len) {
        ret = line ? mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno))
                   : mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: its last line");
        goto exit;
    }
    line[len] = 0;
    /* after everything but "restarts" (put_line's order); the key with its
     * quotes bare is never inside a string, where they are escaped */
    char *cut = strstr(line, ",\"restarts\":");
    if (!cut) {
        cut = strrchr(line, '}');
    }
    static mmp_metrics_step e;
    mmp_metrics_step_clear(&e);
    e.val_i2t_r1 = i2t;
    e.val_t2i_r1 = t2i;
    FILE *mem = open_memstream(&eval, &eval_len);
    if (mem) {
        put_fields(mem, IN_EVAL, &e, 0);
    }
    FILE *o = mem && fclose(mem) == 0 && cut ? open_memstream(&out, &out_len) : NULL;
    if (!o) {
        ret = mmp_errorf(cut ? MMP_ERR_NOMEM : MMP_ERR_DATA, "metrics.jsonl: the last line");
        goto exit;
    }
    fwrite(line, 1, (size_t)(cut - line), o);
    fwrite(eval, 1, eval_len, o);
    fputs(cut, o);
    ret = fclose(o) == 0 ? replace_tail(f, at, out, out_len)
                         : mmp_errorf(MMP_ERR_NOMEM, "metrics.jsonl: the last line");
exit:
    free(line);
    free(eval);
    free(out);
    return ret;
}

mmp_err mmp_metrics_same_file(FILE *f, const char *run_dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    struct stat open_st, path_st;
    if (fstat(fileno(f), &open_st) != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    int gone = stat(path, &path_st) != 0;
    if (gone || path_st.st_ino != open_st.st_ino || path_st.st_dev != open_st.st_dev) {
        return mmp_errorf(MMP_ERR_IO,
                          "%s is not the file this run writes (%s): was the run directory "
                          "removed? stopping, nothing more can be saved there",
                          path, gone ? "gone" : "replaced");
    }
    return MMP_OK;
}

/* ---- continuing a run's file ---------------------------------------------- */

long mmp_metrics_line_step(const char *line)
{
    static const char key[] = "{\"step\":";
    if (strncmp(line, key, sizeof key - 1) != 0) {
        return -1;
    }
    char *end;
    long step = strtol(line + sizeof key - 1, &end, 10);
    return end == line + sizeof key - 1 || step < 0 ? -1 : step;
}

mmp_err mmp_metrics_continue(const char *run_dir, int keep_steps, FILE **out)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    *out = NULL;
    FILE *in = keep_steps >= 0 ? fopen(path, "r") : NULL;
    if (!in) {
        if (keep_steps >= 0 && errno != ENOENT) {
            return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        }
        *out = fopen(path, "w+");
        return *out ? MMP_OK : mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    /* Durable: the rewrite happens once a launch, and a power cut must not
     * take the record of every earlier launch with it. */
    mmp_err ret = MMP_OK;
    mmp_atomic_file a;
    MMP_TRY_GOTO(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE), ret, exit);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0, odd = 0, first_odd = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        lineno++;
        long step = mmp_metrics_line_step(line);
        int whole = n >= 2 && line[n - 1] == '\n' && line[n - 2] == '}';
        if (whole && step >= 0 && step <= keep_steps) {
            fwrite(line, 1, (size_t)n, a.f);
        } else if (line[n - 1] == '\n' && !(whole && step >= 0)) {
            /* a whole line but no step's record (the cut-off last one a
             * killed writer leaves has no newline): something else wrote
             * here; said, not lost without a word */
            odd++;
            first_odd = first_odd ? first_odd : lineno;
        }
    }
    free(line);
    if (odd > 0) {
        MMP_WARN("%s: %ld line%s that %s no step's record (line %ld first) left out as the "
                 "run continues from step %d",
                 path, odd, odd == 1 ? "" : "s", odd == 1 ? "is" : "are", first_odd, keep_steps);
    }
    if (ferror(in)) {
        ret = mmp_errorf(MMP_ERR_IO, "read %s: %s", path, strerror(errno));
        mmp_atomic_abort(&a);
        goto exit;
    }
    MMP_TRY_GOTO(mmp_atomic_commit(&a), ret, exit);
    *out = fopen(path, "a+");
    if (!*out) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
exit:
    fclose(in);
    return ret;
}

void mmp_metrics_summary(const char *run_dir, char *out, size_t n)
{
    out[0] = 0;
    mmp_metrics_reader r;
    static mmp_metrics_step m;
    double *sps = NULL;
    int count = 0, cap = 0, first = -1, last = -1, eval_step = -1, got = 0;
    double i2t = 0, t2i = 0;
    if (mmp_metrics_open(&r, run_dir) != MMP_OK) {
        goto exit;
    }
    while (mmp_metrics_next(&r, &m, &got) == MMP_OK && got) {
        if (m.has_eval) {
            eval_step = m.step;
            i2t = m.val_i2t_r1;
            t2i = m.val_t2i_r1;
        }
        if (first < 0) {
            first = m.step; /* warms up: not counted */
            continue;
        }
        if (!isfinite(m.samples_per_s)) {
            continue;
        }
        if (count == cap) {
            int grown = cap ? 2 * cap : 256;
            double *v = realloc(sps, (size_t)grown * sizeof *v);
            if (!v) {
                goto exit;
            }
            sps = v;
            cap = grown;
        }
        sps[count++] = m.samples_per_s;
        last = m.step;
    }
    size_t at = 0;
    if (count > 0) {
        double med = mmp_median(sps, count);
        int w = snprintf(out, n, "median %.*f samples/s (steps %d-%d)", med < 10 ? 2 : 0, med,
                         first + 1, last);
        at = w > 0 && (size_t)w < n ? (size_t)w : n - 1;
    }
    if (eval_step >= 0 && at + 1 < n) {
        snprintf(out + at, n - at, "%sval recall@1 image->text %.3f, text->image %.3f (step %d)",
                 at ? "; " : "", i2t, t2i, eval_step);
    }
exit:
    free(sps);
    mmp_metrics_close(&r);
}
