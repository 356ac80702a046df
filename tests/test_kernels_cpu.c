/* Tests of the CPU reference kernels (kernels/cpu.h).
 *
 * Each op has a small double-precision reference forward written here,
 * independently of the kernel. It checks the kernel's forward, and it is what
 * the backward is checked against: central finite differences of the scalar
 * loss L = sum(out * R), R a fixed random tensor that is also the kernel's
 * dout, for every input and parameter gradient.
 *
 * Why the tolerances can be tight: the finite differences run on the double
 * reference with step FD_H = 1e-6, so their truncation error O(h^2 f''') is
 * ~1e-12 and their rounding error O(1e-16 |L| / h) ~1e-9: they are exact for
 * our purpose. What is left is the float32 rounding of the analytic gradient,
 * ~1e-7 relative per term over at most a few hundred terms. FD_ATOL = 1e-5
 * and FD_RTOL = 1e-4 leave a margin of 30 or more over what is observed
 * (at most 7e-7 absolute, on conv dw), while a wrong gradient (a missing
 * term, a wrong scale, a dropped chain-rule factor) is off by 1e-2 or more.
 * Kinks (ReLU, max pool) are no problem: random inputs are never within h of
 * a kink or a tie.
 *
 * Every backward is also called a second time on the same buffers: the
 * gradients must double (accumulation, never overwrite). */
#include "kernels/cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

#define FD_H 1e-6
#define FD_ATOL 1e-5
#define FD_RTOL 1e-4
/* float forward against the double reference: float32 rounding only */
#define FWD_ATOL 1e-5
#define FWD_RTOL 1e-5

/* ---- scratch memory: every test returns all of it with release_all() ---- */

#define MAX_ALLOCS 512
static void *allocs[MAX_ALLOCS];
static int n_allocs;
static unsigned long long next_seed = 1;

static void *take(size_t bytes)
{
    if (n_allocs == MAX_ALLOCS) {
        fprintf(stderr, "test: too many allocations\n");
        abort();
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        abort();
    }
    allocs[n_allocs++] = p;
    return p;
}

static void release_all(void)
{
    for (int i = 0; i < n_allocs; i++) {
        free(allocs[i]);
    }
    n_allocs = 0;
}

static float *fzeros(size_t n)
{
    return take(n * sizeof(float));
}

static double *dzeros(size_t n)
{
    return take(n * sizeof(double));
}

static float *frand(size_t n, float lo, float hi)
{
    float *x = fzeros(n);
    mmp_test_fill(x, n, lo, hi, next_seed++);
    return x;
}

static float *fcopy(const float *x, size_t n)
{
    float *y = fzeros(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double *to_double(const float *x, size_t n)
{
    double *y = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        y[i] = x[i];
    }
    return y;
}

/* ---- checks ------------------------------------------------------------- */

/* Prefix of every label, naming the case under test. */
static char case_name[96];

static void check_close(const char *what, const float *got, const float *want, size_t n,
                        double atol, double rtol)
{
    char label[256];
    snprintf(label, sizeof label, "%s %s", case_name, what);
    CHECK_CLOSE(label, got, want, n, atol, rtol);
}

/* The kernel's float forward got (n) against the double reference ref (n). */
static void check_fwd(const char *what, const float *got, const double *ref, size_t n)
{
    float *want = fzeros(n);
    for (size_t i = 0; i < n; i++) {
        want[i] = (float)ref[i];
    }
    check_close(what, got, want, n, FWD_ATOL, FWD_RTOL);
}

/* An op in double precision. A test embeds this as the first member of a
 * struct holding the op's inputs; fwd casts back to that struct. */
typedef struct fd_problem fd_problem;
struct fd_problem {
    void (*fwd)(const fd_problem *p, double *out);
    size_t nout;
    const double *R; /* (nout): L = sum(out * R) */
};

static double fd_loss(const fd_problem *p)
{
    double *out = calloc(p->nout, sizeof(double));
    if (!out) {
        abort();
    }
    p->fwd(p, out);
    double L = 0.0;
    for (size_t i = 0; i < p->nout; i++) {
        L += out[i] * p->R[i];
    }
    free(out);
    return L;
}

/* The analytic gradient got (n) against central differences of L with
 * respect to x (n), one of p's inputs, perturbed in place and restored. */
static void check_fd(const char *what, const float *got, const fd_problem *p, double *x, size_t n)
{
    float *want = fzeros(n);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = fd_loss(p);
        x[i] = x0 - FD_H;
        double lm = fd_loss(p);
        x[i] = x0;
        want[i] = (float)((lp - lm) / (2.0 * FD_H));
    }
    check_close(what, got, want, n, FD_ATOL, FD_RTOL);
}

/* got (n), after a second identical backward call, must be twice once (n). */
static void check_doubled(const char *what, const float *got, const float *once, size_t n)
{
    float *want = fzeros(n);
    for (size_t i = 0; i < n; i++) {
        want[i] = 2.0f * once[i];
    }
    char label[128];
    snprintf(label, sizeof label, "%s accumulated twice", what);
    check_close(label, got, want, n, 1e-6, 1e-5);
}

/* A backward called with only this gradient must give the same values. */
static void check_alone(const char *what, const float *got, const float *once, size_t n)
{
    char label[128];
    snprintf(label, sizeof label, "%s alone", what);
    check_close(label, got, once, n, 0.0, 1e-6);
}

/* ---- gemm --------------------------------------------------------------- */

static void test_gemm(void)
{
    int M = 5, N = 4, K = 3;
    float alpha = 0.7f, beta = -0.3f;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            snprintf(case_name, sizeof case_name, "gemm ta=%d tb=%d", ta, tb);
            /* leading dimensions wider than the rows: the padding must stay untouched */
            int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
            float *A = frand((size_t)(ta ? K : M) * lda, -1, 1);
            float *B = frand((size_t)(tb ? N : K) * ldb, -1, 1);
            float *C = frand((size_t)M * ldc, -1, 1);
            float *want = fcopy(C, (size_t)M * ldc);
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double acc = 0.0;
                    for (int k = 0; k < K; k++) {
                        double a = ta ? A[k * lda + i] : A[i * lda + k];
                        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                        acc += a * b;
                    }
                    want[i * ldc + j] = (float)(alpha * acc + beta * C[i * ldc + j]);
                }
            }
            mmp_cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            check_close("C", C, want, (size_t)M * ldc, 1e-6, 1e-5);
        }
    }
    release_all();
}

/* ---- linear ------------------------------------------------------------- */

typedef struct linear_ref {
    fd_problem base;
    int N, C, OC;
    double *x, *w, *b; /* b may be NULL */
} linear_ref;

static void linear_ref_fwd(const fd_problem *p, double *out)
{
    const linear_ref *r = (const linear_ref *)p;
    for (int n = 0; n < r->N; n++) {
        for (int o = 0; o < r->OC; o++) {
            double acc = r->b ? r->b[o] : 0.0;
            for (int c = 0; c < r->C; c++) {
                acc += r->x[n * r->C + c] * r->w[o * r->C + c];
            }
            out[n * r->OC + o] = acc;
        }
    }
}

static void test_linear(void)
{
    snprintf(case_name, sizeof case_name, "linear");
    int N = 3, C = 5, OC = 4;
    float *x = frand(N * C, -1, 1), *w = frand(OC * C, -1, 1), *b = frand(OC, -1, 1);
    float *R = frand(N * OC, -1, 1);
    linear_ref r = {
        .base = {linear_ref_fwd, (size_t)N * OC, to_double(R, N * OC)}, .N = N, .C = C, .OC = OC};
    r.x = to_double(x, N * C);
    r.w = to_double(w, OC * C);
    r.b = to_double(b, OC);
    double *ref = dzeros(N * OC);
    float *out = fzeros(N * OC);

    mmp_cpu_linear_fwd(out, x, w, b, N, C, OC);
    linear_ref_fwd(&r.base, ref);
    check_fwd("out", out, ref, N * OC);
    linear_ref nob = r;
    nob.b = NULL;
    mmp_cpu_linear_fwd(out, x, w, NULL, N, C, OC);
    linear_ref_fwd(&nob.base, ref);
    check_fwd("out without bias", out, ref, N * OC);

    float *dx = fzeros(N * C), *dw = fzeros(OC * C), *db = fzeros(OC);
    mmp_cpu_linear_bwd(dx, dw, db, R, x, w, N, C, OC);
    check_fd("dinp", dx, &r.base, r.x, N * C);
    check_fd("dw", dw, &r.base, r.w, OC * C);
    check_fd("db", db, &r.base, r.b, OC);

    float *dx1 = fcopy(dx, N * C), *dw1 = fcopy(dw, OC * C), *db1 = fcopy(db, OC);
    mmp_cpu_linear_bwd(dx, dw, db, R, x, w, N, C, OC);
    check_doubled("dinp", dx, dx1, N * C);
    check_doubled("dw", dw, dw1, OC * C);
    check_doubled("db", db, db1, OC);

    float *only = fzeros(OC * C);
    mmp_cpu_linear_bwd(NULL, only, NULL, R, x, w, N, C, OC);
    check_alone("dw", only, dw1, OC * C);
    release_all();
}

