/* Deferred weight gradients (nn/wgrad.h): records the weight part of linear
 * and conv2d backwards during B and replays it in W. Must never change how a
 * gradient is computed: the replay calls the same lowp/backend ops on the
 * same inputs as the fused backward. */
#include "nn/wgrad.h"

#include <stdlib.h>
#include <string.h>

#include "nn/lowp.h"
#include "nn/params.h"

void mmp_wgrad_init(mmp_wgrad *wg, mmp_backend *be)
{
    memset(wg, 0, sizeof *wg);
    wg->be = be;
}

void mmp_wgrad_fini(mmp_wgrad *wg)
{
    if (!wg) {
        return;
    }
    if (wg->store) {
        wg->be->ops->free(wg->be, wg->store);
    }
    free(wg->jobs);
    wg->store = NULL;
    wg->jobs = NULL;
    wg->cap = wg->used = 0;
    wg->n = wg->cap_jobs = 0;
}

int mmp_wgrad_pending(const mmp_wgrad *wg)
{
    return wg->n > 0;
}

/* A new job with room for n floats of output gradient copied from dout,
 * the gradients (dw, db) it will add into and its input and weights; NULL
 * (wg->err set) when it cannot be had. */
static mmp_wgrad_job *add(mmp_wgrad *wg, const float *dout, size_t n, int conv, float *dw,
                          float *db, const float *inp, const float *w)
{
    if (wg->err != MMP_OK) {
        return NULL;
    }
    if (wg->n == wg->cap_jobs) {
        int cap = wg->cap_jobs ? 2 * wg->cap_jobs : 32;
        mmp_wgrad_job *j = realloc(wg->jobs, (size_t)cap * sizeof *j);
        if (!j) {
            wg->err = mmp_errorf(MMP_ERR_NOMEM, "deferred weight gradients: %d jobs", cap);
            return NULL;
        }
        wg->jobs = j;
        wg->cap_jobs = cap;
    }
    if (wg->used + n > wg->cap) {
        /* Only the first B passes of a recorder get here: later ones fit. */
        size_t cap = wg->cap * 2 > wg->used + n ? wg->cap * 2 : wg->used + n;
        void *mem = NULL;
        mmp_err e = wg->be->ops->alloc(wg->be, &mem, cap * sizeof(float));
        if (e != MMP_OK) {
            wg->err =
                mmp_error_prefix(e, "deferred weight gradients: %zu bytes", cap * sizeof(float));
            return NULL;
        }
        if (wg->store) {
            wg->be->ops->copy(wg->be, mem, wg->store, wg->used * sizeof(float));
            wg->be->ops->free(wg->be, wg->store);
        }
        wg->store = mem;
        wg->cap = cap;
    }
    mmp_wgrad_job *j = &wg->jobs[wg->n++];
    memset(j, 0, sizeof *j);
    j->dout_at = wg->used;
    j->conv = conv;
    j->dw = dw;
    j->db = db;
    j->inp = inp;
    j->w = w;
    wg->be->ops->copy(wg->be, wg->store + wg->used, dout, n * sizeof(float));
    wg->used += n;
    return j;
}

void mmp_wgrad_record_linear(mmp_wgrad *wg, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, int N, int C, int OC)
{
    mmp_wgrad_job *j = add(wg, dout, (size_t)N * OC, 0, dw, db, inp, w);
    if (j) {
        j->N = N;
        j->C = C;
        j->OC = OC;
    }
}

void mmp_wgrad_record_conv2d(mmp_wgrad *wg, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const mmp_conv_shape *s,
                             float *scratch)
{
    mmp_wgrad_job *j = add(wg, dout, (size_t)s->N * s->OC * s->OH * s->OW, 1, dw, db, inp, w);
    if (j) {
        j->s = *s;
        j->scratch = scratch;
    }
}

static size_t dw_floats(const mmp_wgrad_job *j)
{
    return j->conv ? (size_t)j->s.OC * j->s.C * j->s.KH * j->s.KW : (size_t)j->OC * j->C;
}

static size_t db_floats(const mmp_wgrad_job *j)
{
    return (size_t)(j->conv ? j->s.OC : j->OC);
}

/* Whether job k's gradient range g already belongs to an earlier job. */
static int seen(const mmp_wgrad *wg, int k, const float *g)
{
    for (int i = 0; i < k; i++) {
        if (g && (wg->jobs[i].dw == g || wg->jobs[i].db == g)) {
            return 1;
        }
    }
    return 0;
}

mmp_err mmp_wgrad_clear(mmp_wgrad *wg)
{
    mmp_err e = wg->err;
    wg->err = MMP_OK;
    wg->n = 0;
    wg->used = 0;
    return e;
}

mmp_err mmp_wgrad_run(mmp_wgrad *wg, const mmp_lowp *lp, mmp_params *p)
{
    if (wg->err != MMP_OK) {
        return mmp_wgrad_clear(wg);
    }
    mmp_backend *be = wg->be;
    mmp_lowp l = *lp;
    l.defer = NULL; /* the replay computes, it does not record */
    /* As mmp_params_mb_begin left them for the fused backward: zero. */
    for (int k = 0; k < wg->n; k++) {
        const mmp_wgrad_job *j = &wg->jobs[k];
        if (j->dw) {
            be->ops->zero(be, j->dw, dw_floats(j) * sizeof(float));
        }
        if (j->db) {
            be->ops->zero(be, j->db, db_floats(j) * sizeof(float));
        }
    }
    for (int k = 0; k < wg->n; k++) {
        const mmp_wgrad_job *j = &wg->jobs[k];
        const float *dout = wg->store + j->dout_at;
        if (j->conv) {
            mmp_lowp_conv2d_bwd(&l, NULL, j->dw, j->db, dout, j->inp, j->w, &j->s, j->scratch);
        } else {
            mmp_lowp_linear_bwd(&l, NULL, j->dw, j->db, dout, j->inp, j->w, j->N, j->C, j->OC);
        }
    }
    /* As mmp_params_mb_end does for the fused backward, range by range. */
    for (int k = 0; k < wg->n; k++) {
        const mmp_wgrad_job *j = &wg->jobs[k];
        if (j->dw && !seen(wg, k, j->dw)) {
            mmp_params_acc_range(p, j->dw, dw_floats(j));
        }
        if (j->db && !seen(wg, k, j->db)) {
            mmp_params_acc_range(p, j->db, db_floats(j));
        }
    }
    wg->n = 0;
    wg->used = 0;
    return MMP_OK;
}
