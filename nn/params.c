/* Parameter arena: declaration, deterministic per-name initialisation. */
#include "nn/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/rng.h"

void mmp_params_init(mmp_params *p)
{
    mmp_params_init_on(p, mmp_backend_cpu());
}

void mmp_params_init_on(mmp_params *p, mmp_backend *be)
{
    memset(p, 0, sizeof *p);
    p->be = be;
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

/* Writes q's initial values to host (q->n floats). */
static void init_values(const mmp_param *q, uint64_t seed, float *host)
{
    mmp_rng r;
    mmp_rng_seed(&r, seed, name_hash(q->name));
    float fan = (float)(q->fan_in > 0 ? q->fan_in : 1);
    for (size_t i = 0; i < q->n; i++) {
        float x = 0;
        switch (q->init) {
        case MMP_INIT_ZERO:
            x = 0;
            break;
        case MMP_INIT_ONE:
            x = 1;
            break;
        case MMP_INIT_CONST:
            x = q->init_scale;
            break;
        case MMP_INIT_NORMAL:
            x = q->init_scale * mmp_rng_normal(&r);
            break;
        case MMP_INIT_KAIMING:
            x = sqrtf(2.0f / fan) * mmp_rng_normal(&r);
            break;
        case MMP_INIT_UNIFORM_FAN: {
            float b = 1.0f / sqrtf(fan);
            x = -b + 2 * b * mmp_rng_uniform(&r);
            break;
        }
        }
        host[i] = x;
    }
}

mmp_err mmp_params_alloc(mmp_params *p, uint64_t seed)
{
    mmp_backend *be = p->be;
    size_t bytes = (p->total ? p->total : 16) * sizeof(float);
    void *mem[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t sizes[5] = {bytes, bytes, bytes, bytes, 2 * bytes};
    for (int i = 0; i < 5; i++) {
        mmp_err e = be->ops->alloc(be, &mem[i], sizes[i]); /* zeroed */
        if (e != MMP_OK) {
            for (int k = 0; k < i; k++) {
                be->ops->free(be, mem[k]);
            }
            return mmp_error_prefix(e, "parameter arena of %zu bytes x6", bytes);
        }
    }
    p->values = mem[0];
    p->grads = mem[1];
    p->adam_m = mem[2];
    p->adam_v = mem[3];
    p->grad_acc = mem[4];
    /* Initial values on the host, then one copy to the backend. */
    float *host = calloc(p->total ? p->total : 16, sizeof(float));
    if (!host) {
        return mmp_errorf(MMP_ERR_NOMEM, "parameter initial values: %zu bytes", bytes);
    }
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        q->w = p->values + q->offset;
        q->g = q->trainable ? p->grads + q->offset : NULL;
        q->m = q->trainable ? p->adam_m + q->offset : NULL;
        q->v = q->trainable ? p->adam_v + q->offset : NULL;
        init_values(q, seed, host + q->offset);
    }
    be->ops->to_device(be, p->values, host, p->total * sizeof(float));
    free(host);
    return mmp_backend_error(be);
}

void mmp_params_fini(mmp_params *p)
{
    if (!p) {
        return;
    }
    mmp_backend *be = p->be ? p->be : mmp_backend_cpu();
    free(p->items);
    be->ops->free(be, p->values);
    be->ops->free(be, p->grads);
    be->ops->free(be, p->adam_m);
    be->ops->free(be, p->adam_v);
    be->ops->free(be, p->grad_acc);
    be->ops->free(be, p->marks);
    memset(p, 0, sizeof *p);
    p->be = be;
}

/* The buffers in runs of adjacent ones (a batch norm's running mean and
 * variance are one): calls each(p, offset in the arena, offset in the
 * marks, floats) per run; returns the buffers' floats in all. */
static size_t buffer_runs(mmp_params *p, void (*each)(mmp_params *, size_t, size_t, size_t))
{
    size_t at = 0;
    for (int i = 0; i < p->count;) {
        if (p->items[i].trainable) {
            i++;
            continue;
        }
        size_t from = p->items[i].offset, n = 0;
        while (i < p->count && !p->items[i].trainable && p->items[i].offset == from + n) {
            n += p->items[i].n;
            i++;
        }
        if (each) {
            each(p, from, at, n);
        }
        at += n;
    }
    return at;
}

static void mark_run(mmp_params *p, size_t arena, size_t mark, size_t n)
{
    p->be->ops->copy(p->be, p->marks + mark, p->values + arena, n * sizeof(float));
}

static void rewind_run(mmp_params *p, size_t arena, size_t mark, size_t n)
{
    p->be->ops->copy(p->be, p->values + arena, p->marks + mark, n * sizeof(float));
}

mmp_err mmp_params_buffers_mark(mmp_params *p)
{
    if (!p->marks) {
        size_t n = buffer_runs(p, NULL);
        if (n == 0) {
            return MMP_OK;
        }
        mmp_err e = p->be->ops->alloc(p->be, (void **)&p->marks, n * sizeof(float));
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "the buffers' mark of %zu bytes", n * sizeof(float));
        }
    }
    buffer_runs(p, mark_run);
    return MMP_OK;
}