/* ---- conv2d ------------------------------------------------------------- */

typedef struct conv_ref {
    fd_problem base;
    mmp_conv_shape s;
    double *x, *w, *b; /* b may be NULL */
} conv_ref;

/* Direct convolution: the definition, with no im2col. */
static void conv_ref_fwd(const fd_problem *p, double *out)
{
    const conv_ref *r = (const conv_ref *)p;
    const mmp_conv_shape *s = &r->s;
    for (int n = 0; n < s->N; n++) {
        for (int o = 0; o < s->OC; o++) {
            for (int oh = 0; oh < s->OH; oh++) {
                for (int ow = 0; ow < s->OW; ow++) {
                    double acc = r->b ? r->b[o] : 0.0;
                    for (int c = 0; c < s->C; c++) {
                        for (int kh = 0; kh < s->KH; kh++) {
                            for (int kw = 0; kw < s->KW; kw++) {
                                int ih = oh * s->stride - s->pad + kh;
                                int iw = ow * s->stride - s->pad + kw;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) {
                                    continue;
                                }
                                acc += r->x[((n * s->C + c) * s->H + ih) * s->W + iw] *
                                       r->w[((o * s->C + c) * s->KH + kh) * s->KW + kw];
                            }
                        }
                    }
                    out[((n * s->OC + o) * s->OH + oh) * s->OW + ow] = acc;
                }
            }
        }
    }
}

typedef struct conv_case {
    const char *name;
    int N, C, H, W, OC, KH, KW, stride, pad;
} conv_case;

static void test_conv_case(const conv_case *cc)
{
    snprintf(case_name, sizeof case_name, "conv2d %s", cc->name);
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, cc->N, cc->C, cc->H, cc->W, cc->OC, cc->KH, cc->KW, cc->stride, cc->pad);
    size_t nx = (size_t)s.N * s.C * s.H * s.W, nw = (size_t)s.OC * s.C * s.KH * s.KW;
    size_t ny = (size_t)s.N * s.OC * s.OH * s.OW;
    float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *b = frand(s.OC, -1, 1);
    float *R = frand(ny, -1, 1);
    float *scratch = fzeros(mmp_cpu_conv2d_scratch_floats(&s));
    conv_ref r = {.base = {conv_ref_fwd, ny, to_double(R, ny)}, .s = s};
    r.x = to_double(x, nx);
    r.w = to_double(w, nw);
    r.b = to_double(b, s.OC);
    double *ref = dzeros(ny);
    conv_ref_fwd(&r.base, ref);

    float *out = fzeros(ny), *out_own = fzeros(ny);
    mmp_cpu_conv2d_fwd(out, x, w, b, &s, scratch);
    check_fwd("out", out, ref, ny);
    mmp_cpu_conv2d_fwd(out_own, x, w, b, &s, NULL);
    CHECK(memcmp(out, out_own, ny * sizeof(float)) == 0); /* own scratch: same numbers */
    conv_ref nob = r;
    nob.b = NULL;
    conv_ref_fwd(&nob.base, ref);
    mmp_cpu_conv2d_fwd(out, x, w, NULL, &s, scratch);
    check_fwd("out without bias", out, ref, ny);

    float *dx = fzeros(nx), *dw = fzeros(nw), *db = fzeros(s.OC);
    mmp_cpu_conv2d_bwd(dx, dw, db, R, x, w, &s, scratch);
    check_fd("dinp", dx, &r.base, r.x, nx);
    check_fd("dw", dw, &r.base, r.w, nw);
    check_fd("db", db, &r.base, r.b, s.OC);

    float *dx1 = fcopy(dx, nx), *dw1 = fcopy(dw, nw), *db1 = fcopy(db, s.OC);
    mmp_cpu_conv2d_bwd(dx, dw, db, R, x, w, &s, scratch);
    check_doubled("dinp", dx, dx1, nx);
    check_doubled("dw", dw, dw1, nw);
    check_doubled("db", db, db1, s.OC);

    float *only_dx = fzeros(nx), *only_dw = fzeros(nw), *only_db = fzeros(s.OC);
    mmp_cpu_conv2d_bwd(only_dx, NULL, NULL, R, x, w, &s, NULL);
    mmp_cpu_conv2d_bwd(NULL, only_dw, NULL, R, x, w, &s, NULL);
    mmp_cpu_conv2d_bwd(NULL, NULL, only_db, R, x, w, &s, NULL);
    check_alone("dinp", only_dx, dx1, nx);
    check_alone("dw", only_dw, dw1, nw);
    check_alone("db", only_db, db1, s.OC);
    release_all();
}

static void test_conv(void)
{
    static const conv_case cases[] = {
        {"3x3 s1 p1", 2, 3, 5, 6, 4, 3, 3, 1, 1},
        {"3x3 s2 p1", 2, 3, 7, 6, 2, 3, 3, 2, 1},
        {"1x1 s1 p0 (no im2col)", 2, 4, 3, 5, 3, 1, 1, 1, 0},
        {"1x1 s2 p0", 2, 4, 5, 5, 3, 1, 1, 2, 0},
        {"2x3 s1 p1", 1, 2, 4, 5, 3, 2, 3, 1, 1},
        {"5x5 s2 p2 wider pad than image", 1, 2, 3, 4, 2, 5, 5, 2, 2},
        /* stride 1 with OW == W: im2col / col2im's shifted-plane path */
        {"5x5 s1 p2 wider pad than image", 2, 2, 3, 4, 3, 5, 5, 1, 2},
        {"1x3 s1 p1 (OH = H + 2)", 1, 2, 3, 4, 2, 1, 3, 1, 1},
        {"3x3 s1 p1 one column", 1, 2, 4, 1, 2, 3, 3, 1, 1},
        /* OW of 4, 8 and 16 take the padded-plane path (constant row widths,
         * im2col up to 16, col2im up to 8); OW 24 and a plane past its
         * stack buffer the run path */
        {"3x3 s1 p1 4x4 padded", 2, 3, 4, 4, 3, 3, 3, 1, 1},
        {"3x3 s1 p1 8x8 padded", 2, 2, 8, 8, 3, 3, 3, 1, 1},
        {"3x3 s1 p1 16x16", 1, 2, 16, 16, 2, 3, 3, 1, 1},
        {"3x3 s1 p1 24 wide", 1, 2, 5, 24, 2, 3, 3, 1, 1},
        {"3x3 s1 p1 8 wide, 840 rows (run path)", 1, 1, 840, 8, 1, 3, 3, 1, 1},
        /* stride 2 on an even map: im2col / col2im's phase-plane path */
        {"3x3 s2 p1 even map", 3, 3, 8, 6, 4, 3, 3, 2, 1},
        {"1x1 s2 p0 even map", 2, 4, 6, 4, 3, 1, 1, 2, 0},
        /* 1x1 strided, no padding: the one-pass subsample path */
        {"1x1 s3 p0", 2, 3, 7, 8, 2, 1, 1, 3, 0},
        {"1x1 s2 p1 (row path)", 1, 2, 6, 4, 2, 1, 1, 2, 1},
    };
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, 2, 3, 32, 32, 8, 3, 3, 2, 1);
    CHECK(s.OH == 16 && s.OW == 16);
    CHECK(mmp_cpu_conv2d_scratch_floats(&s) == (size_t)3 * 9 * 16 * 16);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_conv_case(&cases[i]);
    }
}

