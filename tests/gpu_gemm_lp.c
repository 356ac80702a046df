/* The bf16/fp16 tensor-core GEMMs (kernels/cuda/gemm.cu) against the CPU
 * reference on inputs rounded to the training precision: mmp_cuda_gemm_lp,
 * the linear and conv2d ops nn/lowp.h calls on a GPU (mmp_cuda_linear_*_lp,
 * mmp_cuda_conv2d_*_lp: each of its two paths, cuDNN with TF32 on the rounded operands and
 * im2col GEMMs) and attention with prec, at the demo's and seed-scale's
 * shapes and at shapes whose K (and leading dimensions) are not multiples of 8. Every call runs
 * twice and must give the same bits. Skips (exit 77) when built without
 * CUDA or when no device is visible.
 *
 * Tolerance. The 16-bit operands are exact copies of the rounded fp32 values
 * and each product of two is exact in fp32, so GPU and CPU differ only in
 * how their fp32 sums round. For a sum of K terms (plus the alpha scaling
 * and the beta*C term) in any order, |err| <= (K+2) u S with
 * S = |alpha| sum_k |a_ik b_kj| + |beta c_ij| and u = 2^-24 for
 * round-to-nearest; tensor cores may truncate inside their accumulation, so
 * u = 2^-23, and the bound used is twice that: (K+2) 2^-22 S, against the
 * exact result (in double). A worst-case bound is loose for large K, so a
 * second check holds the GPU to having rounded at all: on UNROUNDED inputs
 * the lp ops must round them themselves, and the RMS of their error against
 * the exact product of the rounded inputs must stay under 1/64 of the RMS
 * difference between the exact products of the rounded and the unrounded
 * inputs (accumulation errors are ~2^-24 relative, rounding effects ~2^-9
 * for bf16 and ~2^-12 for fp16: fp32 or the wrong precision fails it). */
#include "tests/harness.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_gemm_lp", "built without CUDA");
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu.h"
#include "kernels/cuda.h"

#define NAME "gpu_gemm_lp"

static mmp_cuda_ctx *ctx;
static unsigned long long seed = 77;
/* The largest error seen, as a share of the bound: GPU and CPU results (for
 * the report: how much of the bound real sums use). */
static double worst_gpu, worst_cpu;

static const char *prec_name(int prec)
{
    return prec == 1 ? "bf16" : "fp16";
}

static float *rnd(size_t n)
{
    float *x = mmp_test_floats(n);
    mmp_test_fill(x, n, -1.0f, 1.0f, ++seed);
    return x;
}

static float *rounded(const float *x, size_t n, int prec)
{
    float *r = mmp_test_floats(n);
    mmp_cpu_round_lp(r, x, n, prec);
    return r;
}

/* n random values already rounded to prec. */
static float *rnd_rounded(size_t n, int prec)
{
    float *x = rnd(n);
    mmp_cpu_round_lp(x, x, n, prec);
    return x;
}

static float *dev(const float *x, size_t n)
{
    void *p = NULL;
    if (mmp_cuda_malloc(&p, n * sizeof(float) + 256) != MMP_OK ||
        (x && mmp_cuda_memcpy_h2d(ctx, p, x, n * sizeof(float)) != MMP_OK)) {
        fprintf(stderr, "%s: device memory: %s\n", NAME, mmp_last_error());
        exit(1);
    }
    return p;
}

static float *back(const float *d, size_t n)
{
    float *h = mmp_test_floats(n);
    CHECK_OK(mmp_cuda_memcpy_d2h(ctx, h, d, n * sizeof(float)));
    return h;
}

/* Row-major op(A) (M,K) @ op(B) (K,N) in double: exact (*c) and the sum of
 * the terms' magnitudes (*s), for alpha, beta, C0. */
static void exact(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda,
                  const float *B, int ldb, double beta, const float *C0, double *c, double *s)
{
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                sum += a * b;
                mag += fabs(a * b);
            }
            double c0 = C0 ? C0[(size_t)i * N + j] : 0.0;
            c[(size_t)i * N + j] = alpha * sum + beta * c0;
            s[(size_t)i * N + j] = fabs(alpha) * mag + fabs(beta * c0);
        }
    }
}

