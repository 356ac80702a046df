/* Normalisations on the CPU: batch norm (per channel over N and HW), layer
 * norm (per row over C) and L2 normalisation (per row).
 *
 * Statistics are summed in double in a fixed order, so the reference is both
 * deterministic and accurate enough to judge the CUDA kernels by. The order:
 * element i of each row (a channel's HW run, a layer-norm row) goes to
 * partial sum i % LANES, the partial sums carry over from row to row and are
 * added pairwise at the end. One running sum would be a chain of dependent
 * double adds, several times slower than the loads; LANES independent ones
 * keep the units busy and the result independent of vector width.
 * The saved mean / rstd are the float values the forward used, so backward
 * differentiates exactly what forward computed. Batch norm's channels are
 * independent and run on the kernels' pool (parallel.h). */
#include "kernels/cpu.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/parallel.h"

#define LANES 4

typedef struct {
    double s[LANES];
} lanes;

static double lanes_total(const lanes *a)
{
    return (a->s[0] + a->s[1]) + (a->s[2] + a->s[3]);
}

/* Batch norm sums BN_GROUP channels side by side: one channel's LANES sums
 * are LANES chains of dependent double adds, which leave the units mostly
 * waiting (a latency per element); BN_GROUP channels give BN_GROUP times as
 * many independent chains. Each channel's own sums keep their order, so the
 * grouping changes no bit. A group past the range's end repeats its last
 * channel in the spare slots (summed, then ignored). The sums are vectors
 * of LANES doubles (GCC / clang vector extensions, plain code on any target):
 * vector lane k is lanes lane k, and a vector op is LANES scalar ones. */
#define BN_GROUP 4

typedef double lanes_v __attribute__((vector_size(LANES * sizeof(double))));
typedef float floats_v __attribute__((vector_size(LANES * sizeof(float))));

/* Helpers take and fill vectors through pointers: a vector wider than the
 * target's registers as an argument or return value changes the ABI (and
 * GCC warns of it); inlined, these cost nothing. */
static inline void load_floats(floats_v *v, const float *p)
{
    memcpy(v, p, sizeof *v);
}

/* Widening element by element, not by __builtin_convertvector: GCC 12
 * turns the latter into two 2-float conversions and an insert in the AVX2
 * clones (three shuffle-port uops per 4 floats, the bound of the sum
 * loops), the former into one vcvtps2pd. The values are the same. */
static inline void widen(lanes_v *v, const floats_v *f)
{
    *v = (lanes_v){(*f)[0], (*f)[1], (*f)[2], (*f)[3]};
}

static inline void load_wide(lanes_v *v, const float *p)
{
    *v = (lanes_v){p[0], p[1], p[2], p[3]};
}

static inline void lanes_get(lanes_v *v, const lanes *a)
{
    memcpy(v, a->s, sizeof *v);
}

static inline void lanes_put(lanes *a, const lanes_v *v)
{
    memcpy(a->s, v, sizeof *v);
}

/* g += dy * w, gx += dy * w * xhat over a row (n), xhat = (x - m) rs in
 * float; w NULL reads as 1 (batch norm applies gamma afterwards). */
static MMP_CPU_INLINE void add_grad_row(lanes *g, lanes *gx, const float *dy, const float *x,
                                        const float *w, int n, float m, float rs)
{
    lanes_v gv, hv, t;
    lanes_get(&gv, g);
    lanes_get(&hv, gx);
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        floats_v d, a, wv;
        load_floats(&d, dy + i);
        load_floats(&a, x + i);
        if (w) {
            load_floats(&wv, w + i);
            d = d * wv;
        }
        a = d * ((a - m) * rs);
        widen(&t, &d);
        gv += t;
        widen(&t, &a);
        hv += t;
    }
    for (int k = 0; i < n; i++, k++) {
        float d = w ? dy[i] * w[i] : dy[i];
        gv[k] += d;
        hv[k] += d * ((x[i] - m) * rs);
    }
    lanes_put(g, &gv);
    lanes_put(gx, &hv);
}