/* ---- batch norm --------------------------------------------------------- */

typedef struct bn_ref {
    fd_problem base;
    int N, C, HW;
    double eps;
    double *x, *gamma, *beta;
} bn_ref;

/* mean (C) and biased var (C) of x (N,C,HW) per channel. */
static void bn_ref_stats(const bn_ref *r, double *mean, double *var)
{
    double count = (double)r->N * r->HW;
    for (int c = 0; c < r->C; c++) {
        double sum = 0.0, ss = 0.0;
        for (int n = 0; n < r->N; n++) {
            for (int i = 0; i < r->HW; i++) {
                sum += r->x[(n * r->C + c) * r->HW + i];
            }
        }
        mean[c] = sum / count;
        for (int n = 0; n < r->N; n++) {
            for (int i = 0; i < r->HW; i++) {
                double d = r->x[(n * r->C + c) * r->HW + i] - mean[c];
                ss += d * d;
            }
        }
        var[c] = ss / count;
    }
}

static void bn_ref_fwd(const fd_problem *p, double *out)
{
    const bn_ref *r = (const bn_ref *)p;
    double mean[16], var[16];
    bn_ref_stats(r, mean, var);
    for (int n = 0; n < r->N; n++) {
        for (int c = 0; c < r->C; c++) {
            for (int i = 0; i < r->HW; i++) {
                size_t k = ((size_t)n * r->C + c) * r->HW + i;
                out[k] = (r->x[k] - mean[c]) / sqrt(var[c] + r->eps) * r->gamma[c] + r->beta[c];
            }
        }
    }
}

static void test_batchnorm(void)
{
    snprintf(case_name, sizeof case_name, "batchnorm");
    int N = 3, C = 2, HW = 4;
    size_t n = (size_t)N * C * HW;
    float eps = 1e-5f, momentum = 0.1f;
    float *x = frand(n, -1, 2), *gamma = frand(C, 0.5f, 1.5f), *beta = frand(C, -1, 1);
    float *R = frand(n, -1, 1);
    float *rm = frand(C, -1, 1), *rv = frand(C, 0.5f, 2);
    float *rm0 = fcopy(rm, C), *rv0 = fcopy(rv, C);
    bn_ref r = {.base = {bn_ref_fwd, n, to_double(R, n)}, .N = N, .C = C, .HW = HW, .eps = eps};
    r.x = to_double(x, n);
    r.gamma = to_double(gamma, C);
    r.beta = to_double(beta, C);
    double *ref = dzeros(n);
    bn_ref_fwd(&r.base, ref);

    float *out = fzeros(n), *mean = fzeros(C), *rstd = fzeros(C);
    mmp_cpu_batchnorm_fwd_train(out, mean, rstd, rm, rv, x, gamma, beta, N, C, HW, eps, momentum);
    check_fwd("out", out, ref, n);

    double dmean[16], dvar[16];
    bn_ref_stats(&r, dmean, dvar);
    double count = (double)N * HW;
    float want_mean[16], want_rstd[16], want_rm[16], want_rv[16];
    for (int c = 0; c < C; c++) {
        want_mean[c] = (float)dmean[c];
        want_rstd[c] = (float)(1.0 / sqrt(dvar[c] + eps));
        want_rm[c] = (float)((1 - momentum) * rm0[c] + momentum * dmean[c]);
        /* running variance: the unbiased estimate n/(n-1) var */
        want_rv[c] = (float)((1 - momentum) * rv0[c] + momentum * dvar[c] * count / (count - 1));
    }
    check_close("saved mean", mean, want_mean, C, 1e-6, 1e-5);
    check_close("saved rstd", rstd, want_rstd, C, 1e-6, 1e-5);
    check_close("running_mean", rm, want_rm, C, 1e-6, 1e-5);
    check_close("running_var", rv, want_rv, C, 1e-6, 1e-5);

    /* running stats are optional */
    float *out2 = fzeros(n);
    mmp_cpu_batchnorm_fwd_train(out2, mean, rstd, NULL, NULL, x, gamma, beta, N, C, HW, eps,
                                momentum);
    CHECK(memcmp(out, out2, n * sizeof(float)) == 0);

    /* inference: normalised with the running statistics just computed */
    float *inf = fzeros(n), *want_inf = fzeros(n);
    mmp_cpu_batchnorm_fwd_infer(inf, x, gamma, beta, rm, rv, N, C, HW, eps);
    for (int i = 0; i < N; i++) {
        for (int c = 0; c < C; c++) {
            for (int k = 0; k < HW; k++) {
                size_t j = ((size_t)i * C + c) * HW + k;
                want_inf[j] =
                    (float)((x[j] - (double)rm[c]) / sqrt((double)rv[c] + eps) * gamma[c] +
                            beta[c]);
            }
        }
    }
    check_close("infer out", inf, want_inf, n, FWD_ATOL, FWD_RTOL);

    float *dx = fzeros(n), *dg = fzeros(C), *dbt = fzeros(C);
    mmp_cpu_batchnorm_bwd(dx, dg, dbt, R, x, mean, rstd, gamma, N, C, HW);
    check_fd("dinp", dx, &r.base, r.x, n);
    check_fd("dgamma", dg, &r.base, r.gamma, C);
    check_fd("dbeta", dbt, &r.base, r.beta, C);

    float *dx1 = fcopy(dx, n), *dg1 = fcopy(dg, C), *db1 = fcopy(dbt, C);
    mmp_cpu_batchnorm_bwd(dx, dg, dbt, R, x, mean, rstd, gamma, N, C, HW);
    check_doubled("dinp", dx, dx1, n);
    check_doubled("dgamma", dg, dg1, C);
    check_doubled("dbeta", dbt, db1, C);

    float *only = fzeros(n);
    mmp_cpu_batchnorm_bwd(only, NULL, NULL, R, x, mean, rstd, gamma, N, C, HW);
    check_alone("dinp", only, dx1, n);

    /* _set writes what the accumulating call leaves in a zeroed dinp, bit
     * for bit, whatever dinp held (a NaN here), and the same parameter
     * gradients */
    float *set = fcopy(x, n), *dg2 = fzeros(C), *db2 = fzeros(C);
    set[0] = NAN;
    mmp_cpu_batchnorm_bwd_set(set, dg2, db2, R, x, mean, rstd, gamma, N, C, HW);
    CHECK(memcmp(set, dx1, n * sizeof(float)) == 0);
    CHECK(memcmp(dg2, dg1, C * sizeof(float)) == 0);
    CHECK(memcmp(db2, db1, C * sizeof(float)) == 0);
    release_all();
}

/* ---- elementwise -------------------------------------------------------- */

typedef struct unary_ref {
    fd_problem base;
    double (*f)(double);
    double *x;
} unary_ref;

static void unary_ref_fwd(const fd_problem *p, double *out)
{
    const unary_ref *r = (const unary_ref *)p;
    for (size_t i = 0; i < p->nout; i++) {
        out[i] = r->f(r->x[i]);
    }
}

static double relu_d(double x)
{
    return x > 0 ? x : 0;
}

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* An elementwise activation against its double reference f: forward,
 * optionally in place, and the gradient by finite differences and by
 * accumulation. bwd reads the forward's output (saves_out) or its input. */
static void check_unary(const char *name, size_t n, float lo, float hi, double (*f)(double),
                        void (*fwd)(float *, const float *, size_t),
                        void (*bwd)(float *, const float *, const float *, size_t), int saves_out,
                        int in_place)
{
    snprintf(case_name, sizeof case_name, "%s", name);
    float *x = frand(n, lo, hi), *R = frand(n, -1, 1);
    unary_ref r = {.base = {unary_ref_fwd, n, to_double(R, n)}, .f = f, .x = to_double(x, n)};
    double *ref = dzeros(n);
    unary_ref_fwd(&r.base, ref);
    float *out = fzeros(n);
    fwd(out, x, n);
    check_fwd("out", out, ref, n);
    if (in_place) {
        float *inplace = fcopy(x, n);
        fwd(inplace, inplace, n);
        check_fwd("out in place", inplace, ref, n);
    }

    const float *saved = saves_out ? out : x;
    float *dx = fzeros(n);
    bwd(dx, R, saved, n);
    check_fd("dinp", dx, &r.base, r.x, n);
    float *dx1 = fcopy(dx, n);
    bwd(dx, R, saved, n);
    check_doubled("dinp", dx, dx1, n);
    release_all();
}