void mmp_params_buffers_rewind(mmp_params *p)
{
    if (p->marks) {
        buffer_runs(p, rewind_run);
    }
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
        p->be->ops->zero(p->be, p->grads, p->total * sizeof(float));
    }
    if (p->grad_acc) {
        p->be->ops->zero(p->be, p->grad_acc, p->total * sizeof(double));
    }
}

void mmp_params_mb_begin(mmp_params *p)
{
    if (p->grads) {
        p->be->ops->zero(p->be, p->grads, p->total * sizeof(float));
    }
}

void mmp_params_mb_end(mmp_params *p)
{
    if (p->grads && p->grad_acc) {
        p->be->ops->acc_f64(p->be, p->grad_acc, p->grads, p->total);
    }
}

void mmp_params_acc_range(mmp_params *p, const float *g, size_t n)
{
    MMP_ASSERT(p->grads && g >= p->grads && g + n <= p->grads + p->total);
    if (p->grad_acc) {
        size_t off = (size_t)(g - p->grads);
        p->be->ops->acc_f64(p->be, p->grad_acc + off, p->grads + off, n);
    }
}

void mmp_params_grad_finish(mmp_params *p)
{
    if (p->grads && p->grad_acc) {
        p->be->ops->round_f64(p->be, p->grads, p->grad_acc, p->total);
    }
}

void mmp_params_grad_unscale(mmp_params *p, float loss_scale)
{
    if (p->grads && p->total && loss_scale != 1.0f) {
        p->be->ops->scale(p->be, p->grads, 1.0f / loss_scale, p->total);
    }
}

size_t mmp_params_bytes(const mmp_params *p)
{
    return (p->total ? p->total : 16) * (4 * sizeof(float) + sizeof(double)); /* as alloc */
}

double mmp_params_grad_sumsq(const mmp_params *p)
{
    /* every tensor's sum on the backend, then one wait for all of them,
     * added here in parameter order (the order the norm always had) */
    enum { CHUNK = 256 };
    const float *x[CHUNK];
    size_t n[CHUNK];
    double part[CHUNK], s = 0;
    for (int i = 0; i < p->count;) {
        int k = 0;
        for (; i < p->count && k < CHUNK; i++) {
            if (p->items[i].trainable) {
                x[k] = p->items[i].g;
                n[k++] = p->items[i].n;
            }
        }
        p->be->ops->sumsq(p->be, part, x, n, k);
        for (int j = 0; j < k; j++) {
            s += part[j];
        }
    }
    return s;
}

/* Largest tensor of p, in floats: the size of a host staging buffer. */
static size_t largest(const mmp_params *p)
{
    size_t n = 1;
    for (int i = 0; i < p->count; i++) {
        n = p->items[i].n > n ? p->items[i].n : n;
    }
    return n;
}

/* Appends one tensor; src is backend memory copied through host (be set) or
 * host memory written as it is (be NULL). */
static void write_one(mmp_ckpt_writer *w, mmp_backend *be, const char *name, const mmp_param *q,
                      const float *src, float *host)
{
    if (be) {
        be->ops->to_host(be, host, src, q->n * sizeof(float));
        src = host;
    }
    mmp_ckpt_write(w, name, MMP_F32, q->ndim, q->shape, src);
}

/* Writes items in the file's order (each value, then a trainable one's two
 * moments). be/host as for write_one; cancel (may be NULL) stops it between
 * tensors, leaving no file. */
static mmp_err save_items(const mmp_param *items, int count, mmp_backend *be, float *host,
                          const atomic_int *cancel, const char *path)
{
    mmp_ckpt_writer w;
    MMP_TRY(mmp_ckpt_writer_open(&w, path));
    for (int i = 0; i < count; i++) {
        const mmp_param *q = &items[i];
        char name[MMP_NAME_MAX + 16];
        if (cancel && atomic_load(cancel)) {
            mmp_ckpt_writer_abort(&w);
            return mmp_errorf(MMP_ERR_IO, "%s: checkpoint write cancelled", path);
        }
        write_one(&w, be, q->name, q, q->w, host);
        if (q->trainable) {
            snprintf(name, sizeof name, "%s.adam_m", q->name);
            write_one(&w, be, name, q, q->m, host);
            snprintf(name, sizeof name, "%s.adam_v", q->name);
            write_one(&w, be, name, q, q->v, host);
        }
    }
    mmp_err e = be ? mmp_backend_error(be) : MMP_OK;
    if (e != MMP_OK) {
        mmp_ckpt_writer_abort(&w); /* a device copy failed: never publish what it wrote */
        return e;
    }
    return mmp_ckpt_writer_close(&w);
}