/* got (n) within (K+2) 2^-22 s of ex (n); prints the worst. */
static int within_bound(const char *label, const float *got, const double *ex, const double *s,
                        size_t n, int K)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double bound = (K + 2) * ldexp(s[i], -22) + 1e-30;
        double r = fabs((double)got[i] - ex[i]) / bound;
        if (!(r <= worst)) { /* NaN counts as the worst */
            worst = r;
            at = i;
        }
    }
    double *keep = label[0] == ' ' && strstr(label, "CPU") ? &worst_cpu : &worst_gpu;
    *keep = fmax(*keep, worst);
    if (!(worst <= 1.0)) {
        fprintf(stderr, "  %s: [%zu] = %.9g, exact %.9g: %.3g of the bound\n", label, at,
                (double)got[at], ex[at], worst);
        return 0;
    }
    return 1;
}

/* The RMS of got - ex_r against that of ex_u - ex_r (see the top comment). */
static int rounded_itself(const char *label, const float *got, const double *ex_r,
                          const double *ex_u, size_t n)
{
    double e = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)got[i] - ex_r[i]) * ((double)got[i] - ex_r[i]);
        d += (ex_u[i] - ex_r[i]) * (ex_u[i] - ex_r[i]);
    }
    e = sqrt(e / (double)n);
    d = sqrt(d / (double)n);
    if (!(e * 64 <= d)) {
        fprintf(stderr, "  %s: RMS error %.3g vs RMS rounding effect %.3g: not rounded?\n", label,
                e, d);
        return 0;
    }
    return 1;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* mmp_cuda_gemm_lp for all four transpositions, on rounded and on raw inputs. */
static void gemm_case(int prec, int M, int N, int K, int pad)
{
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            /* leading dimensions past the columns by pad: odd ones when pad is */
            const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad;
            const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
            const size_t nc = (size_t)M * N;
            const float alpha = 0.75f, beta = 0.5f;
            float *A = rnd(na), *B = rnd(nb), *C0 = rnd(nc);
            float *Ar = rounded(A, na, prec), *Br = rounded(B, nb, prec);
            double *ex = malloc(nc * sizeof(double)), *s = malloc(nc * sizeof(double));
            double *ex_u = malloc(nc * sizeof(double)), *s_u = malloc(nc * sizeof(double));
            exact(ta, tb, M, N, K, alpha, Ar, lda, Br, ldb, beta, C0, ex, s);
            exact(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ex_u, s_u);
            float *dA = dev(A, na), *dB = dev(B, nb), *dAr = dev(Ar, na), *dBr = dev(Br, nb);
            float *dC = dev(C0, nc);
            char label[128];
            snprintf(label, sizeof label, "%s gemm %dx%dx%d ta%d tb%d ld+%d", prec_name(prec), M, N,
                     K, ta, tb, pad);
            /* rounded inputs: the worst-case bound, and twice the same bits */
            CHECK_OK(mmp_cuda_gemm_lp(ctx, prec, ta, tb, M, N, K, alpha, dAr, lda, dBr, ldb, beta,
                                      dC, N));
            float *g1 = back(dC, nc);
            CHECK_OK(mmp_cuda_memcpy_h2d(ctx, dC, C0, nc * sizeof(float)));
            CHECK_OK(mmp_cuda_gemm_lp(ctx, prec, ta, tb, M, N, K, alpha, dAr, lda, dBr, ldb, beta,
                                      dC, N));
            float *g2 = back(dC, nc);
            CHECK(within_bound(label, g1, ex, s, nc, K));
            CHECK(same_bits(g1, g2, nc));
            /* the CPU reference on the same rounded inputs, within the same bound */
            float *cpu = mmp_test_floats(nc);
            memcpy(cpu, C0, nc * sizeof(float));
            mmp_cpu_gemm(ta, tb, M, N, K, alpha, Ar, lda, Br, ldb, beta, cpu, N);
            CHECK(within_bound("  (the CPU reference)", cpu, ex, s, nc, K));
            /* raw inputs: the op rounds them itself, to the same bits */
            CHECK_OK(mmp_cuda_memcpy_h2d(ctx, dC, C0, nc * sizeof(float)));
            CHECK_OK(
                mmp_cuda_gemm_lp(ctx, prec, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, N));
            float *g3 = back(dC, nc);
            CHECK(same_bits(g1, g3, nc));
            if (K >= 16) { /* enough terms for RMS figures to mean something */
                CHECK(rounded_itself(label, g3, ex, ex_u, nc));
            }
            free(A), free(B), free(C0), free(Ar), free(Br), free(ex), free(s), free(ex_u);
            free(s_u), free(g1), free(g2), free(g3), free(cpu);
            mmp_cuda_free(dA), mmp_cuda_free(dB), mmp_cuda_free(dAr), mmp_cuda_free(dBr);
            mmp_cuda_free(dC);
        }
    }
}