static void test_relu(void)
{
    check_unary("relu", 24, -1, 1, relu_d, mmp_cpu_relu_fwd, mmp_cpu_relu_bwd, 1, 1);
    /* relu_bwd_set: relu_bwd's bits on a zeroed dinp (-0 in dout becomes +0,
     * a non-positive out gives +0), whatever dinp held */
    snprintf(case_name, sizeof case_name, "relu_bwd_set");
    enum { n = 40 };
    float *out = frand(n, -1, 1), *dout = frand(n, -1, 1);
    out[0] = 0.5f, dout[0] = -0.0f;
    out[1] = -0.5f, dout[1] = -0.0f;
    out[2] = 0.0f;
    float *acc = fzeros(n), *set = frand(n, -1, 1);
    set[3] = NAN;
    mmp_cpu_relu_bwd(acc, dout, out, n);
    mmp_cpu_relu_bwd_set(set, dout, out, n);
    CHECK(memcmp(acc, set, n * sizeof(float)) == 0);
    CHECK(!signbit(set[0]) && !signbit(set[1]));
    release_all();
}

static void test_gelu(void)
{
    check_unary("gelu", 32, -4, 4, gelu_d, mmp_cpu_gelu_fwd, mmp_cpu_gelu_bwd, 0, 0);
}

/* The kernels compute GELU as x * sigmoid(2u) with their own exp; this is the
 * textbook tanhf form they replaced, in float, over a dense sweep (both
 * tails, the cubic's turn, exact zero) and with a NaN. */
static void test_gelu_tanhf_form(void)
{
    snprintf(case_name, sizeof case_name, "gelu vs the tanhf form");
    size_t n = 40001;
    float *x = fzeros(n), *R = frand(n, -1, 1);
    float *want = fzeros(n), *dwant = fzeros(n);
    const float k = 0.7978845608028654f, c = 0.044715f;
    for (size_t i = 0; i < n; i++) {
        x[i] = -20.0f + 40.0f * (float)i / (float)(n - 1);
        float u = k * (x[i] + c * x[i] * x[i] * x[i]);
        float t = tanhf(u);
        want[i] = 0.5f * x[i] * (1.0f + t);
        float du = k * (1.0f + 3.0f * c * x[i] * x[i]);
        dwant[i] = (0.5f * (1.0f + t) + 0.5f * x[i] * (1.0f - t * t) * du) * R[i];
    }
    float *out = fzeros(n), *dx = fzeros(n);
    mmp_cpu_gelu_fwd(out, x, n);
    mmp_cpu_gelu_bwd(dx, R, x, n);
    /* a few float ulps of the larger of x and 1: the tanhf form itself is
     * off by that much where 1 + tanh(u) cancels */
    check_close("out", out, want, n, 1e-6, 1e-6);
    check_close("dinp", dx, dwant, n, 1e-6, 1e-6);
    float nan_in = NAN, nan_out = 0.0f, nan_d = 0.0f, one = 1.0f;
    mmp_cpu_gelu_fwd(&nan_out, &nan_in, 1);
    mmp_cpu_gelu_bwd(&nan_d, &one, &nan_in, 1);
    CHECK(isnan(nan_out) && isnan(nan_d));
    release_all();
}

static void test_add_scale(void)
{
    snprintf(case_name, sizeof case_name, "add/scale");
    float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 4};
    float want_add[3] = {1.5f, 0, 7}, want_scaled[3] = {-0.75f, 0, -3.5f};
    mmp_cpu_add(a, a, b, 3); /* out aliases a */
    check_close("add", a, want_add, 3, 0, 0);
    mmp_cpu_scale(a, -0.5f, 3);
    check_close("scale", a, want_scaled, 3, 0, 0);
    release_all();
}

/* ---- pooling ------------------------------------------------------------ */

typedef struct maxpool_ref {
    fd_problem base;
    int N, C, H, W, k, stride, pad, OH, OW;
    double *x;
} maxpool_ref;

static void maxpool_ref_fwd(const fd_problem *p, double *out)
{
    const maxpool_ref *r = (const maxpool_ref *)p;
    for (int nc = 0; nc < r->N * r->C; nc++) {
        for (int oh = 0; oh < r->OH; oh++) {
            for (int ow = 0; ow < r->OW; ow++) {
                double best = -INFINITY;
                for (int kh = 0; kh < r->k; kh++) {
                    for (int kw = 0; kw < r->k; kw++) {
                        int ih = oh * r->stride - r->pad + kh, iw = ow * r->stride - r->pad + kw;
                        if (ih >= 0 && ih < r->H && iw >= 0 && iw < r->W) {
                            best = fmax(best, r->x[(nc * r->H + ih) * r->W + iw]);
                        }
                    }
                }
                out[(nc * r->OH + oh) * r->OW + ow] = best;
            }
        }
    }
}

static void test_maxpool_case(int N, int C, int H, int W, int k, int stride, int pad)
{
    snprintf(case_name, sizeof case_name, "maxpool %dx%d k%d s%d p%d", H, W, k, stride, pad);
    int OH = (H + 2 * pad - k) / stride + 1, OW = (W + 2 * pad - k) / stride + 1;
    size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
    /* all negative: a kernel that let the zero padding win would output 0 */
    float *x = frand(nx, -2, -0.5f), *R = frand(ny, -1, 1);
    maxpool_ref r = {.base = {maxpool_ref_fwd, ny, to_double(R, ny)},
                     .N = N,
                     .C = C,
                     .H = H,
                     .W = W,
                     .k = k,
                     .stride = stride,
                     .pad = pad,
                     .OH = OH,
                     .OW = OW,
                     .x = to_double(x, nx)};
    double *ref = dzeros(ny);
    maxpool_ref_fwd(&r.base, ref);
    float *out = fzeros(ny);
    int32_t *am = take(ny * sizeof(int32_t));
    mmp_cpu_maxpool2d_fwd(out, am, x, N, C, H, W, k, stride, pad, OH, OW);
    check_fwd("out", out, ref, ny);
    int argmax_ok = 1;
    for (size_t i = 0; i < ny; i++) {
        size_t plane = i / ((size_t)OH * OW);
        argmax_ok &= am[i] >= 0 && am[i] < H * W && x[plane * H * W + am[i]] == out[i];
    }
    CHECK(argmax_ok);

    float *dx = fzeros(nx);
    mmp_cpu_maxpool2d_bwd(dx, R, am, N, C, H, W, OH, OW);
    check_fd("dinp", dx, &r.base, r.x, nx);
    float *dx1 = fcopy(dx, nx);
    mmp_cpu_maxpool2d_bwd(dx, R, am, N, C, H, W, OH, OW);
    check_doubled("dinp", dx, dx1, nx);
    release_all();
}

static void test_maxpool(void)
{
    test_maxpool_case(2, 2, 5, 6, 3, 2, 1);
    test_maxpool_case(1, 3, 4, 4, 2, 2, 0);
    test_maxpool_case(1, 2, 5, 5, 3, 1, 1);
}

typedef struct meanpool_ref {
    fd_problem base;
    int B, T, C;
    const float *mask; /* may be NULL */
    double *x;
} meanpool_ref;

static void meanpool_ref_fwd(const fd_problem *p, double *out)
{
    const meanpool_ref *r = (const meanpool_ref *)p;
    for (int b = 0; b < r->B; b++) {
        int count = 0;
        for (int c = 0; c < r->C; c++) {
            out[b * r->C + c] = 0.0;
        }
        for (int t = 0; t < r->T; t++) {
            if (r->mask && r->mask[b * r->T + t] == 0) {
                continue;
            }
            count++;
            for (int c = 0; c < r->C; c++) {
                out[b * r->C + c] += r->x[(b * r->T + t) * r->C + c];
            }
        }
        for (int c = 0; c < r->C; c++) {
            out[b * r->C + c] = count ? out[b * r->C + c] / count : 0.0;
        }
    }
}

