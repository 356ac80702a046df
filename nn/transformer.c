/* Pre-LN transformer sublayers (attention, feed-forward) over a device backend.
 *
 * Used by the text encoder (self-attention) and the fusion stage
 * (cross-attention). Must never allocate in forward/backward and never own a
 * network's parameters: it only points into an mmp_params arena. */
#include "nn/transformer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameter pieces ------------------------------------------------------ */
static mmp_err declare(mmp_tf_ref *r, mmp_params *p, const char *name, const char *suffix, int ndim,
                       const int64_t *shape, int decay, mmp_init init)
{
    char full[MMP_NAME_MAX];
    int n = snprintf(full, sizeof full, "%s.%s", name, suffix);
    if (n < 0 || n >= (int)sizeof full) {
        return mmp_errorf(MMP_ERR_INVALID, "parameter name '%s.%s' too long", name, suffix);
    }
    return mmp_params_add(p, full, ndim, shape, 1, decay, init, 0.0f, &r->index);
}

void mmp_tf_ref_bind(mmp_tf_ref *r, mmp_params *p)
{
    r->w = p->items[r->index].w;
    r->g = p->items[r->index].g;
}

mmp_err mmp_tf_linear_declare(mmp_tf_linear *l, mmp_params *p, const char *name, int in, int out)
{
    int64_t ws[2] = {out, in}, bs[1] = {out};
    l->in = in;
    l->out = out;
    MMP_TRY(declare(&l->w, p, name, "weight", 2, ws, 1, MMP_INIT_UNIFORM_FAN));
    return declare(&l->b, p, name, "bias", 1, bs, 0, MMP_INIT_ZERO);
}

mmp_err mmp_tf_norm_declare(mmp_tf_norm *n, mmp_params *p, const char *name, int C)
{
    int64_t s[1] = {C};
    n->C = C;
    MMP_TRY(declare(&n->w, p, name, "weight", 1, s, 0, MMP_INIT_ONE));
    return declare(&n->b, p, name, "bias", 1, s, 0, MMP_INIT_ZERO);
}

void mmp_tf_linear_bind(mmp_tf_linear *l, mmp_params *p)
{
    mmp_tf_ref_bind(&l->w, p);
    mmp_tf_ref_bind(&l->b, p);
}

void mmp_tf_norm_bind(mmp_tf_norm *n, mmp_params *p)
{
    mmp_tf_ref_bind(&n->w, p);
    mmp_tf_ref_bind(&n->b, p);
}

/* Linear layers at the network's precision (lp NULL: fp32). */
static void linear_fwd(mmp_backend *be, const mmp_lowp *lp, const mmp_tf_linear *l, float *out,
                       const float *inp, int N)
{
    if (lp) {
        mmp_lowp_linear_fwd(lp, out, inp, l->w.w, l->b.w, N, l->in, l->out);
    } else {
        be->ops->linear_fwd(be, out, inp, l->w.w, l->b.w, N, l->in, l->out);
    }
}

static void linear_bwd(mmp_backend *be, const mmp_lowp *lp, const mmp_tf_linear *l, float *dinp,
                       const float *dout, const float *inp, int N)
{
    if (lp) {
        mmp_lowp_linear_bwd(lp, dinp, l->w.g, l->b.g, dout, inp, l->w.w, N, l->in, l->out);
    } else {
        be->ops->linear_bwd(be, dinp, l->w.g, l->b.g, dout, inp, l->w.w, N, l->in, l->out);
    }
}

/* Attention's inputs at the network's precision: q, k, v and the context
 * gradient feed only the attention products, so they are rounded in place. */
static mmp_precision attn_prec(const mmp_tf_attn *a)
{
    return a->lp ? a->lp->prec : MMP_PREC_FP32;
}

static void attn_round(const mmp_tf_attn *a, float *x, size_t n)
{
    if (a->lp) {
        mmp_lowp_round(a->lp, x, n);
    }
}

static void norm_fwd(mmp_backend *be, const mmp_tf_norm *n, float *out, float *mean, float *rstd,
                     const float *inp, int N)
{
    be->ops->layernorm_fwd(be, out, mean, rstd, inp, n->w.w, n->b.w, N, n->C, MMP_TF_LN_EPS);
}

