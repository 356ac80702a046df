/* Products at the training precision (nn/lowp.h). Must never change a value
 * it is given: rounded copies go to the scratch only. */
#include "nn/lowp.h"

#include "nn/wgrad.h"

#include <string.h>

#define PAD(n) (((size_t)(n) + 15) / 16 * 16)

void mmp_lowp_init(mmp_lowp *lp, mmp_backend *be, mmp_precision prec)
{
    memset(lp, 0, sizeof *lp);
    lp->be = be;
    lp->prec = prec;
}

mmp_err mmp_lowp_reserve(mmp_lowp *lp, size_t floats)
{
    if (lp->prec == MMP_PREC_FP32 || floats <= lp->cap) {
        return MMP_OK;
    }
    void *mem = NULL;
    mmp_err e = lp->be->ops->alloc(lp->be, &mem, floats * sizeof(float));
    if (e != MMP_OK) {
        return mmp_error_prefix(e, "%s scratch of %zu bytes", mmp_precision_name(lp->prec),
                                floats * sizeof(float));
    }
    lp->be->ops->free(lp->be, lp->buf);
    lp->buf = mem;
    lp->cap = floats;
    return MMP_OK;
}

void mmp_lowp_fini(mmp_lowp *lp)
{
    if (!lp) {
        return;
    }
    if (lp->buf) {
        lp->be->ops->free(lp->be, lp->buf);
    }
    lp->buf = NULL;
    lp->cap = 0;
}

size_t mmp_lowp_linear_floats(int N, int C, int OC)
{
    return PAD((size_t)N * C) + PAD((size_t)OC * C) + PAD((size_t)N * OC);
}

size_t mmp_lowp_conv2d_floats(const mmp_conv_shape *s)
{
    return PAD((size_t)s->N * s->C * s->H * s->W) + PAD((size_t)s->OC * s->C * s->KH * s->KW) +
           PAD((size_t)s->N * s->OC * s->OH * s->OW);
}

/* Rounds src (n) into the scratch at *at and returns it. */
static const float *rounded(const mmp_lowp *lp, size_t *at, const float *src, size_t n)
{
    float *dst = lp->buf + *at;
    *at += PAD(n);
    lp->be->ops->round_lp(lp->be, dst, src, n, lp->prec);
    return dst;
}

void mmp_lowp_linear_fwd(const mmp_lowp *lp, float *out, const float *inp, const float *w,
                         const float *b, int N, int C, int OC)
{
    // out (N,OC), inp (N,C), w (OC,C), b (OC) or NULL
    mmp_backend *be = lp->be;
    if (lp->prec == MMP_PREC_FP32) {
        be->ops->linear_fwd(be, out, inp, w, b, N, C, OC);
        return;
    }
    if (be->ops->linear_fwd_lp) {
        /* the backend rounds as it goes (CUDA: into 16-bit tensor-core operands) */
        be->ops->linear_fwd_lp(be, out, inp, w, b, N, C, OC, lp->prec);
        return;
    }
    size_t at = 0;
    const float *ri = rounded(lp, &at, inp, (size_t)N * C);
    const float *rw = rounded(lp, &at, w, (size_t)OC * C);
    be->ops->linear_fwd(be, out, ri, rw, b, N, C, OC);
}

void mmp_lowp_linear_bwd(const mmp_lowp *lp, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC)
{
    // dinp (N,C) +=, dw (OC,C) +=, db (OC) +=, dout (N,OC)
    mmp_backend *be = lp->be;
    if (lp->defer && (dw || db)) {
        mmp_wgrad_record_linear(lp->defer, dw, db, dout, inp, w, N, C, OC);
        dw = db = NULL;
        if (!dinp) {
            return;
        }
    }
    if (lp->prec == MMP_PREC_FP32) {
        be->ops->linear_bwd(be, dinp, dw, db, dout, inp, w, N, C, OC);
        return;
    }
    if (be->ops->linear_bwd_lp) {
        be->ops->linear_bwd_lp(be, dinp, dw, db, dout, inp, w, N, C, OC, lp->prec);
        return;
    }
    size_t at = 0;
    const float *ri = rounded(lp, &at, inp, (size_t)N * C);
    const float *rw = rounded(lp, &at, w, (size_t)OC * C);
    const float *rd = rounded(lp, &at, dout, (size_t)N * OC);
    be->ops->linear_bwd(be, dinp, dw, db, rd, ri, rw, N, C, OC);
}

void mmp_lowp_conv2d_fwd(const mmp_lowp *lp, float *out, const float *inp, const float *w,
                         const float *b, const mmp_conv_shape *s, float *scratch)
{
    // out (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW), b (OC) or NULL
    mmp_backend *be = lp->be;
    if (lp->prec == MMP_PREC_FP32) {
        be->ops->conv2d_fwd(be, out, inp, w, b, s, scratch);
        return;
    }
    if (be->ops->conv2d_fwd_lp) {
        be->ops->conv2d_fwd_lp(be, out, inp, w, b, s, lp->prec);
        return;
    }
    size_t at = 0;
    const float *ri = rounded(lp, &at, inp, (size_t)s->N * s->C * s->H * s->W);
    const float *rw = rounded(lp, &at, w, (size_t)s->OC * s->C * s->KH * s->KW);
    be->ops->conv2d_fwd(be, out, ri, rw, b, s, scratch);
}

void mmp_lowp_conv2d_bwd(const mmp_lowp *lp, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const mmp_conv_shape *s, float *scratch)
{
    mmp_backend *be = lp->be;
    if (lp->defer && (dw || db)) {
        mmp_wgrad_record_conv2d(lp->defer, dw, db, dout, inp, w, s, scratch);
        dw = db = NULL;
        if (!dinp) {
            return;
        }
    }
    if (lp->prec == MMP_PREC_FP32) {
        be->ops->conv2d_bwd(be, dinp, dw, db, dout, inp, w, s, scratch);
        return;
    }
    if (be->ops->conv2d_bwd_lp) {
        be->ops->conv2d_bwd_lp(be, dinp, dw, db, dout, inp, w, s, lp->prec);
        return;
    }
    size_t at = 0;
    const float *ri = rounded(lp, &at, inp, (size_t)s->N * s->C * s->H * s->W);
    const float *rw = rounded(lp, &at, w, (size_t)s->OC * s->C * s->KH * s->KW);
    const float *rd = rounded(lp, &at, dout, (size_t)s->N * s->OC * s->OH * s->OW);
    be->ops->conv2d_bwd(be, dinp, dw, db, rd, ri, rw, s, scratch);
}

void mmp_lowp_round(const mmp_lowp *lp, float *x, size_t n)
{
    if (lp->prec != MMP_PREC_FP32) {
        lp->be->ops->round_lp(lp->be, x, x, n, lp->prec);
    }
}