static void test_meanpool(void)
{
    snprintf(case_name, sizeof case_name, "meanpool");
    int B = 3, T = 4, C = 5;
    size_t nx = (size_t)B * T * C, ny = (size_t)B * C;
    /* the middle sequence has no tokens at all: its mean is 0 */
    static const float mask[] = {1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0};
    float *x = frand(nx, -1, 1), *R = frand(ny, -1, 1);
    meanpool_ref r = {{meanpool_ref_fwd, ny, to_double(R, ny)}, B, T, C, mask, to_double(x, nx)};
    double *ref = dzeros(ny);
    float *out = fzeros(ny);
    meanpool_ref_fwd(&r.base, ref);
    mmp_cpu_meanpool_fwd(out, x, mask, B, T, C);
    check_fwd("out", out, ref, ny);
    meanpool_ref all = r;
    all.mask = NULL;
    meanpool_ref_fwd(&all.base, ref);
    float *out_all = fzeros(ny);
    mmp_cpu_meanpool_fwd(out_all, x, NULL, B, T, C);
    check_fwd("out without mask", out_all, ref, ny);

    float *dx = fzeros(nx);
    mmp_cpu_meanpool_bwd(dx, R, mask, B, T, C);
    check_fd("dinp", dx, &r.base, r.x, nx);
    float *dx1 = fcopy(dx, nx);
    mmp_cpu_meanpool_bwd(dx, R, mask, B, T, C);
    check_doubled("dinp", dx, dx1, nx);
    float *dx_all = fzeros(nx);
    mmp_cpu_meanpool_bwd(dx_all, R, NULL, B, T, C);
    check_fd("dinp without mask", dx_all, &all.base, all.x, nx);
    release_all();
}

/* ---- layer norm --------------------------------------------------------- */

typedef struct ln_ref {
    fd_problem base;
    int N, C;
    double eps;
    double *x, *w, *b;
} ln_ref;

static void ln_ref_fwd(const fd_problem *p, double *out)
{
    const ln_ref *r = (const ln_ref *)p;
    for (int n = 0; n < r->N; n++) {
        const double *x = r->x + n * r->C;
        double m = 0.0, v = 0.0;
        for (int i = 0; i < r->C; i++) {
            m += x[i] / r->C;
        }
        for (int i = 0; i < r->C; i++) {
            v += (x[i] - m) * (x[i] - m) / r->C;
        }
        for (int i = 0; i < r->C; i++) {
            out[n * r->C + i] = (x[i] - m) / sqrt(v + r->eps) * r->w[i] + r->b[i];
        }
    }
}

static void test_layernorm(void)
{
    snprintf(case_name, sizeof case_name, "layernorm");
    int N = 4, C = 7;
    size_t n = (size_t)N * C;
    float eps = 1e-5f;
    float *x = frand(n, -2, 1), *w = frand(C, 0.5f, 1.5f), *b = frand(C, -1, 1);
    float *R = frand(n, -1, 1);
    ln_ref r = {.base = {ln_ref_fwd, n, to_double(R, n)}, .N = N, .C = C, .eps = eps};
    r.x = to_double(x, n);
    r.w = to_double(w, C);
    r.b = to_double(b, C);
    double *ref = dzeros(n);
    ln_ref_fwd(&r.base, ref);
    float *out = fzeros(n), *mean = fzeros(N), *rstd = fzeros(N);
    mmp_cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C, eps);
    check_fwd("out", out, ref, n);

    float *dx = fzeros(n), *dw = fzeros(C), *db = fzeros(C);
    mmp_cpu_layernorm_bwd(dx, dw, db, R, x, w, mean, rstd, N, C);
    check_fd("dinp", dx, &r.base, r.x, n);
    check_fd("dw", dw, &r.base, r.w, C);
    check_fd("db", db, &r.base, r.b, C);

    float *dx1 = fcopy(dx, n), *dw1 = fcopy(dw, C), *db1 = fcopy(db, C);
    mmp_cpu_layernorm_bwd(dx, dw, db, R, x, w, mean, rstd, N, C);
    check_doubled("dinp", dx, dx1, n);
    check_doubled("dw", dw, dw1, C);
    check_doubled("db", db, db1, C);

    float *only = fzeros(n);
    mmp_cpu_layernorm_bwd(only, NULL, NULL, R, x, w, mean, rstd, N, C);
    check_alone("dinp", only, dx1, n);
    release_all();
}

/* ---- embedding ---------------------------------------------------------- */

typedef struct emb_ref {
    fd_problem base;
    int B, T, C;
    const int32_t *ids;
    double *wte, *wpe;
} emb_ref;

static void emb_ref_fwd(const fd_problem *p, double *out)
{
    const emb_ref *r = (const emb_ref *)p;
    for (int bt = 0; bt < r->B * r->T; bt++) {
        for (int c = 0; c < r->C; c++) {
            out[bt * r->C + c] =
                r->wte[r->ids[bt] * r->C + c] + (r->wpe ? r->wpe[(bt % r->T) * r->C + c] : 0.0);
        }
    }
}

static void test_embedding(void)
{
    snprintf(case_name, sizeof case_name, "embedding");
    int B = 2, T = 4, C = 3, V = 5, Tmax = 6;
    /* repeated ids: their gradients must add up */
    static const int32_t ids[] = {1, 3, 1, 0, 4, 1, 3, 3};
    size_t ny = (size_t)B * T * C;
    float *wte = frand((size_t)V * C, -1, 1), *wpe = frand((size_t)Tmax * C, -1, 1);
    float *R = frand(ny, -1, 1);
    emb_ref r = {.base = {emb_ref_fwd, ny, to_double(R, ny)}, .B = B, .T = T, .C = C, .ids = ids};
    r.wte = to_double(wte, (size_t)V * C);
    r.wpe = to_double(wpe, (size_t)Tmax * C);
    double *ref = dzeros(ny);
    float *out = fzeros(ny);
    emb_ref_fwd(&r.base, ref);
    mmp_cpu_embedding_fwd(out, ids, wte, wpe, B, T, C);
    check_fwd("out", out, ref, ny);
    emb_ref nopos = r;
    nopos.wpe = NULL;
    emb_ref_fwd(&nopos.base, ref);
    mmp_cpu_embedding_fwd(out, ids, wte, NULL, B, T, C);
    check_fwd("out without wpe", out, ref, ny);

    float *dwte = fzeros((size_t)V * C), *dwpe = fzeros((size_t)Tmax * C);
    mmp_cpu_embedding_bwd(dwte, dwpe, R, ids, B, T, C);
    check_fd("dwte", dwte, &r.base, r.wte, (size_t)V * C);
    check_fd("dwpe", dwpe, &r.base, r.wpe, (size_t)Tmax * C);
    float *dwte1 = fcopy(dwte, (size_t)V * C), *dwpe1 = fcopy(dwpe, (size_t)Tmax * C);
    mmp_cpu_embedding_bwd(dwte, dwpe, R, ids, B, T, C);
    check_doubled("dwte", dwte, dwte1, (size_t)V * C);
    check_doubled("dwpe", dwpe, dwpe1, (size_t)Tmax * C);
    float *only = fzeros((size_t)V * C);
    mmp_cpu_embedding_bwd(only, NULL, R, ids, B, T, C);
    check_alone("dwte", only, dwte1, (size_t)V * C);
    release_all();
}

/* ---- attention ---------------------------------------------------------- */

typedef struct att_ref {
    fd_problem base;
    int B, Tq, Tk, C, NH;
    const float *mask; /* (B,Tk) or NULL */
    double *q, *k, *v;
} att_ref;

