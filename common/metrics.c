/* metrics.jsonl reader and writer (common/metrics.h). libfyaml parses each
 * line (JSON is YAML); the writer prints the schema's order by hand, the
 * same bytes the coordinator has always written. Never prints. */
#include "common/metrics.h"

#include <errno.h>
#include <libfyaml.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void stage_clear(mmp_metrics_stage *s)
{
    memset(s, 0, sizeof *s);
    s->replica = s->microbatches = s->max_inflight = -1;
    s->busy_ms = s->idle_ms = s->wall_ms = s->data_wait_ms = NAN;
    s->fwd_ms = s->bwd_ms = s->load_ms = s->peak_mem_bytes = NAN;
}

void mmp_metrics_step_clear(mmp_metrics_step *m)
{
    memset(m, 0, sizeof *m);
    m->step = m->skipped_samples = -1;
    m->loss = m->itc_loss = m->itm_loss = m->lr = m->grad_norm = NAN;
    m->samples_per_s = m->step_ms = m->data_ms = m->bubble = NAN;
    m->efficiency = m->val_i2t_r1 = m->val_t2i_r1 = NAN;
    for (int i = 0; i < MMP_METRICS_MAX_STAGES; i++) {
        stage_clear(&m->stages[i]);
    }
}

/* ---- reading -------------------------------------------------------------------- */

/* The number under key in mapping node: 1, 0 when absent, -1 when not a
 * finite number. */