/* a[g] += x[g] (n) for the BN_GROUP slots g, element i into lane i % LANES */
static MMP_CPU_INLINE void add_rows(lanes *a, const float *const *x, int n)
{
    lanes_v s0, s1, s2, s3, v0, v1, v2, v3;
    lanes_get(&s0, &a[0]);
    lanes_get(&s1, &a[1]);
    lanes_get(&s2, &a[2]);
    lanes_get(&s3, &a[3]);
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        load_wide(&v0, x0 + i);
        load_wide(&v1, x1 + i);
        load_wide(&v2, x2 + i);
        load_wide(&v3, x3 + i);
        s0 += v0;
        s1 += v1;
        s2 += v2;
        s3 += v3;
    }
    for (int k = 0; i < n; i++, k++) {
        s0[k] += x0[i];
        s1[k] += x1[i];
        s2[k] += x2[i];
        s3[k] += x3[i];
    }
    lanes_put(&a[0], &s0);
    lanes_put(&a[1], &s1);
    lanes_put(&a[2], &s2);
    lanes_put(&a[3], &s3);
}

/* a[g] += (x[g] - m[g])^2 over x[g] (n), in double */
static MMP_CPU_INLINE void add_sqdev_rows(lanes *a, const float *const *x, int n, const double *m)
{
    lanes_v s0, s1, s2, s3, d0, d1, d2, d3;
    lanes_get(&s0, &a[0]);
    lanes_get(&s1, &a[1]);
    lanes_get(&s2, &a[2]);
    lanes_get(&s3, &a[3]);
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    double m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3];
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        load_wide(&d0, x0 + i);
        load_wide(&d1, x1 + i);
        load_wide(&d2, x2 + i);
        load_wide(&d3, x3 + i);
        d0 -= m0;
        d1 -= m1;
        d2 -= m2;
        d3 -= m3;
        s0 += d0 * d0;
        s1 += d1 * d1;
        s2 += d2 * d2;
        s3 += d3 * d3;
    }
    for (int k = 0; i < n; i++, k++) {
        double e0 = x0[i] - m0, e1 = x1[i] - m1, e2 = x2[i] - m2, e3 = x3[i] - m3;
        s0[k] += e0 * e0;
        s1[k] += e1 * e1;
        s2[k] += e2 * e2;
        s3[k] += e3 * e3;
    }
    lanes_put(&a[0], &s0);
    lanes_put(&a[1], &s1);
    lanes_put(&a[2], &s2);
    lanes_put(&a[3], &s3);
}

/* add_grad_row (w NULL) for two slots g = 0, 1: four sums of LANES doubles
 * are what the 16 vector registers of baseline x86-64 hold beside the
 * temporaries, so backward takes a group's slots two at a time */
static MMP_CPU_INLINE void add_grad_rows2(lanes *g_sum, lanes *gx_sum, const float *const *dy,
                                          const float *const *x, int n, const float *m,
                                          const float *rs)
{
    lanes_v g0, g1, h0, h1, w;
    lanes_get(&g0, &g_sum[0]);
    lanes_get(&g1, &g_sum[1]);
    lanes_get(&h0, &gx_sum[0]);
    lanes_get(&h1, &gx_sum[1]);
    const float *y0 = dy[0], *y1 = dy[1], *x0 = x[0], *x1 = x[1];
    float m0 = m[0], m1 = m[1], r0 = rs[0], r1 = rs[1];
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        floats_v d0, d1, a0, a1;
        load_floats(&d0, y0 + i);
        load_floats(&d1, y1 + i);
        load_floats(&a0, x0 + i);
        load_floats(&a1, x1 + i);
        a0 = d0 * ((a0 - m0) * r0);
        a1 = d1 * ((a1 - m1) * r1);
        widen(&w, &d0);
        g0 += w;
        widen(&w, &a0);
        h0 += w;
        widen(&w, &d1);
        g1 += w;
        widen(&w, &a1);
        h1 += w;
    }
    for (int k = 0; i < n; i++, k++) {
        float d0 = y0[i], d1 = y1[i];
        g0[k] += d0;
        h0[k] += d0 * ((x0[i] - m0) * r0);
        g1[k] += d1;
        h1[k] += d1 * ((x1[i] - m1) * r1);
    }
    lanes_put(&g_sum[0], &g0);
    lanes_put(&g_sum[1], &g1);
    lanes_put(&gx_sum[0], &h0);
    lanes_put(&gx_sum[1], &h1);
}

/* The channels of the group at c0 within [c0, hi): ch[g], the last repeated. */
static MMP_CPU_INLINE int group_channels(int *ch, size_t c0, size_t hi)
{
    int n = 0;
    for (int g = 0; g < BN_GROUP; g++) {
        ch[g] = (int)(c0 + (size_t)g < hi ? c0 + (size_t)g : hi - 1);
        n += c0 + (size_t)g < hi;
    }
    return n;
}