static void att_ref_fwd(const fd_problem *p, double *out)
{
    const att_ref *r = (const att_ref *)p;
    int C = r->C, hs = C / r->NH;
    double scale = 1.0 / sqrt(hs);
    double s[64];
    for (int b = 0; b < r->B; b++) {
        for (int h = 0; h < r->NH; h++) {
            for (int i = 0; i < r->Tq; i++) {
                const double *qi = r->q + (b * r->Tq + i) * C + h * hs;
                double maxv = -INFINITY, sum = 0.0;
                for (int j = 0; j < r->Tk; j++) {
                    const double *kj = r->k + (b * r->Tk + j) * C + h * hs;
                    s[j] = 0.0;
                    for (int c = 0; c < hs; c++) {
                        s[j] += qi[c] * kj[c] * scale;
                    }
                    if (!r->mask || r->mask[b * r->Tk + j] != 0) {
                        maxv = fmax(maxv, s[j]);
                    }
                }
                for (int j = 0; j < r->Tk; j++) {
                    int valid = !r->mask || r->mask[b * r->Tk + j] != 0;
                    s[j] = valid ? exp(s[j] - maxv) : 0.0;
                    sum += s[j];
                }
                double *oi = out + (b * r->Tq + i) * C + h * hs;
                for (int c = 0; c < hs; c++) {
                    oi[c] = 0.0;
                    for (int j = 0; j < r->Tk && sum > 0; j++) {
                        oi[c] += s[j] / sum * r->v[(b * r->Tk + j) * C + h * hs + c];
                    }
                }
            }
        }
    }
}

static void test_attention_case(const char *name, int B, int Tq, int Tk, int C, int NH,
                                const float *mask)
{
    snprintf(case_name, sizeof case_name, "attention %s", name);
    size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C, na = (size_t)B * NH * Tq * Tk;
    float *q = frand(nq, -1.5f, 1.5f), *k = frand(nk, -1.5f, 1.5f), *v = frand(nk, -1, 1);
    float *R = frand(nq, -1, 1);
    att_ref r = {.base = {att_ref_fwd, nq, to_double(R, nq)},
                 .B = B,
                 .Tq = Tq,
                 .Tk = Tk,
                 .C = C,
                 .NH = NH,
                 .mask = mask};
    r.q = to_double(q, nq);
    r.k = to_double(k, nk);
    r.v = to_double(v, nk);
    double *ref = dzeros(nq);
    att_ref_fwd(&r.base, ref);
    float *out = fzeros(nq), *att = fzeros(na);
    mmp_cpu_attention_fwd(out, att, q, k, v, mask, B, Tq, Tk, C, NH, 0);
    check_fwd("out", out, ref, nq);

    /* probabilities: exactly 0 on masked keys, rows sum to 1 or (no valid key) are all 0 */
    int att_ok = 1;
    for (int b = 0; b < B; b++) {
        int any_valid = 0;
        for (int j = 0; j < Tk; j++) {
            any_valid |= !mask || mask[b * Tk + j] != 0;
        }
        for (int hi = 0; hi < NH * Tq; hi++) {
            const float *row = att + ((size_t)b * NH * Tq + hi) * Tk;
            double sum = 0.0;
            for (int j = 0; j < Tk; j++) {
                if (mask && mask[b * Tk + j] == 0) {
                    att_ok &= row[j] == 0.0f;
                }
                sum += row[j];
            }
            att_ok &= fabs(sum - (any_valid ? 1.0 : 0.0)) < 1e-5;
        }
    }
    CHECK(att_ok);

    float *dq = fzeros(nq), *dk = fzeros(nk), *dv = fzeros(nk);
    mmp_cpu_attention_bwd(dq, dk, dv, R, att, q, k, v, B, Tq, Tk, C, NH, 0);
    check_fd("dq", dq, &r.base, r.q, nq);
    check_fd("dk", dk, &r.base, r.k, nk);
    check_fd("dv", dv, &r.base, r.v, nk);

    float *dq1 = fcopy(dq, nq), *dk1 = fcopy(dk, nk), *dv1 = fcopy(dv, nk);
    mmp_cpu_attention_bwd(dq, dk, dv, R, att, q, k, v, B, Tq, Tk, C, NH, 0);
    check_doubled("dq", dq, dq1, nq);
    check_doubled("dk", dk, dk1, nk);
    check_doubled("dv", dv, dv1, nk);

    float *only_dq = fzeros(nq), *only_dk = fzeros(nk), *only_dv = fzeros(nk);
    mmp_cpu_attention_bwd(only_dq, NULL, NULL, R, att, q, k, v, B, Tq, Tk, C, NH, 0);
    mmp_cpu_attention_bwd(NULL, only_dk, NULL, R, att, q, k, v, B, Tq, Tk, C, NH, 0);
    mmp_cpu_attention_bwd(NULL, NULL, only_dv, R, att, q, k, v, B, Tq, Tk, C, NH, 0);
    check_alone("dq", only_dq, dq1, nq);
    check_alone("dk", only_dk, dk1, nk);
    check_alone("dv", only_dv, dv1, nk);
    release_all();
}

static void test_attention(void)
{
    /* self: padded keys at the end of each sequence */
    static const float self_mask[] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 0};
    test_attention_case("self masked", 2, 5, 5, 8, 2, self_mask);
    test_attention_case("self unmasked", 2, 4, 4, 6, 3, NULL);
    /* cross: text queries (Tq 3) over image keys (Tk 6); the last sample has every
     * key masked, so its output and all its gradients must be exactly 0 */
    static const float cross_mask[] = {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0};
    test_attention_case("cross masked", 3, 3, 6, 6, 3, cross_mask);

    snprintf(case_name, sizeof case_name, "attention all keys masked");
    int B = 3, Tq = 3, Tk = 6, C = 6, NH = 3;
    size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1);
    float *dout = frand(nq, -1, 1);
    float *out = frand(nq, -1, 1), *att = frand((size_t)B * NH * Tq * Tk, -1, 1);
    float *dq = fzeros(nq), *dk = fzeros(nk), *dv = fzeros(nk);
    mmp_cpu_attention_fwd(out, att, q, k, v, cross_mask, B, Tq, Tk, C, NH, 0);
    mmp_cpu_attention_bwd(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH, 0);
    int zero = 1;
    for (size_t i = 2 * (size_t)Tq * C; i < nq; i++) {
        zero &= out[i] == 0.0f && dq[i] == 0.0f;
    }
    for (size_t i = 2 * (size_t)Tk * C; i < nk; i++) {
        zero &= dk[i] == 0.0f && dv[i] == 0.0f;
    }
    CHECK(zero);
    release_all();
}

/* ---- softmax, l2norm ---------------------------------------------------- */

typedef struct softmax_ref {
    fd_problem base;
    int rows, cols;
    double *x;
} softmax_ref;

static void softmax_ref_fwd(const fd_problem *p, double *out)
{
    const softmax_ref *r = (const softmax_ref *)p;
    for (int i = 0; i < r->rows; i++) {
        double sum = 0.0;
        for (int j = 0; j < r->cols; j++) {
            sum += exp(r->x[i * r->cols + j]);
        }
        for (int j = 0; j < r->cols; j++) {
            out[i * r->cols + j] = exp(r->x[i * r->cols + j]) / sum;
        }
    }
}

static void test_softmax(void)
{
    snprintf(case_name, sizeof case_name, "softmax");
    int rows = 3, cols = 7;
    size_t n = (size_t)rows * cols;
    float *x = frand(n, -3, 3), *R = frand(n, -1, 1);
    softmax_ref r = {{softmax_ref_fwd, n, to_double(R, n)}, rows, cols, to_double(x, n)};
    double *ref = dzeros(n);
    float *out = fzeros(n);
    softmax_ref_fwd(&r.base, ref);
    mmp_cpu_softmax_fwd(out, x, rows, cols);
    check_fwd("out", out, ref, n);
    /* numerically stable: a huge common offset changes nothing */
    float *shifted = fcopy(x, n), *out_shifted = fzeros(n);
    for (size_t i = 0; i < n; i++) {
        shifted[i] += 1000.0f;
    }
    mmp_cpu_softmax_fwd(out_shifted, shifted, rows, cols);
    float *want = fcopy(out, n);
    /* a naive exp overflows to inf / nan here; the shift itself rounds the
     * inputs to the float spacing at 1000 (6e-5), hence the wider tolerance */
    check_close("out shifted by 1000", out_shifted, want, n, 1e-4, 1e-4);

    float *dx = fzeros(n);
    mmp_cpu_softmax_bwd(dx, R, out, rows, cols);
    check_fd("dinp", dx, &r.base, r.x, n);
    float *dx1 = fcopy(dx, n);
    mmp_cpu_softmax_bwd(dx, R, out, rows, cols);
    check_doubled("dinp", dx, dx1, n);
    release_all();
}