static int json_number(struct fy_node *node, const char *key, double *out)
{
    struct fy_node *v = fy_node_mapping_lookup_value_by_simple_key(node, key, strlen(key));
    if (!v) {
        return 0;
    }
    size_t len;
    const char *text = fy_node_is_scalar(v) ? fy_node_get_scalar(v, &len) : NULL;
    char buf[64];
    if (!text || len == 0 || len >= sizeof buf) {
        return -1;
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && isfinite(*out) ? 1 : -1;
}

typedef struct field {
    const char *key;
    double *d; /* one of d, i */
    int *i;
    int lenient; /* not a number: NAN rather than an error */
} field;

/* Reads fields[0..n) of node; the first one that is not a number is an
 * error naming where (what: "" or "stage NAME: "). */
static mmp_err read_fields(struct fy_node *node, const field *fields, int n, const char *what)
{
    for (int k = 0; k < n; k++) {
        double v;
        int got = json_number(node, fields[k].key, &v);
        if (got < 0 && !fields[k].lenient) {
            return mmp_errorf(MMP_ERR_DATA, "%s%s is not a number", what, fields[k].key);
        }
        if (got == 1) {
            if (fields[k].d) {
                *fields[k].d = v;
            } else {
                *fields[k].i = (int)v;
            }
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
    const field f[] = {
        {"replica", NULL, &s->replica, 0},
        {"microbatches", NULL, &s->microbatches, 0},
        {"busy_ms", &s->busy_ms, NULL, 0},
        {"idle_ms", &s->idle_ms, NULL, 0},
        {"wall_ms", &s->wall_ms, NULL, 0},
        {"data_wait_ms", &s->data_wait_ms, NULL, 0},
        {"fwd_ms", &s->fwd_ms, NULL, 0},
        {"bwd_ms", &s->bwd_ms, NULL, 0},
        {"load_ms", &s->load_ms, NULL, 0},
        {"max_inflight", NULL, &s->max_inflight, 0},
        {"peak_mem_bytes", &s->peak_mem_bytes, NULL, 0},
    };
    char what[80];
    snprintf(what, sizeof what, "stage %s: ", s->name);
    return read_fields(item, f, (int)(sizeof f / sizeof f[0]), what);
}

static mmp_err read_root(struct fy_node *root, mmp_metrics_step *m)
{
    if (!fy_node_is_mapping(root)) {
        return mmp_errorf(MMP_ERR_DATA, "not a JSON object");
    }
    const field f[] = {
        {"step", NULL, &m->step, 0},
        {"loss", &m->loss, NULL, 1},
        {"itc_loss", &m->itc_loss, NULL, 1},
        {"itm_loss", &m->itm_loss, NULL, 1},
        {"lr", &m->lr, NULL, 1},
        {"grad_norm", &m->grad_norm, NULL, 1},
        {"samples_per_s", &m->samples_per_s, NULL, 0},
        {"step_ms", &m->step_ms, NULL, 0},
        {"data_ms", &m->data_ms, NULL, 0},
        {"skipped_samples", NULL, &m->skipped_samples, 0},
        {"bubble", &m->bubble, NULL, 0},
        {"val_i2t_r1", &m->val_i2t_r1, NULL, 1},
        {"val_t2i_r1", &m->val_t2i_r1, NULL, 1},
    };
    MMP_TRY(read_fields(root, f, (int)(sizeof f / sizeof f[0]), ""));
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
        const field bf[] = {{"efficiency", &m->efficiency, NULL, 0}};
        MMP_TRY(read_fields(bal, bf, 1, "balance: "));
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
    if (r->f) {
        fclose(r->f);
    }
    if (r->diag) {
        fy_diag_destroy(r->diag);
    }
    free(r->line);
    r->f = NULL;
    r->diag = NULL;
    r->line = NULL;
    r->cap = 0;
}

/* ---- writing -------------------------------------------------------------------- */

/* s as a JSON string body: quotes, backslashes and controls escaped. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

static void put_stage(FILE *f, const mmp_metrics_stage *s)
{
    fputs("{\"name\":", f);
    put_string(f, s->name);
    fprintf(f, ",\"replica\":%d", s->replica < 0 ? 0 : s->replica);
    if (s->microbatches >= 0) {
        fprintf(f, ",\"microbatches\":%d", s->microbatches);
    }
    const struct {
        const char *key;
        double v;
    } ms[] = {{"busy_ms", s->busy_ms}, {"idle_ms", s->idle_ms},
              {"wall_ms", s->wall_ms}, {"data_wait_ms", s->data_wait_ms},
              {"fwd_ms", s->fwd_ms},   {"bwd_ms", s->bwd_ms},
              {"load_ms", s->load_ms}};
    for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
        if (!isnan(ms[k].v)) {
            fprintf(f, ",\"%s\":%.4g", ms[k].key, ms[k].v);
        }
    }
    if (s->max_inflight >= 0) {
        fprintf(f, ",\"max_inflight\":%d", s->max_inflight);
    }
    if (!isnan(s->peak_mem_bytes)) {
        fprintf(f, ",\"peak_mem_bytes\":%llu", (unsigned long long)s->peak_mem_bytes);
    }
    fputc('}', f);
}

mmp_err mmp_metrics_write(FILE *f, const mmp_metrics_step *m)
{
    fprintf(f,
            "{\"step\":%d,\"loss\":%.6g,\"itc_loss\":%.6g,\"itm_loss\":%.6g,\"lr\":%.6g,"
            "\"grad_norm\":%.6g,\"samples_per_s\":%.4g,\"step_ms\":%.4g,\"data_ms\":%.4g,"
            "\"skipped_samples\":%d,\"bubble\":%.4f,\"stages\":[",
            m->step, m->loss, m->itc_loss, m->itm_loss, m->lr, m->grad_norm, m->samples_per_s,
            m->step_ms, m->data_ms, m->skipped_samples < 0 ? 0 : m->skipped_samples, m->bubble);
    for (int i = 0; i < m->n_stages; i++) {
        if (i) {
            fputc(',', f);
        }
        put_stage(f, &m->stages[i]);
    }
    fputc(']', f);
    if (m->has_balance) {
        fprintf(f, ",\"balance\":{\"efficiency\":%.4f,\"placement\":", m->efficiency);
        put_string(f, m->placement);
        fprintf(f, ",\"decision\":%s}", m->decision && m->decision[0] ? m->decision : "null");
    }
    if (m->has_eval) {
        fprintf(f, ",\"val_i2t_r1\":%.4f,\"val_t2i_r1\":%.4f", m->val_i2t_r1, m->val_t2i_r1);
    }
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f)) {
        return mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno));
    }
    return MMP_OK;
}