/* batch norm's arguments, for its per-channel range functions */
typedef struct {
    float *out, *mean, *rstd, *running_mean, *running_var;
    float *dinp, *dgamma, *dbeta;
    const float *inp, *dout, *gamma, *beta;
    const float *mean_in, *rstd_in;
    int N, C, HW;
    int set; /* backward: dinp written (0 + x), not added to */
    float eps, momentum;
} bn_args;

/* channels per range: at least about BN_GRAIN_FLOATS elements of work */
#define BN_GRAIN_FLOATS 16384

static size_t bn_grain(int N, int HW)
{
    size_t per_channel = (size_t)N * HW;
    return per_channel >= BN_GRAIN_FLOATS ? 1 : BN_GRAIN_FLOATS / (per_channel ? per_channel : 1);
}

MMP_CPU_CLONES static void bn_fwd_train_range(void *p, size_t lo, size_t hi)
{
    const bn_args *a = p;
    float *out = a->out, *mean = a->mean, *rstd = a->rstd;
    float *running_mean = a->running_mean, *running_var = a->running_var;
    const float *inp = a->inp, *gamma = a->gamma, *beta = a->beta;
    int N = a->N, C = a->C, HW = a->HW;
    float eps = a->eps, momentum = a->momentum;
    size_t count = (size_t)N * HW;
    for (size_t c0 = lo; c0 < hi; c0 += BN_GROUP) {
        int ch[BN_GROUP];
        int used = group_channels(ch, c0, hi);
        const float *x[BN_GROUP];
        lanes sum[BN_GROUP] = {{{0}}};
        for (int n = 0; n < N; n++) {
            for (int g = 0; g < BN_GROUP; g++) {
                x[g] = inp + ((size_t)n * C + ch[g]) * HW;
            }
            add_rows(sum, x, HW);
        }
        double m[BN_GROUP];
        for (int g = 0; g < BN_GROUP; g++) {
            m[g] = lanes_total(&sum[g]) / (double)count;
        }
        lanes ss[BN_GROUP] = {{{0}}};
        for (int n = 0; n < N; n++) {
            for (int g = 0; g < BN_GROUP; g++) {
                x[g] = inp + ((size_t)n * C + ch[g]) * HW;
            }
            add_sqdev_rows(ss, x, HW, m);
        }
        for (int g = 0; g < used; g++) {
            int c = ch[g];
            /* biased: what the batch is normalised with */
            double var = lanes_total(&ss[g]) / (double)count;
            float mf = (float)m[g];
            float rs = (float)(1.0 / sqrt(var + eps));
            float gm = gamma[c], b = beta[c];
            mean[c] = mf;
            rstd[c] = rs;
            for (int n = 0; n < N; n++) {
                const float *xc = inp + ((size_t)n * C + c) * HW;
                float *y = out + ((size_t)n * C + c) * HW;
                for (int i = 0; i < HW; i++) {
                    y[i] = (xc[i] - mf) * rs * gm + b;
                }
            }
            if (running_mean) {
                running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mf;
            }
            if (running_var) {
                /* unbiased, as inference estimates the population variance */
                double unbiased = count > 1 ? var * (double)count / (double)(count - 1) : var;
                running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
            }
        }
    }
}

void mmp_cpu_batchnorm_fwd_train(float *out, float *mean, float *rstd, float *running_mean,
                                 float *running_var, const float *inp, const float *gamma,
                                 const float *beta, int N, int C, int HW, float eps, float momentum)
{
    // out (N,C,HW), mean (C), rstd (C), running_mean (C) or NULL, running_var (C) or NULL,
    // inp (N,C,HW), gamma (C), beta (C)
    bn_args a = {.out = out,
                 .mean = mean,
                 .rstd = rstd,
                 .running_mean = running_mean,
                 .running_var = running_var,
                 .inp = inp,
                 .gamma = gamma,
                 .beta = beta,
                 .N = N,
                 .C = C,
                 .HW = HW,
                 .eps = eps,
                 .momentum = momentum};
    mmp_cpu_parallel_for((size_t)C, bn_grain(N, HW), bn_fwd_train_range, &a);
}

void mmp_cpu_batchnorm_fwd_infer(float *out, const float *inp, const float *gamma,
                                 const float *beta, const float *running_mean,
                                 const float *running_var, int N, int C, int HW, float eps)
{
    // out (N,C,HW), inp (N,C,HW), gamma (C), beta (C), running_mean (C), running_var (C)
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            float rs = 1.0f / sqrtf(running_var[c] + eps);
            for (int i = 0; i < HW; i++) {
                y[i] = (x[i] - running_mean[c]) * rs * gamma[c] + beta[c];
            }
        }
    }
}