static void norm_bwd(mmp_backend *be, const mmp_tf_norm *n, float *dinp, const float *dout,
                     const float *inp, const float *mean, const float *rstd, int N)
{
    be->ops->layernorm_bwd(be, dinp, n->w.g, n->b.g, dout, inp, n->w.w, mean, rstd, N, n->C);
}

/* ---- activation slab ----------------------------------------------------- */
float *mmp_tf_slab_take(mmp_tf_slab *s, size_t n)
{
    float *p = s->base ? s->base + s->used : NULL;
    s->used += (n + 15) / 16 * 16;
    return p;
}

mmp_err mmp_tf_slab_alloc(mmp_tf_slab *s, mmp_backend *be, void (*carve)(void *ctx, mmp_tf_slab *s),
                          void *ctx)
{
    s->be = be;
    s->base = NULL;
    s->used = 0;
    carve(ctx, s);
    size_t bytes = (s->used ? s->used : 16) * sizeof(float);
    void *mem = NULL;
    mmp_err e = be->ops->alloc(be, &mem, bytes); /* zeroed */
    if (e != MMP_OK) {
        return mmp_error_prefix(e, "activation slab of %zu bytes", bytes);
    }
    s->base = mem;
    s->used = 0;
    carve(ctx, s);
    return MMP_OK;
}

void mmp_tf_slab_free(mmp_tf_slab *s)
{
    if (!s) {
        return;
    }
    if (s->base) {
        s->be->ops->free(s->be, s->base);
    }
    s->base = NULL;
    s->used = 0;
}

/* ---- attention sublayer --------------------------------------------------- */
static mmp_err join(char *out, const char *prefix, const char *name)
{
    int n = snprintf(out, MMP_NAME_MAX, "%s%s", prefix, name);
    if (n < 0 || n >= MMP_NAME_MAX) {
        return mmp_errorf(MMP_ERR_INVALID, "parameter prefix '%s' too long", prefix);
    }
    return MMP_OK;
}

mmp_err mmp_tf_attn_declare(mmp_tf_attn *a, mmp_params *p, const char *prefix, int D, int NH,
                            int cross)
{
    char name[MMP_NAME_MAX];
    if (D <= 0 || NH <= 0 || D % NH != 0) {
        return mmp_errorf(MMP_ERR_INVALID, "%sattn: width %d not divisible by %d heads", prefix, D,
                          NH);
    }
    memset(a, 0, sizeof *a);
    a->be = p->be;
    a->D = D;
    a->NH = NH;
    a->cross = cross;
    MMP_TRY(join(name, prefix, "ln1"));
    MMP_TRY(mmp_tf_norm_declare(&a->ln1, p, name, D));
    if (cross) {
        MMP_TRY(join(name, prefix, "ln_kv"));
        MMP_TRY(mmp_tf_norm_declare(&a->ln_kv, p, name, D));
    }
    MMP_TRY(join(name, prefix, "attn.q"));
    MMP_TRY(mmp_tf_linear_declare(&a->q, p, name, D, D));
    MMP_TRY(join(name, prefix, "attn.k"));
    MMP_TRY(mmp_tf_linear_declare(&a->k, p, name, D, D));
    MMP_TRY(join(name, prefix, "attn.v"));
    MMP_TRY(mmp_tf_linear_declare(&a->v, p, name, D, D));
    MMP_TRY(join(name, prefix, "attn.out"));
    return mmp_tf_linear_declare(&a->o, p, name, D, D);
}

void mmp_tf_attn_bind(mmp_tf_attn *a, mmp_params *p)
{
    mmp_tf_norm_bind(&a->ln1, p);
    if (a->cross) {
        mmp_tf_norm_bind(&a->ln_kv, p);
    }
    mmp_tf_linear_bind(&a->q, p);
    mmp_tf_linear_bind(&a->k, p);
    mmp_tf_linear_bind(&a->v, p);
    mmp_tf_linear_bind(&a->o, p);
}