/* linear_fwd_lp / linear_bwd_lp on raw inputs against the CPU's linear on
 * rounded ones; db bitwise the fp32 kernel's on the rounded dout. */
static void linear_case(int prec, int N, int C, int OC)
{
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = rnd(ni), *w = rnd(nw), *b = rnd(OC), *dout = rnd(no);
    float *dinp0 = rnd(ni), *dw0 = rnd(nw), *db0 = rnd(OC);
    float *ri = rounded(inp, ni, prec), *rw = rounded(w, nw, prec), *rd = rounded(dout, no, prec);
    float *d_inp = dev(inp, ni), *d_w = dev(w, nw), *d_b = dev(b, OC), *d_dout = dev(dout, no);
    float *d_rd = dev(rd, no), *d_out = dev(NULL, no);
    float *d_dinp = dev(dinp0, ni), *d_dw = dev(dw0, nw), *d_db = dev(db0, OC),
          *d_db32 = dev(db0, OC);
    char label[128];
    snprintf(label, sizeof label, "%s linear N%d C%d OC%d", prec_name(prec), N, C, OC);

    /* forward: out = inp w^T + b, b fp32 (the beta*C term of the bound) */
    double *ex = malloc(ni > nw ? ni * sizeof(double) * 2 : nw * sizeof(double) * 2);
    double *s = malloc(ni > nw ? ni * sizeof(double) * 2 : nw * sizeof(double) * 2);
    double *ex2 = malloc(no * sizeof(double)), *s2 = malloc(no * sizeof(double));
    float *bias_rows = mmp_test_floats(no);
    for (int n = 0; n < N; n++) {
        memcpy(bias_rows + (size_t)n * OC, b, OC * sizeof(float));
    }
    exact(0, 1, N, OC, C, 1.0, ri, C, rw, C, 1.0, bias_rows, ex2, s2);
    CHECK_OK(mmp_cuda_linear_fwd_lp(ctx, d_out, d_inp, d_w, d_b, N, C, OC, prec));
    float *o1 = back(d_out, no);
    CHECK_OK(mmp_cuda_linear_fwd_lp(ctx, d_out, d_inp, d_w, d_b, N, C, OC, prec));
    float *o2 = back(d_out, no);
    CHECK(within_bound(label, o1, ex2, s2, no, C));
    CHECK(same_bits(o1, o2, no));
    float *cpu = mmp_test_floats(no);
    mmp_cpu_linear_fwd(cpu, ri, rw, b, N, C, OC);
    CHECK(within_bound("  (the CPU linear)", cpu, ex2, s2, no, C));

    /* backward, accumulating into random gradients */
    CHECK_OK(mmp_cuda_linear_bwd_lp(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC, prec));
    float *gi = back(d_dinp, ni), *gw = back(d_dw, nw), *gb = back(d_db, OC);
    exact(0, 0, N, C, OC, 1.0, rd, OC, rw, C, 1.0, dinp0, ex, s);
    CHECK(within_bound("  dinp", gi, ex, s, ni, OC));
    exact(1, 0, OC, C, N, 1.0, rd, OC, ri, C, 1.0, dw0, ex, s);
    CHECK(within_bound("  dw", gw, ex, s, nw, N));
    CHECK_OK(mmp_cuda_linear_bwd(ctx, NULL, NULL, d_db32, d_rd, NULL, NULL, N, C, OC));
    float *gb32 = back(d_db32, OC);
    CHECK(same_bits(gb, gb32, OC));
    /* again from the same gradients: the same bits */
    CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_dinp, dinp0, ni * sizeof(float)));
    CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_dw, dw0, nw * sizeof(float)));
    CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_db, db0, OC * sizeof(float)));
    CHECK_OK(mmp_cuda_linear_bwd_lp(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC, prec));
    float *gi2 = back(d_dinp, ni), *gw2 = back(d_dw, nw), *gb2 = back(d_db, OC);
    CHECK(same_bits(gi, gi2, ni) && same_bits(gw, gw2, nw) && same_bits(gb, gb2, OC));

    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0), free(ri);
    free(rw), free(rd), free(ex), free(s), free(ex2), free(s2), free(bias_rows), free(o1);
    free(o2), free(cpu), free(gi), free(gw), free(gb), free(gb32), free(gi2), free(gw2), free(gb2);
    float *d[] = {d_inp, d_w, d_b, d_dout, d_rd, d_out, d_dinp, d_dw, d_db, d_db32};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        mmp_cuda_free(d[i]);
    }
}