MMP_CPU_CLONES static void bn_bwd_range(void *p, size_t lo, size_t hi)
{
    const bn_args *a = p;
    float *dinp = a->dinp, *dgamma = a->dgamma, *dbeta = a->dbeta;
    const float *dout = a->dout, *inp = a->inp, *mean = a->mean_in, *rstd = a->rstd_in;
    const float *gamma = a->gamma;
    int N = a->N, C = a->C, HW = a->HW;
    double count = (double)N * HW;
    for (size_t c0 = lo; c0 < hi; c0 += BN_GROUP) {
        int ch[BN_GROUP];
        int used = group_channels(ch, c0, hi);
        float m[BN_GROUP], rs[BN_GROUP];
        for (int g = 0; g < BN_GROUP; g++) {
            m[g] = mean[ch[g]];
            rs[g] = rstd[ch[g]];
        }
        lanes dy_sum[BN_GROUP] = {{{0}}}, dy_xhat_sum[BN_GROUP] = {{{0}}};
        for (int n = 0; n < N; n++) {
            const float *x[BN_GROUP], *dy[BN_GROUP];
            for (int g = 0; g < BN_GROUP; g++) {
                size_t off = ((size_t)n * C + ch[g]) * HW;
                x[g] = inp + off;
                dy[g] = dout + off;
            }
            for (int g = 0; g < BN_GROUP; g += 2) {
                add_grad_rows2(dy_sum + g, dy_xhat_sum + g, dy + g, x + g, HW, m + g, rs + g);
            }
        }
        for (int g = 0; g < used; g++) {
            int c = ch[g];
            double sum_dy = lanes_total(&dy_sum[g]), sum_dy_xhat = lanes_total(&dy_xhat_sum[g]);
            if (dbeta) {
                dbeta[c] += (float)sum_dy;
            }
            if (dgamma) {
                dgamma[c] += (float)sum_dy_xhat;
            }
            if (!dinp) {
                continue;
            }
            float mc = m[g], rc = rs[g];
            float mean_dy = (float)(sum_dy / count);
            float mean_dy_xhat = (float)(sum_dy_xhat / count);
            float gr = gamma[c] * rc;
            for (int n = 0; n < N; n++) {
                const float *x = inp + ((size_t)n * C + c) * HW;
                const float *dy = dout + ((size_t)n * C + c) * HW;
                float *dx = dinp + ((size_t)n * C + c) * HW;
                if (a->set) {
                    for (int i = 0; i < HW; i++) {
                        float xhat = (x[i] - mc) * rc;
                        dx[i] = 0.0f + gr * (dy[i] - mean_dy - xhat * mean_dy_xhat);
                    }
                    continue;
                }
                for (int i = 0; i < HW; i++) {
                    float xhat = (x[i] - mc) * rc;
                    dx[i] += gr * (dy[i] - mean_dy - xhat * mean_dy_xhat);
                }
            }
        }
    }
}

static void batchnorm_bwd(float *dinp, float *dgamma, float *dbeta, const float *dout,
                          const float *inp, const float *mean, const float *rstd,
                          const float *gamma, int N, int C, int HW, int set)
{
    bn_args a = {.dinp = dinp,
                 .dgamma = dgamma,
                 .dbeta = dbeta,
                 .dout = dout,
                 .inp = inp,
                 .mean_in = mean,
                 .rstd_in = rstd,
                 .gamma = gamma,
                 .N = N,
                 .C = C,
                 .HW = HW,
                 .set = set};
    mmp_cpu_parallel_for((size_t)C, bn_grain(N, HW), bn_bwd_range, &a);
}

void mmp_cpu_batchnorm_bwd(float *dinp, float *dgamma, float *dbeta, const float *dout,
                           const float *inp, const float *mean, const float *rstd,
                           const float *gamma, int N, int C, int HW)
{
    // dinp (N,C,HW), dgamma (C), dbeta (C), dout (N,C,HW), inp (N,C,HW),
    // mean (C), rstd (C), gamma (C)
    batchnorm_bwd(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW, 0);
}