void mmp_tf_attn_acts_carve(mmp_tf_attn_acts *s, mmp_tf_slab *slab, const mmp_tf_attn *a, int B,
                            int Tq, int Tk, int Ns)
{
    size_t D = (size_t)a->D, N = (size_t)B * Tq;
    size_t Nk = a->cross ? (size_t)Ns * Tk : N;
    memset(s, 0, sizeof *s);
    s->ln = mmp_tf_slab_take(slab, N * D);
    s->ln_mean = mmp_tf_slab_take(slab, N);
    s->ln_rstd = mmp_tf_slab_take(slab, N);
    if (a->cross) {
        s->kv_ln = mmp_tf_slab_take(slab, Nk * D);
        s->kv_mean = mmp_tf_slab_take(slab, Nk);
        s->kv_rstd = mmp_tf_slab_take(slab, Nk);
    }
    s->q = mmp_tf_slab_take(slab, N * D);
    s->k = mmp_tf_slab_take(slab, Nk * D);
    s->v = mmp_tf_slab_take(slab, Nk * D);
    s->att = mmp_tf_slab_take(slab, (size_t)B * a->NH * Tq * Tk);
    s->ctx = mmp_tf_slab_take(slab, N * D);
}

void mmp_tf_scratch_carve(mmp_tf_scratch *s, mmp_tf_slab *slab, int D, int N, int Nk, int H)
{
    memset(s, 0, sizeof *s);
    s->d_ln = mmp_tf_slab_take(slab, (size_t)N * D);
    s->dq = mmp_tf_slab_take(slab, (size_t)N * D);
    s->dctx = mmp_tf_slab_take(slab, (size_t)N * D);
    s->dk = mmp_tf_slab_take(slab, (size_t)Nk * D);
    s->dv = mmp_tf_slab_take(slab, (size_t)Nk * D);
    s->d_kvln = mmp_tf_slab_take(slab, (size_t)Nk * D);
    s->dh = mmp_tf_slab_take(slab, (size_t)N * H);
    s->dg = mmp_tf_slab_take(slab, (size_t)N * H);
}

/* out = x + Wo ctx + bo */
static void out_proj_fwd(const mmp_tf_attn *a, const mmp_tf_attn_acts *s, float *out,
                         const float *x, int N)
{
    mmp_backend *be = a->be;
    linear_fwd(be, a->lp, &a->o, out, s->ctx, N);
    be->ops->add(be, out, out, x, (size_t)N * a->D);
}

void mmp_tf_self_attn_fwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, float *out, const float *x,
                          const float *key_mask, int B, int T)
{
    mmp_backend *be = a->be;
    int N = B * T;
    norm_fwd(be, &a->ln1, s->ln, s->ln_mean, s->ln_rstd, x, N);
    linear_fwd(be, a->lp, &a->q, s->q, s->ln, N);
    linear_fwd(be, a->lp, &a->k, s->k, s->ln, N);
    linear_fwd(be, a->lp, &a->v, s->v, s->ln, N);
    attn_round(a, s->q, (size_t)N * a->D);
    attn_round(a, s->k, (size_t)N * a->D);
    attn_round(a, s->v, (size_t)N * a->D);
    be->ops->attention_fwd(be, s->ctx, s->att, s->q, s->k, s->v, key_mask, B, T, T, a->D, a->NH,
                           attn_prec(a));
    out_proj_fwd(a, s, out, x, N);
}

void mmp_tf_self_attn_bwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, mmp_tf_scratch *w, float *dx,
                          const float *dout, const float *x, int B, int T)
{
    mmp_backend *be = a->be;
    int N = B * T;
    size_t nd = (size_t)N * a->D;
    be->ops->zero(be, w->dctx, nd * sizeof(float));
    be->ops->zero(be, w->dq, nd * sizeof(float));
    be->ops->zero(be, w->dk, nd * sizeof(float));
    be->ops->zero(be, w->dv, nd * sizeof(float));
    be->ops->zero(be, w->d_ln, nd * sizeof(float));
    /* dout is read only here, so dx may alias it. */
    linear_bwd(be, a->lp, &a->o, w->dctx, dout, s->ctx, N);
    attn_round(a, w->dctx, nd);
    be->ops->attention_bwd(be, w->dq, w->dk, w->dv, w->dctx, s->att, s->q, s->k, s->v, B, T, T,
                           a->D, a->NH, attn_prec(a));
    linear_bwd(be, a->lp, &a->q, w->d_ln, w->dq, s->ln, N);
    linear_bwd(be, a->lp, &a->k, w->d_ln, w->dk, s->ln, N);
    linear_bwd(be, a->lp, &a->v, w->d_ln, w->dv, s->ln, N);
    norm_bwd(be, &a->ln1, dx, w->d_ln, x, s->ln_mean, s->ln_rstd, N);
}

