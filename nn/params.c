/* Parameter arena: declaration, deterministic per-name initialisation. */
#include "nn/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/rng.h"
#include "kernels/cpu.h"

void mmp_params_init(mmp_params *p)
{
    memset(p, 0, sizeof *p);
}

mmp_err mmp_params_add(mmp_params *p, const char *name, int ndim, const int64_t *shape,
                       int trainable, int decay, mmp_init init, float init_scale, int *index)
{
    if (ndim < 1 || ndim > 4 || strlen(name) >= MMP_NAME_MAX) {
        return mmp_errorf(MMP_ERR_INVALID, "parameter '%s': bad rank or name", name);
    }
    if (p->values) {
        return mmp_errorf(MMP_ERR_INTERNAL, "parameter '%s' declared after alloc", name);
    }
    if (p->count == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        mmp_param *items = realloc(p->items, (size_t)cap * sizeof *items);
        if (!items) {
            return mmp_errorf(MMP_ERR_NOMEM, "parameter table");
        }
        p->items = items;
        p->cap = cap;
    }
    mmp_param *q = &p->items[p->count];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->ndim = ndim;
    q->n = 1;
    for (int i = 0; i < ndim; i++) {
        q->shape[i] = shape[i];
        q->n *= (size_t)shape[i];
    }
    /* fan_in: product of all dims but the first (linear (out,in), conv (oc,c,kh,kw)). */
    q->fan_in = 1;
    for (int i = 1; i < ndim; i++) {
        q->fan_in *= shape[i];
    }
    q->trainable = trainable;
    q->decay = decay;
    q->init = init;
    q->init_scale = init_scale;
    q->offset = p->total;
    /* Keep each tensor 16-float aligned inside the arena. */
    p->total += (q->n + 15) / 16 * 16;
    if (index) {
        *index = p->count;
    }
    p->count++;
    return MMP_OK;
}

static uint64_t name_hash(const char *s)
{
    return mmp_fnv1a(MMP_FNV1A_INIT, s, strlen(s));
}

static void init_values(mmp_param *q, uint64_t seed)
{
    mmp_rng r;
    mmp_rng_seed(&r, seed, name_hash(q->name));
    float fan = (float)(q->fan_in > 0 ? q->fan_in : 1);
    for (size_t i = 0; i < q->n; i++) {
        float x = 0;
        switch (q->init) {
        case MMP_INIT_ZERO: x = 0; break;
        case MMP_INIT_ONE: x = 1; break;
        case MMP_INIT_CONST: x = q->init_scale; break;
        case MMP_INIT_NORMAL: x = q->init_scale * mmp_rng_normal(&r); break;
        case MMP_INIT_KAIMING: x = sqrtf(2.0f / fan) * mmp_rng_normal(&r); break;
        case MMP_INIT_UNIFORM_FAN: {
            float b = 1.0f / sqrtf(fan);
            x = -b + 2 * b * mmp_rng_uniform(&r);
            break;
        }
        }
        q->w[i] = x;
    }
}

mmp_err mmp_params_alloc(mmp_params *p, uint64_t seed)
{
    size_t bytes = (p->total ? p->total : 16) * sizeof(float);
    p->values = aligned_alloc(64, bytes);
    p->grads = aligned_alloc(64, bytes);
    p->adam_m = aligned_alloc(64, bytes);
    p->adam_v = aligned_alloc(64, bytes);
    p->grad_acc = aligned_alloc(64, 2 * bytes);
    if (!p->values || !p->grads || !p->adam_m || !p->adam_v || !p->grad_acc) {
        return mmp_errorf(MMP_ERR_NOMEM, "parameter arena of %zu bytes x6", bytes);
    }
    memset(p->grad_acc, 0, 2 * bytes);
    memset(p->values, 0, bytes);
    memset(p->grads, 0, bytes);
    memset(p->adam_m, 0, bytes);
    memset(p->adam_v, 0, bytes);
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        q->w = p->values + q->offset;
        q->g = q->trainable ? p->grads + q->offset : NULL;
        q->m = q->trainable ? p->adam_m + q->offset : NULL;
        q->v = q->trainable ? p->adam_v + q->offset : NULL;
        init_values(q, seed);
    }
    return MMP_OK;
}