/* |got - ref| <= tol * max|ref| + 1e-6 over n. */
static int close_to(const char *label, const float *got, const float *ref, size_t n, double tol)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs(ref[i]));
    }
    return mmp_test_close(label, got, ref, n, tol * m + 1e-6, 0.0);
}

/* Attention with prec against the CPU's with prec, on rounded q, k, v, dout.
 * Both round the probabilities and the score gradients, and a value that
 * the two fp32 sums put on different sides of a rounding boundary differs
 * by one 16-bit ulp (2^-7 relative for bf16, 2^-10 for fp16); such flips
 * weigh at most that much of the output (the probabilities sum to 1), so
 * the tolerance is 4 ulps of the largest magnitude. */
static void attention_case(int prec, int B, int Tq, int Tk, int C, int NH)
{
    const size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C, na = (size_t)B * NH * Tq * Tk;
    float *q = rnd_rounded(nq, prec), *k = rnd_rounded(nk, prec);
    float *v = rnd_rounded(nk, prec), *dout = rnd_rounded(nq, prec);
    float *out = mmp_test_floats(nq), *att = mmp_test_floats(na), *dq = mmp_test_floats(nq),
          *dk = mmp_test_floats(nk), *dv = mmp_test_floats(nk);
    mmp_cpu_attention_fwd(out, att, q, k, v, NULL, B, Tq, Tk, C, NH, prec);
    mmp_cpu_attention_bwd(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH, prec);
    float *d_q = dev(q, nq), *d_k = dev(k, nk), *d_v = dev(v, nk), *d_dout = dev(dout, nq);
    float *d_out = dev(NULL, nq), *d_att = dev(NULL, na), *d_catt = dev(att, na);
    float *d_dq = dev(NULL, nq), *d_dk = dev(NULL, nk), *d_dv = dev(NULL, nk);
    const double tol = 4 * (prec == 1 ? ldexp(1, -7) : ldexp(1, -10));
    char label[128];
    snprintf(label, sizeof label, "%s attention B%d Tq%d Tk%d C%d NH%d", prec_name(prec), B, Tq, Tk,
             C, NH);
    float *first[5] = {0};
    for (int run = 0; run < 2; run++) {
        CHECK_OK(
            mmp_cuda_attention_fwd(ctx, d_out, d_att, d_q, d_k, d_v, NULL, B, Tq, Tk, C, NH, prec));
        CHECK_OK(mmp_cuda_memset(ctx, d_dq, 0, nq * sizeof(float)));
        CHECK_OK(mmp_cuda_memset(ctx, d_dk, 0, nk * sizeof(float)));
        CHECK_OK(mmp_cuda_memset(ctx, d_dv, 0, nk * sizeof(float)));
        /* backward from the CPU's probabilities: judged on its own */
        CHECK_OK(mmp_cuda_attention_bwd(ctx, d_dq, d_dk, d_dv, d_dout, d_catt, d_q, d_k, d_v, B, Tq,
                                        Tk, C, NH, prec));
        float *got[5] = {back(d_out, nq), back(d_att, na), back(d_dq, nq), back(d_dk, nk),
                         back(d_dv, nk)};
        const size_t n[5] = {nq, na, nq, nk, nk};
        if (run == 0) {
            CHECK(close_to(label, got[0], out, nq, tol));
            CHECK(close_to("  att", got[1], att, na, tol));
            CHECK(close_to("  dq", got[2], dq, nq, tol));
            CHECK(close_to("  dk", got[3], dk, nk, tol));
            CHECK(close_to("  dv", got[4], dv, nk, tol));
            memcpy(first, got, sizeof got);
        } else {
            for (int i = 0; i < 5; i++) {
                CHECK(same_bits(first[i], got[i], n[i]));
                free(first[i]);
                free(got[i]);
            }
        }
    }
    free(q), free(k), free(v), free(dout), free(out), free(att), free(dq), free(dk), free(dv);
    float *d[] = {d_q, d_k, d_v, d_dout, d_out, d_att, d_catt, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        mmp_cuda_free(d[i]);
    }
}