void mmp_tf_cross_attn_fwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, float *out, const float *x,
                           int B, int Tq, const float *src, int Ns, int Tk, const int *src_of)
{
    mmp_backend *be = a->be;
    int N = B * Tq, Nk = Ns * Tk, D = a->D, NH = a->NH;
    norm_fwd(be, &a->ln1, s->ln, s->ln_mean, s->ln_rstd, x, N);
    linear_fwd(be, a->lp, &a->q, s->q, s->ln, N);
    /* Keys and values once per source, however many query sequences share it. */
    norm_fwd(be, &a->ln_kv, s->kv_ln, s->kv_mean, s->kv_rstd, src, Nk);
    linear_fwd(be, a->lp, &a->k, s->k, s->kv_ln, Nk);
    linear_fwd(be, a->lp, &a->v, s->v, s->kv_ln, Nk);
    attn_round(a, s->q, (size_t)N * D);
    attn_round(a, s->k, (size_t)Nk * D);
    attn_round(a, s->v, (size_t)Nk * D);
    for (int b = 0; b < B; b++) {
        size_t kv = (size_t)src_of[b] * Tk * D;
        be->ops->attention_fwd(be, s->ctx + (size_t)b * Tq * D, s->att + (size_t)b * NH * Tq * Tk,
                               s->q + (size_t)b * Tq * D, s->k + kv, s->v + kv, NULL, 1, Tq, Tk, D,
                               NH, attn_prec(a));
    }
    out_proj_fwd(a, s, out, x, N);
}

void mmp_tf_cross_attn_bwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, mmp_tf_scratch *w, float *dx,
                           float *dsrc, const float *dout, const float *x, int B, int Tq,
                           const float *src, int Ns, int Tk, const int *src_of)
{
    mmp_backend *be = a->be;
    int N = B * Tq, Nk = Ns * Tk, D = a->D, NH = a->NH;
    size_t nd = (size_t)N * D, nkd = (size_t)Nk * D;
    be->ops->zero(be, w->dctx, nd * sizeof(float));
    be->ops->zero(be, w->dq, nd * sizeof(float));
    be->ops->zero(be, w->d_ln, nd * sizeof(float));
    be->ops->zero(be, w->dk, nkd * sizeof(float));
    be->ops->zero(be, w->dv, nkd * sizeof(float));
    be->ops->zero(be, w->d_kvln, nkd * sizeof(float));
    linear_bwd(be, a->lp, &a->o, w->dctx, dout, s->ctx, N);
    attn_round(a, w->dctx, nd);
    /* The kernel accumulates, so a source's dk/dv sum its query sequences in
     * the fixed order b = 0..B-1. */
    for (int b = 0; b < B; b++) {
        size_t kv = (size_t)src_of[b] * Tk * D;
        be->ops->attention_bwd(be, w->dq + (size_t)b * Tq * D, w->dk + kv, w->dv + kv,
                               w->dctx + (size_t)b * Tq * D, s->att + (size_t)b * NH * Tq * Tk,
                               s->q + (size_t)b * Tq * D, s->k + kv, s->v + kv, 1, Tq, Tk, D, NH,
                               attn_prec(a));
    }
    linear_bwd(be, a->lp, &a->q, w->d_ln, w->dq, s->ln, N);
    norm_bwd(be, &a->ln1, dx, w->d_ln, x, s->ln_mean, s->ln_rstd, N);
    linear_bwd(be, a->lp, &a->k, w->d_kvln, w->dk, s->kv_ln, Nk);
    linear_bwd(be, a->lp, &a->v, w->d_kvln, w->dv, s->kv_ln, Nk);
    norm_bwd(be, &a->ln_kv, dsrc, w->d_kvln, src, s->kv_mean, s->kv_rstd, Nk);
}