void mmp_params_fini(mmp_params *p)
{
    if (!p) {
        return;
    }
    free(p->items);
    free(p->values);
    free(p->grads);
    free(p->adam_m);
    free(p->adam_v);
    free(p->grad_acc);
    memset(p, 0, sizeof *p);
}

mmp_param *mmp_params_find(mmp_params *p, const char *name)
{
    for (int i = 0; i < p->count; i++) {
        if (strcmp(p->items[i].name, name) == 0) {
            return &p->items[i];
        }
    }
    return NULL;
}

void mmp_params_zero_grad(mmp_params *p)
{
    if (p->grads) {
        memset(p->grads, 0, p->total * sizeof(float));
    }
    if (p->grad_acc) {
        memset(p->grad_acc, 0, p->total * sizeof(double));
    }
}

void mmp_params_mb_begin(mmp_params *p)
{
    if (p->grads) {
        memset(p->grads, 0, p->total * sizeof(float));
    }
}

void mmp_params_mb_end(mmp_params *p)
{
    const float *restrict g = p->grads;
    double *restrict a = p->grad_acc;
    for (size_t i = 0; g && a && i < p->total; i++) {
        a[i] += g[i];
    }
}

void mmp_params_grad_finish(mmp_params *p)
{
    float *restrict g = p->grads;
    const double *restrict a = p->grad_acc;
    for (size_t i = 0; g && a && i < p->total; i++) {
        g[i] = (float)a[i];
    }
}

double mmp_params_grad_sumsq(const mmp_params *p)
{
    double s = 0;
    for (int i = 0; i < p->count; i++) {
        const mmp_param *q = &p->items[i];
        if (q->trainable) {
            s += mmp_cpu_sumsq(q->g, q->n);
        }
    }
    return s;
}

mmp_err mmp_params_save(const mmp_params *p, const char *path)
{
    mmp_ckpt_writer w;
    MMP_TRY(mmp_ckpt_writer_open(&w, path));
    for (int i = 0; i < p->count; i++) {
        const mmp_param *q = &p->items[i];
        char name[MMP_NAME_MAX + 16];
        mmp_ckpt_write(&w, q->name, MMP_F32, q->ndim, q->shape, q->w);
        if (q->trainable) {
            snprintf(name, sizeof name, "%s.adam_m", q->name);
            mmp_ckpt_write(&w, name, MMP_F32, q->ndim, q->shape, q->m);
            snprintf(name, sizeof name, "%s.adam_v", q->name);
            mmp_ckpt_write(&w, name, MMP_F32, q->ndim, q->shape, q->v);
        }
    }
    return mmp_ckpt_writer_close(&w);
}

static mmp_err load_one(const mmp_ckpt *c, const char *name, const mmp_param *q, float *dst)
{
    const mmp_ckpt_entry *e = mmp_ckpt_find(c, name);
    if (!e) {
        return mmp_errorf(MMP_ERR_DATA, "checkpoint has no tensor '%s'", name);
    }
    int same = e->t.dtype == MMP_F32 && e->t.ndim == q->ndim;
    for (int d = 0; same && d < q->ndim; d++) {
        same = e->t.shape[d] == q->shape[d];
    }
    if (!same) {
        char buf[96];
        return mmp_errorf(MMP_ERR_DATA, "checkpoint tensor '%s' is %s %s, the model wants f32 of %zu",
                          name, mmp_dtype_name(e->t.dtype), mmp_shape_str(&e->t, buf, sizeof buf),
                          q->n);
    }
    memcpy(dst, e->t.data, q->n * sizeof(float));
    return MMP_OK;
}

mmp_err mmp_params_load(mmp_params *p, const mmp_ckpt *c)
{
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        char name[MMP_NAME_MAX + 16];
        MMP_TRY(load_one(c, q->name, q, q->w));
        if (q->trainable) {
            snprintf(name, sizeof name, "%s.adam_m", q->name);
            MMP_TRY(load_one(c, name, q, q->m));
            snprintf(name, sizeof name, "%s.adam_v", q->name);
            MMP_TRY(load_one(c, name, q, q->v));
        }
    }
    return MMP_OK;
}