/* Exact conv2d of rounded inputs in double: out, dinp, dw and db with the
 * magnitudes of their terms (each output starts from its c0, bias or
 * accumulated gradient). */
typedef struct conv_exact {
    double *out, *s_out, *dinp, *s_dinp, *dw, *s_dw, *db, *s_db;
} conv_exact;

static void conv_exact_run(conv_exact *e, const mmp_conv_shape *s, const float *inp, const float *w,
                           const float *b, const float *dout, const float *dinp0, const float *dw0,
                           const float *db0)
{
    const size_t ni = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->OC * s->C * s->KH * s->KW;
    const size_t no = (size_t)s->N * s->OC * s->OH * s->OW;
    e->out = mmp_test_doubles(no), e->s_out = mmp_test_doubles(no), e->dinp = mmp_test_doubles(ni),
    e->s_dinp = mmp_test_doubles(ni);
    e->dw = mmp_test_doubles(nw), e->s_dw = mmp_test_doubles(nw), e->db = mmp_test_doubles(s->OC),
    e->s_db = mmp_test_doubles(s->OC);
    for (size_t i = 0; i < ni; i++) {
        e->dinp[i] = dinp0[i];
        e->s_dinp[i] = fabs(dinp0[i]);
    }
    for (size_t i = 0; i < nw; i++) {
        e->dw[i] = dw0[i];
        e->s_dw[i] = fabs(dw0[i]);
    }
    for (int oc = 0; oc < s->OC; oc++) {
        e->db[oc] = db0[oc];
        e->s_db[oc] = fabs(db0[oc]);
    }
    for (int n = 0; n < s->N; n++) {
        for (int oc = 0; oc < s->OC; oc++) {
            for (int oh = 0; oh < s->OH; oh++) {
                for (int ow = 0; ow < s->OW; ow++) {
                    const size_t o = (((size_t)n * s->OC + oc) * s->OH + oh) * s->OW + ow;
                    double acc = b[oc], mag = fabs(b[oc]), d = dout[o];
                    e->db[oc] += d;
                    e->s_db[oc] += fabs(d);
                    for (int c = 0; c < s->C; c++) {
                        for (int kh = 0; kh < s->KH; kh++) {
                            const int h = oh * s->stride - s->pad + kh;
                            if (h < 0 || h >= s->H) {
                                continue;
                            }
                            for (int kw = 0; kw < s->KW; kw++) {
                                const int x = ow * s->stride - s->pad + kw;
                                if (x < 0 || x >= s->W) {
                                    continue;
                                }
                                const size_t ii = (((size_t)n * s->C + c) * s->H + h) * s->W + x;
                                const size_t wi =
                                    (((size_t)oc * s->C + c) * s->KH + kh) * s->KW + kw;
                                acc += (double)w[wi] * inp[ii];
                                mag += fabs((double)w[wi] * inp[ii]);
                                e->dinp[ii] += d * w[wi];
                                e->s_dinp[ii] += fabs(d * w[wi]);
                                e->dw[wi] += d * inp[ii];
                                e->s_dw[wi] += fabs(d * inp[ii]);
                            }
                        }
                    }
                    e->out[o] = acc;
                    e->s_out[o] = mag;
                }
            }
        }
    }
}

static void conv_exact_free(conv_exact *e)
{
    free(e->out), free(e->s_out), free(e->dinp), free(e->s_dinp), free(e->dw), free(e->s_dw);
    free(e->db), free(e->s_db);
}