mmp_err mmp_params_save(const mmp_params *p, const char *path)
{
    float *host = malloc(largest(p) * sizeof(float));
    if (!host) {
        return mmp_errorf(MMP_ERR_NOMEM, "checkpoint staging buffer");
    }
    mmp_err e = save_items(p->items, p->count, p->be, host, NULL, path);
    free(host);
    return e;
}

mmp_err mmp_params_snapshot(const mmp_params *p, mmp_params_snap *s)
{
    size_t total = p->total ? p->total : 1;
    if (s->total != total) {
        free(s->host);
        s->total = 0;
        if (!(s->host = malloc(3 * total * sizeof(float)))) {
            return mmp_errorf(MMP_ERR_NOMEM, "checkpoint snapshot: %zu bytes",
                              3 * total * sizeof(float));
        }
        s->total = total;
    }
    if (s->count != p->count) {
        mmp_param *items = realloc(s->items, (size_t)(p->count ? p->count : 1) * sizeof *items);
        if (!items) {
            return mmp_errorf(MMP_ERR_NOMEM, "checkpoint snapshot: %d entries", p->count);
        }
        s->items = items;
        s->count = p->count;
    }
    float *values = s->host, *m = s->host + total, *v = s->host + 2 * total;
    mmp_backend *be = p->be;
    be->ops->to_host(be, values, p->values, p->total * sizeof(float));
    be->ops->to_host(be, m, p->adam_m, p->total * sizeof(float));
    be->ops->to_host(be, v, p->adam_v, p->total * sizeof(float));
    MMP_TRY(mmp_backend_error(be));
    s->bytes = 0;
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &s->items[i];
        *q = p->items[i];
        q->w = values + q->offset;
        q->g = NULL;
        q->m = q->trainable ? m + q->offset : NULL;
        q->v = q->trainable ? v + q->offset : NULL;
        s->bytes += (q->trainable ? 3 : 1) * q->n * sizeof(float);
    }
    atomic_store(&s->cancel, 0);
    return MMP_OK;
}

mmp_err mmp_params_snap_save(const mmp_params_snap *s, const char *path)
{
    return save_items(s->items, s->count, NULL, NULL, &s->cancel, path);
}

void mmp_params_snap_cancel(mmp_params_snap *s)
{
    atomic_store(&s->cancel, 1);
}

void mmp_params_snap_fini(mmp_params_snap *s)
{
    if (s) {
        free(s->items);
        free(s->host);
        s->items = NULL;
        s->host = NULL;
        s->count = 0;
        s->total = 0;
    }
}

static mmp_err load_one(mmp_params *p, const mmp_ckpt *c, const char *name, const mmp_param *q,
                        float *dst)
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
        char got[96], want[96];
        int at = 0;
        for (int d = 0; d < q->ndim && at < (int)sizeof want - 24; d++) {
            at += snprintf(want + at, sizeof want - (size_t)at, "%s%lld", d ? "," : "(",
                           (long long)q->shape[d]);
        }
        snprintf(want + at, sizeof want - (size_t)at, ")");
        return mmp_errorf(MMP_ERR_DATA, "checkpoint tensor '%s' is %s %s, the model wants f32 %s",
                          name, mmp_dtype_name(e->t.dtype), mmp_shape_str(&e->t, got, sizeof got),
                          want);
    }
    p->be->ops->to_device(p->be, dst, e->t.data, q->n * sizeof(float));
    return mmp_backend_error(p->be);
}

mmp_err mmp_params_load(mmp_params *p, const mmp_ckpt *c)
{
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        char name[MMP_NAME_MAX + 16];
        MMP_TRY(load_one(p, c, q->name, q, q->w));
        if (q->trainable) {
            snprintf(name, sizeof name, "%s.adam_m", q->name);
            MMP_TRY(load_one(p, c, name, q, q->m));
            snprintf(name, sizeof name, "%s.adam_v", q->name);
            MMP_TRY(load_one(p, c, name, q, q->v));
        }
    }
    return MMP_OK;
}

void mmp_params_net_init(mmp_params *p, mmp_lowp *lp, mmp_backend *be, mmp_precision prec)
{
    mmp_lowp_init(lp, be, prec);
    mmp_params_init_on(p, be);
}

void mmp_params_net_fini(mmp_params *p, mmp_lowp *lp)
{
    mmp_params_fini(p);
    mmp_lowp_fini(lp);
}