void mmp_cpu_batchnorm_bwd_set(float *dinp, float *dgamma, float *dbeta, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               const float *gamma, int N, int C, int HW)
{
    // dinp (N,C,HW) written, dgamma (C), dbeta (C), dout (N,C,HW), inp (N,C,HW),
    // mean (C), rstd (C), gamma (C)
    batchnorm_bwd(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW, 1);
}

/* The bodies of layer norm are clones of their own: clang 14 emits no
 * symbol for an external function marked MMP_CPU_CLONES. */
MMP_CPU_CLONES static void layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C, float eps)
{
    /* rows summed BN_GROUP side by side, as batch norm's channels: each row's
     * sums in its own order */
    for (int n0 = 0; n0 < N; n0 += BN_GROUP) {
        int rows[BN_GROUP];
        int used = group_channels(rows, (size_t)n0, (size_t)N);
        const float *x[BN_GROUP];
        for (int g = 0; g < BN_GROUP; g++) {
            x[g] = inp + (size_t)rows[g] * C;
        }
        lanes sum[BN_GROUP] = {{{0}}}, ss[BN_GROUP] = {{{0}}};
        add_rows(sum, x, C);
        double m[BN_GROUP];
        for (int g = 0; g < BN_GROUP; g++) {
            m[g] = lanes_total(&sum[g]) / C;
        }
        add_sqdev_rows(ss, x, C, m);
        for (int g = 0; g < used; g++) {
            const float *xr = x[g];
            float *y = out + (size_t)rows[g] * C;
            float mf = (float)m[g];
            float rs = (float)(1.0 / sqrt(lanes_total(&ss[g]) / C + eps));
            for (int i = 0; i < C; i++) {
                y[i] = (xr[i] - mf) * rs * w[i] + b[i];
            }
            mean[rows[g]] = mf;
            rstd[rows[g]] = rs;
        }
    }
}

MMP_CPU_CLONES static void layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                                         const float *inp, const float *w, const float *mean,
                                         const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float m = mean[n], rs = rstd[n];
        if (db) {
            for (int i = 0; i < C; i++) {
                db[i] += dy[i];
            }
        }
        if (dw) {
            for (int i = 0; i < C; i++) {
                dw[i] += dy[i] * ((x[i] - m) * rs);
            }
        }
        if (!dinp) {
            continue;
        }
        lanes dn_sum = {{0}}, dn_xhat_sum = {{0}}; /* dn = dout * w, the gradient of xhat */
        add_grad_row(&dn_sum, &dn_xhat_sum, dy, x, w, C, m, rs);
        float mean_dn = (float)(lanes_total(&dn_sum) / C);
        float mean_dn_xhat = (float)(lanes_total(&dn_xhat_sum) / C);
        float *dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * rs;
            dx[i] += rs * (dy[i] * w[i] - mean_dn - xhat * mean_dn_xhat);
        }
    }
}

void mmp_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C, float eps)
{
    // out (N,C), mean (N), rstd (N), inp (N,C), w (C), b (C)
    layernorm_fwd(out, mean, rstd, inp, w, b, N, C, eps);
}

void mmp_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C)
{
    // dinp (N,C), dw (C), db (C), dout (N,C), inp (N,C), w (C), mean (N), rstd (N)
    layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void mmp_cpu_l2norm_fwd(float *out, float *norm, const float *inp, int N, int C, float eps)
{
    // out (N,C), norm (N), inp (N,C)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) {
            ss += (double)x[i] * x[i];
        }
        float nrm = (float)sqrt(ss);
        float inv = 1.0f / (nrm > eps ? nrm : eps);
        for (int i = 0; i < C; i++) {
            y[i] = x[i] * inv;
        }
        norm[n] = nrm;
    }
}

void mmp_cpu_l2norm_bwd(float *dinp, const float *dout, const float *out, const float *norm, int N,
                        int C, float eps)
{
    // dinp (N,C), dout (N,C), out (N,C), norm (N)
    for (int n = 0; n < N; n++) {
        const float *dy = dout + (size_t)n * C;
        const float *y = out + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        if (!(norm[n] > eps)) {
            /* below eps the op is x / eps, a plain scaling */
            for (int i = 0; i < C; i++) {
                dx[i] += dy[i] / eps;
            }
            continue;
        }
        double dot = 0.0;
        for (int i = 0; i < C; i++) {
            dot += (double)dy[i] * y[i];
        }
        float d = (float)dot;
        float inv = 1.0f / norm[n];
        for (int i = 0; i < C; i++) {
            dx[i] += (dy[i] - y[i] * d) * inv;
        }
    }
}
