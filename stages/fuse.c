#include "stages/fuse.h"

#include <stdlib.h>
#include <string.h>

#include "stages/pairing.h"

static float *staging(mmp_backend *be, size_t floats, mmp_err *err)
{
    void *p = NULL;
    if (*err == MMP_OK) {
        *err = be->ops->alloc(be, &p, floats * sizeof(float));
    }
    return p;
}

/* Both scopes' backend buffers for n samples: img and dimg (n, img_row),
 * txt and dtxt (n, txt_row), mask (n, T). On failure some may be set: the
 * caller frees them with free_staging. */
static mmp_err alloc_staging(mmp_backend *be, size_t n, size_t img_row, size_t txt_row, int T,
                             float **img, float **dimg, float **txt, float **dtxt, float **mask)
{
    mmp_err err = MMP_OK;
    *img = staging(be, n * img_row, &err);
    *dimg = staging(be, n * img_row, &err);
    *txt = staging(be, n * txt_row, &err);
    *dtxt = staging(be, n * txt_row, &err);
    *mask = staging(be, n * (size_t)T, &err);
    return err;
}

static void free_staging(mmp_backend *be, float *img, float *dimg, float *txt, float *dtxt,
                         float *mask)
{
    if (be) {
        float *dev[] = {img, dimg, txt, dtxt, mask};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
            be->ops->free(be, dev[i]);
        }
    }
}

mmp_err mmp_fuse_init(mmp_fuse *f, mmp_backend *be, int mb_max, size_t img_row, int T, int D)
{
    *f = (mmp_fuse){
        .be = be, .mb_max = mb_max, .T = T, .img_row = img_row, .txt_row = (size_t)T * D};
    size_t m = (size_t)mb_max;
    mmp_err err = alloc_staging(be, m, img_row, f->txt_row, T, &f->img, &f->dimg, &f->txt, &f->dtxt,
                                &f->mask);
    f->rows = calloc(m ? m : 1, sizeof(int));
    if (err != MMP_OK || !f->rows) {
        mmp_fuse_fini(f);
        return mmp_errorf(MMP_ERR_NOMEM, "fusion staging for %d samples", mb_max);
    }
    return MMP_OK;
}

void mmp_fuse_fini(mmp_fuse *f)
{
    if (!f) {
        return;
    }
    free_staging(f->be, f->img, f->dimg, f->txt, f->dtxt, f->mask);
    free(f->rows);
    memset(f, 0, sizeof *f);
}

static int all_rows(const mmp_fuse *f)
{
    return f->k == f->n;
}

/* dst row i = src row rows[i] (backend memory). */
static void gather(mmp_backend *be, float *dst, const float *src, const int *rows, int k,
                   size_t row)
{
    for (int i = 0; i < k; i++) {
        be->ops->copy(be, dst + (size_t)i * row, src + (size_t)rows[i] * row, row * sizeof(float));
    }
}

/* dst row rows[i] += src row i (backend memory). */
static void scatter_add(mmp_backend *be, float *dst, const float *src, const int *rows, int k,
                        size_t row)
{
    for (int i = 0; i < k; i++) {
        float *d = dst + (size_t)rows[i] * row;
        be->ops->add(be, d, d, src + (size_t)i * row, row);
    }
}

void mmp_fuse_forward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                      const float *txt, const float *mask, const float *img_valid,
                      const float *txt_valid, int n, int batch, mmp_loss_parts *acc, int *skipped)
{
    f->n = n;
    if (img_valid && txt_valid) {
        f->k = mmp_pair_rows(img_valid, txt_valid, n, f->rows);
    } else {
        f->k = n;
    }
    *skipped = n - f->k;
    if (f->k == 0) {
        return;
    }
    mmp_loss_parts parts;
    if (all_rows(f)) {
        mmp_fusion_net_forward(net, acts, img, txt, mask, n, &parts);
    } else {
        gather(f->be, f->img, img, f->rows, f->k, f->img_row);
        gather(f->be, f->txt, txt, f->rows, f->k, f->txt_row);
        gather(f->be, f->mask, mask, f->rows, f->k, (size_t)f->T);
        mmp_fusion_net_forward(net, acts, f->img, f->txt, f->mask, f->k, &parts);
    }
    float weight = (float)f->k / (float)batch;
    acc->loss += weight * parts.loss;
    acc->itc += weight * parts.itc;
    acc->itm += weight * parts.itm;
}

void mmp_fuse_backward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, int batch,
                       float loss_mult, float *dimg, float *dtxt)
{
    mmp_backend *be = f->be;
    be->ops->zero(be, dimg, (size_t)f->n * f->img_row * sizeof(float));
    be->ops->zero(be, dtxt, (size_t)f->n * f->txt_row * sizeof(float));
    if (f->k == 0) {
        return;
    }
    float weight = (float)f->k / (float)batch * loss_mult;
    if (all_rows(f)) {
        mmp_fusion_net_backward(net, acts, weight, dimg, dtxt);
        return;
    }
    be->ops->zero(be, f->dimg, (size_t)f->k * f->img_row * sizeof(float));
    be->ops->zero(be, f->dtxt, (size_t)f->k * f->txt_row * sizeof(float));
    mmp_fusion_net_backward(net, acts, weight, f->dimg, f->dtxt);
    scatter_add(be, dimg, f->dimg, f->rows, f->k, f->img_row);
    scatter_add(be, dtxt, f->dtxt, f->rows, f->k, f->txt_row);
}