/* ---- feed-forward sublayer ------------------------------------------------ */
mmp_err mmp_tf_ffn_declare(mmp_tf_ffn *f, mmp_params *p, const char *prefix, int D, int H)
{
    char name[MMP_NAME_MAX];
    if (D <= 0 || H <= 0) {
        return mmp_errorf(MMP_ERR_INVALID, "%sffn: bad width %d or hidden %d", prefix, D, H);
    }
    memset(f, 0, sizeof *f);
    f->be = p->be;
    f->D = D;
    f->H = H;
    MMP_TRY(join(name, prefix, "ln2"));
    MMP_TRY(mmp_tf_norm_declare(&f->ln2, p, name, D));
    MMP_TRY(join(name, prefix, "ffn.fc1"));
    MMP_TRY(mmp_tf_linear_declare(&f->fc1, p, name, D, H));
    MMP_TRY(join(name, prefix, "ffn.fc2"));
    return mmp_tf_linear_declare(&f->fc2, p, name, H, D);
}

void mmp_tf_ffn_bind(mmp_tf_ffn *f, mmp_params *p)
{
    mmp_tf_norm_bind(&f->ln2, p);
    mmp_tf_linear_bind(&f->fc1, p);
    mmp_tf_linear_bind(&f->fc2, p);
}

void mmp_tf_ffn_acts_carve(mmp_tf_ffn_acts *s, mmp_tf_slab *slab, const mmp_tf_ffn *f, int N)
{
    memset(s, 0, sizeof *s);
    s->ln = mmp_tf_slab_take(slab, (size_t)N * f->D);
    s->ln_mean = mmp_tf_slab_take(slab, (size_t)N);
    s->ln_rstd = mmp_tf_slab_take(slab, (size_t)N);
    s->h = mmp_tf_slab_take(slab, (size_t)N * f->H);
    s->g = mmp_tf_slab_take(slab, (size_t)N * f->H);
}

void mmp_tf_ffn_fwd(const mmp_tf_ffn *f, mmp_tf_ffn_acts *s, float *out, const float *x, int N)
{
    mmp_backend *be = f->be;
    norm_fwd(be, &f->ln2, s->ln, s->ln_mean, s->ln_rstd, x, N);
    linear_fwd(be, f->lp, &f->fc1, s->h, s->ln, N);
    be->ops->gelu_fwd(be, s->g, s->h, (size_t)N * f->H);
    linear_fwd(be, f->lp, &f->fc2, out, s->g, N);
    be->ops->add(be, out, out, x, (size_t)N * f->D);
}

void mmp_tf_ffn_bwd(const mmp_tf_ffn *f, mmp_tf_ffn_acts *s, mmp_tf_scratch *w, float *dx,
                    const float *dout, const float *x, int N)
{
    mmp_backend *be = f->be;
    size_t nh = (size_t)N * f->H;
    be->ops->zero(be, w->dg, nh * sizeof(float));
    be->ops->zero(be, w->dh, nh * sizeof(float));
    be->ops->zero(be, w->d_ln, (size_t)N * f->D * sizeof(float));
    /* dout is read only here, so dx may alias it. */
    linear_bwd(be, f->lp, &f->fc2, w->dg, dout, s->g, N);
    be->ops->gelu_bwd(be, w->dh, w->dg, s->h, nh);
    linear_bwd(be, f->lp, &f->fc1, w->d_ln, w->dh, s->ln, N);
    norm_bwd(be, &f->ln2, dx, w->d_ln, x, s->ln_mean, s->ln_rstd, N);
}

/* ---- one encoder layer and a network's own state ---------------------------- */
mmp_err mmp_tf_layer_declare(mmp_tf_layer *l, mmp_params *p, const char *prefix, int D, int NH,
                             int cross, int H)
{
    MMP_TRY(mmp_tf_attn_declare(&l->attn, p, prefix, D, NH, cross));
    return mmp_tf_ffn_declare(&l->ffn, p, prefix, D, H);
}

void mmp_tf_layer_bind(mmp_tf_layer *l, mmp_params *p, const mmp_lowp *lp)
{
    mmp_tf_attn_bind(&l->attn, p);
    mmp_tf_ffn_bind(&l->ffn, p);
    l->attn.lp = lp;
    l->ffn.lp = lp;
}