typedef struct l2_ref {
    fd_problem base;
    int N, C;
    double eps;
    double *x;
} l2_ref;

static void l2_ref_fwd(const fd_problem *p, double *out)
{
    const l2_ref *r = (const l2_ref *)p;
    for (int n = 0; n < r->N; n++) {
        double ss = 0.0;
        for (int i = 0; i < r->C; i++) {
            ss += r->x[n * r->C + i] * r->x[n * r->C + i];
        }
        double d = fmax(sqrt(ss), r->eps);
        for (int i = 0; i < r->C; i++) {
            out[n * r->C + i] = r->x[n * r->C + i] / d;
        }
    }
}

static void test_l2norm(void)
{
    snprintf(case_name, sizeof case_name, "l2norm");
    int N = 3, C = 5;
    size_t n = (size_t)N * C;
    float eps = 1e-6f;
    float *x = frand(n, -1, 1), *R = frand(n, -1, 1);
    l2_ref r = {{l2_ref_fwd, n, to_double(R, n)}, N, C, eps, to_double(x, n)};
    double *ref = dzeros(n);
    float *out = fzeros(n), *norm = fzeros(N);
    l2_ref_fwd(&r.base, ref);
    mmp_cpu_l2norm_fwd(out, norm, x, N, C, eps);
    check_fwd("out", out, ref, n);

    float *dx = fzeros(n);
    mmp_cpu_l2norm_bwd(dx, R, out, norm, N, C, eps);
    check_fd("dinp", dx, &r.base, r.x, n);
    float *dx1 = fcopy(dx, n);
    mmp_cpu_l2norm_bwd(dx, R, out, norm, N, C, eps);
    check_doubled("dinp", dx, dx1, n);

    /* a row below eps is divided by eps: a plain scaling, gradient dout / eps */
    float tiny[5] = {1e-8f, -2e-8f, 3e-8f, 0, 1e-8f};
    float tiny_out[5], tiny_norm, dtiny[5] = {0}, want_out[5], want_d[5];
    mmp_cpu_l2norm_fwd(tiny_out, &tiny_norm, tiny, 1, 5, 1e-4f);
    mmp_cpu_l2norm_bwd(dtiny, R, tiny_out, &tiny_norm, 1, 5, 1e-4f);
    for (int i = 0; i < 5; i++) {
        want_out[i] = tiny[i] / 1e-4f;
        want_d[i] = R[i] / 1e-4f;
    }
    check_close("out below eps", tiny_out, want_out, 5, 0, 1e-6);
    check_close("dinp below eps", dtiny, want_d, 5, 0, 1e-6);
    release_all();
}

/* ---- losses ------------------------------------------------------------- */

typedef struct infonce_ref {
    fd_problem base;
    int B, C;
    double *img, *txt, *logit_scale; /* logit_scale (1): an input like the others */
    double *sim, *p_i2t, *p_t2i;     /* (B,B) each, written by the forward */
} infonce_ref;

/* The definition, term by term: logits = exp(logit_scale) img @ txt^T, loss =
 * (mean_i CE(row i, target i) + mean_t CE(column t, target t)) / 2. */
static void infonce_ref_fwd(const fd_problem *p, double *out)
{
    const infonce_ref *r = (const infonce_ref *)p;
    int B = r->B;
    double scale = exp(r->logit_scale[0]);
    for (int i = 0; i < B; i++) {
        for (int t = 0; t < B; t++) {
            double s = 0.0;
            for (int c = 0; c < r->C; c++) {
                s += r->img[i * r->C + c] * r->txt[t * r->C + c];
            }
            r->sim[i * B + t] = s;
        }
    }
    double rows = 0.0, cols = 0.0;
    for (int a = 0; a < B; a++) {
        double zr = 0.0, zc = 0.0;
        for (int j = 0; j < B; j++) {
            zr += exp(scale * r->sim[a * B + j]); /* image a against text j */
            zc += exp(scale * r->sim[j * B + a]); /* text a against image j */
        }
        for (int j = 0; j < B; j++) {
            r->p_i2t[a * B + j] = exp(scale * r->sim[a * B + j]) / zr;
            r->p_t2i[a * B + j] = exp(scale * r->sim[j * B + a]) / zc;
        }
        rows += -log(r->p_i2t[a * B + a]);
        cols += -log(r->p_t2i[a * B + a]);
    }
    out[0] = 0.5 * (rows / B + cols / B);
}

