/* The books of restarts: records, rewinding metrics.jsonl to a checkpoint.
 * Must never touch processes, shared memory or checkpoint contents. */
#include "coordinator/restart.h"

#include <sys/stat.h>

#include "common/ckpt.h"
#include "common/json.h"
#include "common/metrics.h"

mmp_err mmp_restart_rewind(mmp_restarts *r, const char *run_dir, int steps_done, const char *cause,
                           int *from_step, char *resume_dir, size_t n, FILE **metrics)
{
    if (r->n >= MMP_RESTART_MAX) {
        return mmp_errorf(MMP_ERR_INVALID, "more than %d restarts", MMP_RESTART_MAX);
    }
    int from = 0;
    char latest[1200];
    struct stat sb;
    snprintf(latest, sizeof latest, "%s/ckpt/latest", run_dir);
    resume_dir[0] = 0;
    if (lstat(latest, &sb) == 0) {
        MMP_TRY(mmp_ckpt_latest(run_dir, resume_dir, n, &from));
    }
    if (*metrics) {
        fclose(*metrics);
        *metrics = NULL;
    }
    MMP_TRY(mmp_metrics_continue(run_dir, from, metrics));
    for (int k = 0; k < r->n; k++) {
        if (r->log[k].line_step > from) {
            r->log[k].line_step = 0; /* its line was dropped: the next one carries it */
        }
    }
    mmp_restart *e = &r->log[r->n++];
    *e = (mmp_restart){.n = r->n, .after_step = steps_done, .from_step = from};
    snprintf(e->cause, sizeof e->cause, "%.*s", (int)sizeof e->cause - 1, cause);
    *from_step = from;
    return MMP_OK;
}

const char *mmp_restart_field(mmp_restarts *r, int step_no, char *buf, size_t n)
{
    size_t len = 0;
    for (int k = 0; k < r->n; k++) {
        mmp_restart *e = &r->log[k];
        if (e->line_step) {
            continue;
        }
        char esc[1000];
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0,
                                "%s{\"n\":%d,\"after_step\":%d,\"from_step\":%d,\"cause\":\"%s\"}",
                                len ? "," : "[", e->n, e->after_step, e->from_step,
                                mmp_json_escape(e->cause, esc, sizeof esc));
        e->line_step = step_no;
    }
    if (!len) {
        return NULL;
    }
    len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "]");
    return len < n ? buf : NULL;
}

void mmp_restart_write_field(mmp_restarts *r, FILE *f, int step_no)
{
    static char buf[MMP_RESTART_FIELD_MAX];
    const char *t = mmp_restart_field(r, step_no, buf, sizeof buf);
    if (t) {
        fprintf(f, ",\"restarts\":%s", t);
    }
}