/* conv2d_fwd_lp / conv2d_bwd_lp on raw inputs against the exact conv and
 * the CPU's conv of the rounded inputs, each within the bound of its
 * number of terms; twice the same bits. */
static void conv_case(const char *path, int prec, int N, int C, int H, int W, int OC, int k,
                      int stride, int pad)
{
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, N, C, H, W, OC, k, k, stride, pad);
    const size_t ni = (size_t)N * C * H * W, nw = (size_t)OC * C * k * k;
    const size_t no = (size_t)N * OC * s.OH * s.OW;
    float *inp = rnd(ni), *w = rnd(nw), *b = rnd(OC), *dout = rnd(no);
    float *dinp0 = rnd(ni), *dw0 = rnd(nw), *db0 = rnd(OC);
    float *ri = rounded(inp, ni, prec), *rw = rounded(w, nw, prec), *rd = rounded(dout, no, prec);
    conv_exact e;
    conv_exact_run(&e, &s, ri, rw, b, rd, dinp0, dw0, db0);
    float *d_inp = dev(inp, ni), *d_w = dev(w, nw), *d_b = dev(b, OC), *d_dout = dev(dout, no);
    float *d_out = dev(NULL, no), *d_dinp = dev(dinp0, ni), *d_dw = dev(dw0, nw);
    float *d_db = dev(db0, OC);
    char label[160];
    snprintf(label, sizeof label, "%s conv (%s) N%d C%d %dx%d OC%d k%d s%d p%d", prec_name(prec),
             path, N, C, H, W, OC, k, stride, pad);
    const int K_out = C * k * k, K_dinp = OC * k * k + 1, K_dw = N * s.OH * s.OW;
    float *got[2][4];
    for (int run = 0; run < 2; run++) {
        CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_dinp, dinp0, ni * sizeof(float)));
        CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_dw, dw0, nw * sizeof(float)));
        CHECK_OK(mmp_cuda_memcpy_h2d(ctx, d_db, db0, OC * sizeof(float)));
        CHECK_OK(mmp_cuda_conv2d_fwd_lp(ctx, d_out, d_inp, d_w, d_b, &s, prec));
        CHECK_OK(mmp_cuda_conv2d_bwd_lp(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, &s, prec));
        got[run][0] = back(d_out, no), got[run][1] = back(d_dinp, ni);
        got[run][2] = back(d_dw, nw), got[run][3] = back(d_db, OC);
    }
    CHECK(within_bound(label, got[0][0], e.out, e.s_out, no, K_out));
    CHECK(within_bound("  conv dinp", got[0][1], e.dinp, e.s_dinp, ni, K_dinp));
    CHECK(within_bound("  conv dw", got[0][2], e.dw, e.s_dw, nw, K_dw));
    CHECK(within_bound("  conv db", got[0][3], e.db, e.s_db, OC, K_dw));
    CHECK(same_bits(got[0][0], got[1][0], no) && same_bits(got[0][1], got[1][1], ni) &&
          same_bits(got[0][2], got[1][2], nw) && same_bits(got[0][3], got[1][3], OC));
    /* the CPU's conv of the rounded inputs, within the same bounds */
    float *cpu = mmp_test_floats(no), *ci = mmp_test_floats(ni), *cw = mmp_test_floats(nw),
          *cb = mmp_test_floats(OC);
    memcpy(ci, dinp0, ni * sizeof(float));
    memcpy(cw, dw0, nw * sizeof(float));
    memcpy(cb, db0, OC * sizeof(float));
    mmp_cpu_conv2d_fwd(cpu, ri, rw, b, &s, NULL);
    mmp_cpu_conv2d_bwd(ci, cw, cb, rd, ri, rw, &s, NULL);
    CHECK(within_bound("  (the CPU conv)", cpu, e.out, e.s_out, no, K_out));
    CHECK(within_bound("  (the CPU conv) dinp", ci, e.dinp, e.s_dinp, ni, K_dinp));
    CHECK(within_bound("  (the CPU conv) dw", cw, e.dw, e.s_dw, nw, K_dw));
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < 4; i++) {
            free(got[run][i]);
        }
    }
    conv_exact_free(&e);
    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0), free(ri), free(rw);
    free(rd), free(cpu), free(ci), free(cw), free(cb);
    float *d[] = {d_inp, d_w, d_b, d_dout, d_out, d_dinp, d_dw, d_db};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        mmp_cuda_free(d[i]);
    }
}