static void test_infonce(void)
{
    snprintf(case_name, sizeof case_name, "infonce");
    int B = 5, C = 8;
    size_t ne = (size_t)B * C, nb = (size_t)B * B;
    float *img = frand(ne, -0.6f, 0.6f), *txt = frand(ne, -0.6f, 0.6f);
    float logit_scale = logf(5.0f);
    float dloss = 0.7f;
    double dloss_d = dloss, ls_d = logit_scale;
    infonce_ref r = {.base = {infonce_ref_fwd, 1, &dloss_d}, .B = B, .C = C, .logit_scale = &ls_d};
    r.img = to_double(img, ne);
    r.txt = to_double(txt, ne);
    r.sim = dzeros(nb);
    r.p_i2t = dzeros(nb);
    r.p_t2i = dzeros(nb);
    double ref_loss;
    infonce_ref_fwd(&r.base, &ref_loss);

    float *sim = fzeros(nb), *p_i2t = fzeros(nb), *p_t2i = fzeros(nb);
    float loss = mmp_cpu_infonce_fwd(sim, p_i2t, p_t2i, img, txt, logit_scale, B, C);
    float got_loss[1] = {loss};
    check_fwd("loss", got_loss, &ref_loss, 1);
    check_fwd("sim", sim, r.sim, nb);
    check_fwd("p_i2t", p_i2t, r.p_i2t, nb);
    check_fwd("p_t2i", p_t2i, r.p_t2i, nb);

    float *dimg = fzeros(ne), *dtxt = fzeros(ne), dls[1] = {0};
    mmp_cpu_infonce_bwd(dimg, dtxt, dls, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    check_fd("dimg", dimg, &r.base, r.img, ne);
    check_fd("dtxt", dtxt, &r.base, r.txt, ne);
    check_fd("dlogit_scale", dls, &r.base, r.logit_scale, 1);

    float *dimg1 = fcopy(dimg, ne), *dtxt1 = fcopy(dtxt, ne), dls1[1] = {dls[0]};
    mmp_cpu_infonce_bwd(dimg, dtxt, dls, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    check_doubled("dimg", dimg, dimg1, ne);
    check_doubled("dtxt", dtxt, dtxt1, ne);
    check_doubled("dlogit_scale", dls, dls1, 1);

    float *only = fzeros(ne), only_ls[1] = {0};
    mmp_cpu_infonce_bwd(NULL, only, NULL, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    mmp_cpu_infonce_bwd(NULL, NULL, only_ls, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    check_alone("dtxt", only, dtxt1, ne);
    check_alone("dlogit_scale", only_ls, dls1, 1);
    release_all();
}

typedef struct bce_ref {
    fd_problem base;
    int n;
    const float *labels;
    double *x;
} bce_ref;

static void bce_ref_fwd(const fd_problem *p, double *out)
{
    const bce_ref *r = (const bce_ref *)p;
    double sum = 0.0;
    for (int i = 0; i < r->n; i++) {
        double sig = 1.0 / (1.0 + exp(-r->x[i]));
        sum += -(r->labels[i] * log(sig) + (1.0 - r->labels[i]) * log1p(-sig));
    }
    out[0] = sum / r->n;
}

static void test_bce(void)
{
    snprintf(case_name, sizeof case_name, "bce");
    enum { n = 8 };
    float x[n] = {-2.5f, -0.3f, 0.1f, 1.7f, 3.2f, -1.1f, 0.8f, -4.0f};
    float labels[n] = {0, 1, 1, 0, 1, 0, 0.3f, 1};
    float dloss = 1.3f;
    double dloss_d = dloss;
    bce_ref r = {{bce_ref_fwd, 1, &dloss_d}, n, labels, to_double(x, n)};
    double ref_loss;
    bce_ref_fwd(&r.base, &ref_loss);
    float got[1] = {mmp_cpu_bce_fwd(x, labels, n)};
    check_fwd("loss", got, &ref_loss, 1);

    float dx[n] = {0};
    mmp_cpu_bce_bwd(dx, x, labels, dloss, n);
    check_fd("dlogits", dx, &r.base, r.x, n);
    float *dx1 = fcopy(dx, n);
    mmp_cpu_bce_bwd(dx, x, labels, dloss, n);
    check_doubled("dlogits", dx, dx1, n);

    /* large logits: the loss of a confident right answer is ~0, of a wrong one ~|x| */
    float big[2] = {80.0f, -80.0f}, big_y[2] = {1, 1};
    float big_loss = mmp_cpu_bce_fwd(big, big_y, 2);
    CHECK(isfinite(big_loss) && fabsf(big_loss - 40.0f) < 1e-4f);
    release_all();
}

/* ---- optimizer ---------------------------------------------------------- */

static void test_adamw(void)
{
    snprintf(case_name, sizeof case_name, "adamw");
    /* By hand, lr 0.1, b1 0.9, b2 0.999, eps 1e-8, wd 0.01, p 1:
     * t=1, g=0.5:   m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25,
     *               p = 1 - 0.1 (0.5 / (0.5 + 1e-8) + 0.01 * 1) = 0.899000002
     * t=2, g=-0.25: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
     *               mhat = 0.02 / 0.19, vhat = 0.00031225 / 0.001999,
     *               p = 0.899000002 - 0.1 (mhat / (sqrt(vhat) + 1e-8) + 0.01 p) = 0.871467299 */
    float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
    mmp_cpu_adamw(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    /* float rounding: 1 - 0.9f and 1 - 0.999f are not 0.1 and 0.001 exactly */
    CHECK(fabsf(m - 0.05f) < 1e-7f && fabsf(v - 0.00025f) < 1e-8f);
    CHECK(fabsf(p - 0.899000002f) < 1e-6f);
    g = -0.25f;
    mmp_cpu_adamw(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2);
    CHECK(fabsf(m - 0.02f) < 1e-7f && fabsf(v - 0.00031225f) < 1e-8f);
    CHECK(fabsf(p - 0.871467299f) < 1e-6f);

    /* many parameters over several steps against the formula in double */
    size_t n = 16;
    float *param = frand(n, -1, 1), *mm = fzeros(n), *vv = fzeros(n);
    double *pd = to_double(param, n), *md = dzeros(n), *vd = dzeros(n);
    float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int t = 1; t <= 3; t++) {
        float *grad = frand(n, -1, 1);
        mmp_cpu_adamw(param, grad, mm, vv, n, lr, b1, b2, eps, wd, t);
        for (size_t i = 0; i < n; i++) {
            md[i] = b1 * md[i] + (1 - (double)b1) * grad[i];
            vd[i] = b2 * vd[i] + (1 - (double)b2) * grad[i] * grad[i];
            double mhat = md[i] / (1 - pow(b1, t)), vhat = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * pd[i]);
        }
    }
    check_fwd("param after 3 steps", param, pd, n);
    check_fwd("m after 3 steps", mm, md, n);
    check_fwd("v after 3 steps", vv, vd, n);
    release_all();
}

static void test_sumsq(void)
{
    float x[4] = {1, -2, 3, 0.5f};
    CHECK(mmp_cpu_sumsq(x, 4) == 14.25);
    CHECK(mmp_cpu_sumsq(x, 0) == 0.0);
}

/* The kernels' pool splits conv's im2col / col2im and batch norm by channel
 * and the elementwise ops by range: the same bits at any thread count. The
 * shapes are large enough that every one of those loops is split. */
static void test_threads_bitwise(void)
{
    snprintf(case_name, sizeof case_name, "thread count does not change results");
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, 2, 6, 48, 48, 5, 3, 3, 1, 1);
    size_t nx = (size_t)2 * 6 * 48 * 48, ny = (size_t)2 * 5 * 48 * 48, nw = 5 * 6 * 9;
    float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *dy = frand(ny, -1, 1);
    float *scratch = fzeros(mmp_cpu_conv2d_scratch_floats(&s));
    int N = 4, C = 3, HW = 4100; /* one channel is 16400 floats: one per range */
    size_t nb = (size_t)N * C * HW;
    float *bx = frand(nb, -2, 2), *bdy = frand(nb, -1, 1), *gamma = frand(C, 0.5, 1.5),
          *beta = frand(C, -1, 1);
    size_t ne = 100003;
    float *ex = frand(ne, -6, 6), *edy = frand(ne, -1, 1);
    size_t np = 300001; /* several of sumsq's blocks */
    float *pg = frand(np, -1, 1);
    double sq[2];
    float *out[2][12];
    for (int t = 0; t < 2; t++) {
        mmp_cpu_set_threads(t == 0 ? 1 : 3);
        float **o = out[t];
        o[0] = fzeros(ny);
        mmp_cpu_conv2d_fwd(o[0], x, w, NULL, &s, scratch);
        o[1] = fzeros(nx);
        o[2] = fzeros(nw);
        mmp_cpu_conv2d_bwd(o[1], o[2], NULL, dy, x, w, &s, scratch);
        float *mean = fzeros(C), *rstd = fzeros(C);
        o[3] = fzeros(nb);
        mmp_cpu_batchnorm_fwd_train(o[3], mean, rstd, NULL, NULL, bx, gamma, beta, N, C, HW, 1e-5f,
                                    0.1f);
        o[4] = fzeros(nb);
        mmp_cpu_batchnorm_bwd(o[4], NULL, NULL, bdy, bx, mean, rstd, gamma, N, C, HW);
        o[5] = fzeros(ne);
        mmp_cpu_gelu_fwd(o[5], ex, ne);
        o[6] = fzeros(ne);
        mmp_cpu_gelu_bwd(o[6], edy, ex, ne);
        o[7] = fzeros(ne);
        mmp_cpu_relu_bwd(o[7], edy, ex, ne);
        o[8] = fzeros(ne);
        mmp_cpu_add(o[8], ex, edy, ne);
        sq[t] = mmp_cpu_sumsq(pg, np);
        o[9] = fcopy(ex, ne);
        o[10] = fzeros(ne);
        o[11] = fzeros(ne);
        for (int step = 1; step <= 2; step++) {
            mmp_cpu_adamw(o[9], edy, o[10], o[11], ne, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
        }
    }
    mmp_cpu_set_threads(1);
    CHECK(sq[0] == sq[1]);
    size_t sizes[12] = {ny, nx, nw, nb, nb, ne, ne, ne, ne, ne, ne, ne};
    for (int k = 0; k < 12; k++) {
        CHECK(memcmp(out[0][k], out[1][k], sizes[k] * sizeof(float)) == 0);
    }
    release_all();
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_gemm),
    MMP_TEST_CASE(test_linear),
    MMP_TEST_CASE(test_conv),
    MMP_TEST_CASE(test_batchnorm),
    MMP_TEST_CASE(test_relu),
    MMP_TEST_CASE(test_gelu),
    MMP_TEST_CASE(test_gelu_tanhf_form),
    MMP_TEST_CASE(test_add_scale),
    MMP_TEST_CASE(test_maxpool),
    MMP_TEST_CASE(test_meanpool),
    MMP_TEST_CASE(test_layernorm),
    MMP_TEST_CASE(test_embedding),
    MMP_TEST_CASE(test_attention),
    MMP_TEST_CASE(test_softmax),
    MMP_TEST_CASE(test_l2norm),
    MMP_TEST_CASE(test_infonce),
    MMP_TEST_CASE(test_bce),
    MMP_TEST_CASE(test_adamw),
    MMP_TEST_CASE(test_sumsq),
    MMP_TEST_CASE(test_threads_bitwise),
};

int main(int argc, char **argv)
{
    mmp_cpu_set_threads(1);
    return MMP_TEST_MAIN("test_kernels_cpu", cases, argc, argv);
}