/* ---- batch scope --------------------------------------------------------- */

mmp_err mmp_fuse_step_init(mmp_fuse_step *s, mmp_backend *be, int batch, size_t img_row, int T,
                           int D)
{
    *s = (mmp_fuse_step){
        .be = be, .batch = batch, .T = T, .img_row = img_row, .txt_row = (size_t)T * D};
    size_t b = (size_t)batch;
    mmp_err err = alloc_staging(be, b, img_row, s->txt_row, T, &s->img, &s->dimg, &s->txt, &s->dtxt,
                                &s->mask);
    mmp_wgrad_init(&s->wg, be);
    s->valid[0] = calloc(b ? b : 1, sizeof(float));
    s->valid[1] = calloc(b ? b : 1, sizeof(float));
    if (err != MMP_OK || !s->valid[0] || !s->valid[1]) {
        mmp_fuse_step_fini(s);
        return mmp_errorf(MMP_ERR_NOMEM,
                          "fusion: the step's features for %d samples "
                          "(model.fusion.itc_scope: batch)",
                          batch);
    }
    return MMP_OK;
}

void mmp_fuse_step_fini(mmp_fuse_step *s)
{
    if (!s) {
        return;
    }
    free_staging(s->be, s->img, s->dimg, s->txt, s->dtxt, s->mask);
    mmp_wgrad_fini(&s->wg);
    free(s->valid[0]);
    free(s->valid[1]);
    memset(s, 0, sizeof *s);
}

void mmp_fuse_step_begin(mmp_fuse_step *s, int clear)
{
    s->rows = 0;
    s->done = 0;
    if (clear) {
        size_t b = (size_t)s->batch;
        s->be->ops->zero(s->be, s->img, b * s->img_row * sizeof(float));
        s->be->ops->zero(s->be, s->txt, b * s->txt_row * sizeof(float));
        s->be->ops->zero(s->be, s->mask, b * (size_t)s->T * sizeof(float));
        memset(s->valid[0], 0, b * sizeof(float));
        memset(s->valid[1], 0, b * sizeof(float));
    }
}

void mmp_fuse_step_put(mmp_fuse_step *s, int off, int n, const float *img, const float *txt,
                       const float *mask, const float *img_valid, const float *txt_valid)
{
    MMP_ASSERT(off >= 0 && n >= 0 && off + n <= s->batch && !s->done);
    mmp_backend *be = s->be;
    size_t o = (size_t)off;
    if (img) {
        be->ops->copy(be, s->img + o * s->img_row, img, (size_t)n * s->img_row * sizeof(float));
    }
    if (txt) {
        be->ops->copy(be, s->txt + o * s->txt_row, txt, (size_t)n * s->txt_row * sizeof(float));
    }
    if (mask) {
        be->ops->copy(be, s->mask + o * (size_t)s->T, mask, (size_t)n * s->T * sizeof(float));
    }
    for (int i = 0; i < n; i++) {
        s->valid[0][o + i] = img_valid ? img_valid[i] : 1.0f;
        s->valid[1][o + i] = txt_valid ? txt_valid[i] : 1.0f;
    }
    s->rows += n;
}

static void step_run(mmp_fuse_step *s, mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts,
                     float loss_mult, int defer, mmp_loss_parts *acc, int *skipped)
{
    MMP_ASSERT(s->rows == s->batch && f->mb_max >= s->batch && !s->done);
    MMP_ASSERT(!mmp_wgrad_pending(&s->wg));
    mmp_fuse_forward(f, net, acts, s->img, s->txt, s->mask, s->valid[0], s->valid[1], s->batch,
                     s->batch, acc, skipped);
    if (defer) {
        mmp_fusion_net_defer(net, &s->wg);
    }
    mmp_fuse_backward(f, net, acts, s->batch, loss_mult, s->dimg, s->dtxt);
    if (defer) {
        mmp_fusion_net_defer(net, NULL);
    }
    s->done = 1;
}

void mmp_fuse_step_run(mmp_fuse_step *s, mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts,
                       float loss_mult, mmp_loss_parts *acc, int *skipped)
{
    step_run(s, f, net, acts, loss_mult, 0, acc, skipped);
}

void mmp_fuse_step_run_input(mmp_fuse_step *s, mmp_fuse *f, mmp_fusion_net *net,
                             mmp_fusion_acts *acts, float loss_mult, mmp_loss_parts *acc,
                             int *skipped)
{
    step_run(s, f, net, acts, loss_mult, 1, acc, skipped);
}

int mmp_fuse_step_weights_pending(const mmp_fuse_step *s)
{
    return mmp_wgrad_pending(&s->wg) || s->wg.err != MMP_OK;
}

mmp_err mmp_fuse_step_run_weights(mmp_fuse_step *s, mmp_fusion_net *net, int keep)
{
    if (!mmp_fuse_step_weights_pending(s)) {
        return MMP_OK;
    }
    if (keep) {
        return mmp_fusion_net_backward_weights(net, &s->wg);
    }
    return mmp_wgrad_clear(&s->wg);
}