/* Each path of conv2d_*_lp (kernels/cuda.h: MMP_CUDA_CONV_LP), then back
 * to the default (cudnn). */
static void test_conv_lp(void)
{
    static const struct {
        mmp_cuda_conv_lp path;
        const char *name;
    } paths[] = {{MMP_CUDA_CONV_LP_CUDNN, "cudnn tf32"}, {MMP_CUDA_CONV_LP_IM2COL, "im2col"}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        mmp_cuda_set_conv_lp(ctx, paths[i].path);
        const char *p = paths[i].name;
        for (int prec = 1; prec <= 2; prec++) {
            conv_case(p, prec, 2, 5, 9, 9, 7, 3, 2, 1);     /* odd everything: CKK 45, P 25 */
            conv_case(p, prec, 3, 16, 8, 8, 24, 1, 1, 0);   /* a 1x1 bottleneck convolution */
            conv_case(p, prec, 2, 16, 9, 9, 32, 1, 2, 0);   /* a strided 1x1 projection */
            conv_case(p, prec, 2, 3, 32, 32, 16, 7, 2, 3);  /* a stem: CKK 147 */
            conv_case(p, prec, 2, 64, 14, 14, 64, 3, 1, 1); /* ResNet's 3x3 at 64 channels */
        }
    }
    mmp_cuda_set_conv_lp(ctx, MMP_CUDA_CONV_LP_CUDNN);
}

static void test_gemm_odd(void)
{
    for (int prec = 1; prec <= 2; prec++) {
        gemm_case(prec, 37, 45, 29, 0); /* K % 8 = 5 */
        gemm_case(prec, 33, 17, 3, 1);  /* K = 3, odd leading dimensions */
        gemm_case(prec, 9, 70, 1, 0);   /* K = 1 */
        gemm_case(prec, 64, 64, 64, 0); /* aligned */
        gemm_case(prec, 40, 24, 130, 3);
    }
}

static void test_linear_demo(void)
{
    /* configs/gpu-1.yaml's widths: tokens of 16 x 8 samples through 64..256 */
    for (int prec = 1; prec <= 2; prec++) {
        linear_case(prec, 128, 64, 192);
        linear_case(prec, 128, 256, 64);
        linear_case(prec, 8, 64, 1);  /* an ITM-head-like OC = 1 */
        linear_case(prec, 7, 27, 13); /* nothing a multiple of 8 */
    }
}

static void test_linear_seed_scale(void)
{
    /* BERT-base rows of one sample x 128 tokens: QKV, the MLP up and down */
    for (int prec = 1; prec <= 2; prec++) {
        linear_case(prec, 128, 768, 2304);
        linear_case(prec, 128, 768, 3072);
        linear_case(prec, 128, 3072, 768);
    }
}

static void test_attention_lp(void)
{
    for (int prec = 1; prec <= 2; prec++) {
        attention_case(prec, 2, 16, 16, 64, 4);     /* demo-like self-attention */
        attention_case(prec, 3, 5, 49, 24, 3);      /* cross-attention, odd Tk */
        attention_case(prec, 2, 128, 128, 768, 12); /* BERT-base */
    }
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_gemm_odd),          MMP_TEST_CASE(test_linear_demo),
    MMP_TEST_CASE(test_linear_seed_scale), MMP_TEST_CASE(test_attention_lp),
    MMP_TEST_CASE(test_conv_lp),
};

int main(int argc, char **argv)
{
    if (mmp_cuda_device_count() == 0) {
        return mmp_test_skip(NAME, "no CUDA device");
    }
    if (mmp_cuda_ctx_create(&ctx, 0) != MMP_OK) {
        fprintf(stderr, "%s: %s\n", NAME, mmp_last_error());
        return 1;
    }
    int rc = MMP_TEST_MAIN(NAME, cases, argc, argv);
    printf("worst error against the exact product, as a share of the (K+2) 2^-22 S bound: GPU "
           "%.3g, CPU reference %.3g\n",
           worst_gpu, worst_cpu);
    mmp_cuda_ctx_destroy(ctx);
    return rc;
}

#endif
