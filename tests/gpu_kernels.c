/* The CUDA kernels against the CPU reference: every op in kernels/cuda.h runs
 * on the same random inputs as its twin in kernels/cpu.h, and every output
 * and every gradient must agree to fp32 rounding (|a-b| <= atol + rtol|ref|).
 *
 * Gradients start from random values, not zeros, so the test also holds the
 * GPU to accumulating (+=), and a second backward with some gradients NULL
 * checks that those are skipped and the rest accumulate again. Backward
 * kernels get the CPU's saved activations, so a backward is judged on its
 * own. Skips (exit 77) when built without CUDA or when no device is visible. */
#include "tests/harness.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_kernels", "built without CUDA");
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/cpu.h"
#include "kernels/cuda.h"

#define NAME "gpu_kernels"
#define ATOL 1e-5
#define RTOL 1e-4
/* Sums of about a thousand products (conv and batch-norm weight gradients):
 * partial sums of magnitude ~10 round at ~1e-6 each, and CPU and GPU add in
 * different orders, so a result near 0 can differ by more than 1e-5. */
#define ATOL_LONG 1e-4

static mmp_cuda_ctx *ctx;

/* ---- buffers: every host and device array of a test, freed together ------ */

#define MAX_BUFS 128
static void *host_bufs[MAX_BUFS];
static int n_host;
static void *dev_bufs[MAX_BUFS];
static int n_dev;
static unsigned long long seed;

static void die(const char *what)
{
    fprintf(stderr, "%s: cannot continue: %s (%s)\n", NAME, what, mmp_last_error());
    exit(1);
}

static void *host_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || n_host == MAX_BUFS) {
        die("host allocation");
    }
    host_bufs[n_host++] = p;
    return p;
}

/* n floats uniform in [lo, hi), each call a fresh seed; all zero if lo == hi. */
static float *rnd(size_t n, float lo, float hi)
{
    float *x = host_alloc(sizeof(float) * n);
    if (lo != hi) {
        mmp_test_fill(x, n, lo, hi, ++seed);
    }
    return x;
}

/* A device copy of bytes from host x (zeros when x is NULL). */
static void *dev_bytes(const void *x, size_t bytes)
{
    void *p;
    if (n_dev == MAX_BUFS || mmp_cuda_malloc(&p, bytes) != MMP_OK) {
        die("device allocation");
    }
    dev_bufs[n_dev++] = p;
    if (mmp_cuda_memset(ctx, p, 0, bytes) != MMP_OK ||
        (x && mmp_cuda_memcpy_h2d(ctx, p, x, bytes) != MMP_OK)) {
        die("copy to the device");
    }
    return p;
}

static float *dev(const float *x, size_t n)
{
    return dev_bytes(x, sizeof(float) * n);
}

/* The device array d (n floats) against the reference ref. */
static void check(const char *label, const float *d, const float *ref, size_t n, double atol)
{
    float *h = host_alloc(sizeof(float) * n);
    CHECK_OK(mmp_cuda_memcpy_d2h(ctx, h, d, sizeof(float) * n));
    CHECK_CLOSE(label, h, ref, n, atol, RTOL);
}

static void release(void)
{
    for (int i = 0; i < n_host; i++) {
        free(host_bufs[i]);
    }
    for (int i = 0; i < n_dev; i++) {
        mmp_cuda_free(dev_bufs[i]);
    }
    n_host = n_dev = 0;
}

/* The device array d (bytes) holds exactly ref's bits. */
static void check_bits(const char *label, const void *d, const void *ref, size_t bytes)
{
    void *h = host_alloc(bytes);
    CHECK_OK(mmp_cuda_memcpy_d2h(ctx, h, d, bytes));
    int same = memcmp(h, ref, bytes) == 0;
    if (!same) {
        fprintf(stderr, "  %s: not bitwise the reference\n", label);
    }
    CHECK(same);
}

/* ---- context and memory --------------------------------------------------- */

static void test_context(void)
{
    mmp_cuda_ctx_destroy(NULL); /* NULL-safe */
    CHECK(mmp_cuda_ctx_stream(ctx) != NULL);
    CHECK(mmp_cuda_ctx_device(ctx) == 0);
    void *p = (void *)1;
    CHECK_OK(mmp_cuda_malloc(&p, 0));
    CHECK(p == NULL);
    CHECK_OK(mmp_cuda_free(NULL));

    float *x = rnd(1000, -1, 1), *back = rnd(1000, 0, 0);
    float *d = dev(x, 1000), *d2 = dev(NULL, 1000);
    CHECK_OK(mmp_cuda_memcpy_d2d(ctx, d2, d, sizeof(float) * 1000));
    CHECK_OK(mmp_cuda_memcpy_d2h(ctx, back, d2, sizeof(float) * 1000));
    CHECK(memcmp(back, x, sizeof(float) * 1000) == 0);
    CHECK_OK(mmp_cuda_memset(ctx, d2, 0, sizeof(float) * 1000));
    CHECK_OK(mmp_cuda_sync(ctx));
    check("memset", d2, rnd(1000, 0, 0), 1000, 0.0);

    /* a shape an op cannot take is an error value, not a crash */
    CHECK(mmp_cuda_attention_fwd(ctx, d, d, d, d, d, NULL, 1, 2, 2, 10, 3, 0) == MMP_ERR_INVALID);
    release();
}

/* The arena (256-byte aligned, disjoint carvings, a chunk of its own past
 * MMP_CUDA_ARENA_CHUNK) and the asynchronous upload from page-locked memory. */
static void test_arena_upload(void)
{
    const size_t sizes[] = {1, 255, 256, 1000, MMP_CUDA_ARENA_CHUNK + 1, 4096};
    const size_t count = sizeof sizes / sizeof sizes[0];
    char *p[sizeof sizes / sizeof sizes[0]];
    size_t before = mmp_cuda_ctx_device_bytes(ctx);
    for (size_t i = 0; i < count; i++) {
        void *q = NULL;
        CHECK_OK(mmp_cuda_arena_alloc(ctx, &q, sizes[i]));
        p[i] = q;
        CHECK(q != NULL && (uintptr_t)q % 256 == 0);
    }
    for (size_t i = 0; i < count; i++) {
        for (size_t j = 0; j < count; j++) {
            CHECK(i == j || p[i] + sizes[i] <= p[j] || p[j] + sizes[j] <= p[i]);
        }
    }
    CHECK(mmp_cuda_ctx_device_bytes(ctx) >= before + MMP_CUDA_ARENA_CHUNK + 1);

    const size_t n = 100003;
    float *host = mmp_cuda_host_alloc(sizeof(float) * n);
    CHECK(host != NULL);
    if (!host) {
        return;
    }
    float *x = rnd(n, -1, 1);
    memcpy(host, x, sizeof(float) * n);
    float *d = dev(NULL, n);
    CHECK_OK(mmp_cuda_upload(ctx, d, host, sizeof(float) * n));
    CHECK_OK(mmp_cuda_upload_wait(ctx));
    memset(host, 0, sizeof(float) * n); /* the copy is done: host is free again */
    check_bits("upload", d, x, sizeof(float) * n);
    mmp_cuda_host_free(host);
    release();
}

/* ---- GEMM and linear ------------------------------------------------------ */

static void test_gemm(void)
{
    const int M = 33, N = 17, K = 29;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            float *A = rnd((size_t)M * K, -1, 1), *B = rnd((size_t)K * N, -1, 1);
            float *C = rnd((size_t)M * N, -1, 1);
            float *dA = dev(A, (size_t)M * K), *dB = dev(B, (size_t)K * N);
            float *dC = dev(C, (size_t)M * N);
            int lda = ta ? M : K, ldb = tb ? K : N;
            mmp_cpu_gemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C, N);
            CHECK_OK(mmp_cuda_gemm(ctx, ta, tb, M, N, K, 0.7f, dA, lda, dB, ldb, 0.3f, dC, N));
            char label[64];
            snprintf(label, sizeof label, "gemm ta=%d tb=%d", ta, tb);
            check(label, dC, C, (size_t)M * N, ATOL);
        }
    }
    release();
}

static void test_linear(void)
{
    const int N = 24, C = 40, OC = 20;
    float *inp = rnd(N * C, -1, 1), *w = rnd(OC * C, -1, 1), *b = rnd(OC, -1, 1);
    float *out = rnd(N * OC, 0, 0);
    float *d_inp = dev(inp, N * C), *d_w = dev(w, OC * C), *d_b = dev(b, OC);
    float *d_out = dev(NULL, N * OC);
    mmp_cpu_linear_fwd(out, inp, w, b, N, C, OC);
    CHECK_OK(mmp_cuda_linear_fwd(ctx, d_out, d_inp, d_w, d_b, N, C, OC));
    check("linear out", d_out, out, N * OC, ATOL);
    mmp_cpu_linear_fwd(out, inp, w, NULL, N, C, OC);
    CHECK_OK(mmp_cuda_linear_fwd(ctx, d_out, d_inp, d_w, NULL, N, C, OC));
    check("linear out (no bias)", d_out, out, N * OC, ATOL);

    float *dout = rnd(N * OC, -1, 1);
    float *dinp = rnd(N * C, -1, 1), *dw = rnd(OC * C, -1, 1), *db = rnd(OC, -1, 1);
    float *d_dout = dev(dout, N * OC), *d_dinp = dev(dinp, N * C), *d_dw = dev(dw, OC * C);
    float *d_db = dev(db, OC);
    mmp_cpu_linear_bwd(dinp, dw, db, dout, inp, w, N, C, OC);
    CHECK_OK(mmp_cuda_linear_bwd(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC));
    check("linear dinp", d_dinp, dinp, N * C, ATOL);
    check("linear dw", d_dw, dw, OC * C, ATOL);
    check("linear db", d_db, db, OC, ATOL);
    mmp_cpu_linear_bwd(NULL, dw, NULL, dout, inp, w, N, C, OC);
    CHECK_OK(mmp_cuda_linear_bwd(ctx, NULL, d_dw, NULL, d_dout, d_inp, d_w, N, C, OC));
    check("linear dw (again, dinp db NULL)", d_dw, dw, OC * C, ATOL);
    check("linear db (untouched)", d_db, db, OC, 0.0);
    release();
}

/* ---- conv2d --------------------------------------------------------------- */

static void conv_case(int N, int C, int H, int W, int OC, int k, int stride, int pad)
{
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, N, C, H, W, OC, k, k, stride, pad);
    size_t ni = (size_t)N * C * H * W, nw = (size_t)OC * C * k * k;
    size_t no = (size_t)N * OC * s.OH * s.OW;
    char label[128];
    float *inp = rnd(ni, -1, 1), *w = rnd(nw, -1, 1), *b = rnd(OC, -1, 1), *out = rnd(no, 0, 0);
    float *d_inp = dev(inp, ni), *d_w = dev(w, nw), *d_b = dev(b, OC), *d_out = dev(NULL, no);
    mmp_cpu_conv2d_fwd(out, inp, w, b, &s, NULL);
    CHECK_OK(mmp_cuda_conv2d_fwd(ctx, d_out, d_inp, d_w, d_b, &s));
    snprintf(label, sizeof label, "conv k%d s%d p%d C%d->%d out", k, stride, pad, C, OC);
    check(label, d_out, out, no, ATOL);

    float *dout = rnd(no, -1, 1);
    float *dinp = rnd(ni, -1, 1), *dw = rnd(nw, -1, 1), *db = rnd(OC, -1, 1);
    float *d_dout = dev(dout, no), *d_dinp = dev(dinp, ni), *d_dw = dev(dw, nw);
    float *d_db = dev(db, OC);
    mmp_cpu_conv2d_bwd(dinp, dw, db, dout, inp, w, &s, NULL);
    CHECK_OK(mmp_cuda_conv2d_bwd(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, &s));
    snprintf(label, sizeof label, "conv k%d s%d p%d dinp", k, stride, pad);
    check(label, d_dinp, dinp, ni, ATOL);
    snprintf(label, sizeof label, "conv k%d s%d p%d dw", k, stride, pad);
    check(label, d_dw, dw, nw, ATOL_LONG);
    snprintf(label, sizeof label, "conv k%d s%d p%d db", k, stride, pad);
    check(label, d_db, db, OC, ATOL_LONG);
    /* the cached plan serves a second call; NULL gradients are skipped */
    mmp_cpu_conv2d_bwd(NULL, dw, NULL, dout, inp, w, &s, NULL);
    CHECK_OK(mmp_cuda_conv2d_bwd(ctx, NULL, d_dw, NULL, d_dout, d_inp, d_w, &s));
    snprintf(label, sizeof label, "conv k%d s%d p%d dw (again)", k, stride, pad);
    check(label, d_dw, dw, nw, ATOL_LONG);
    check("conv dinp (untouched)", d_dinp, dinp, ni, ATOL);
    release();
}

static void test_conv(void)
{
    conv_case(4, 8, 16, 16, 16, 3, 1, 1);
    conv_case(4, 8, 16, 16, 16, 3, 2, 1); /* ResNet downsampling */
    conv_case(4, 8, 16, 16, 16, 1, 2, 0); /* the shortcut projection */
    conv_case(4, 8, 16, 16, 16, 1, 1, 0);
    conv_case(2, 3, 32, 32, 8, 7, 2, 3); /* a stem */

    mmp_conv_shape bad;
    mmp_conv_shape_set(&bad, 1, 1, 4, 4, 1, 3, 3, 1, 1);
    bad.OH = 5; /* not what the formula gives */
    float *d = dev(NULL, 64);
    CHECK(mmp_cuda_conv2d_fwd(ctx, d, d, d, NULL, &bad) == MMP_ERR_INVALID);
    release();
}

/* ---- batch norm ------------------------------------------------------------ */

static void test_batchnorm(void)
{
    const int N = 4, C = 8, HW = 64;
    const size_t n = (size_t)N * C * HW;
    const float eps = 1e-5f, momentum = 0.1f;
    float *inp = rnd(n, 0.5f, 2.5f), *gamma = rnd(C, 0.5f, 1.5f), *beta = rnd(C, -1, 1);
    float *out = rnd(n, 0, 0), *mean = rnd(C, 0, 0), *rstd = rnd(C, 0, 0);
    float *rmean = rnd(C, -1, 1), *rvar = rnd(C, 0.5f, 1.5f);
    float *d_inp = dev(inp, n), *d_gamma = dev(gamma, C), *d_beta = dev(beta, C);
    float *d_out = dev(NULL, n), *d_mean = dev(NULL, C), *d_rstd = dev(NULL, C);
    float *d_rmean = dev(rmean, C), *d_rvar = dev(rvar, C);
    mmp_cpu_batchnorm_fwd_train(out, mean, rstd, rmean, rvar, inp, gamma, beta, N, C, HW, eps,
                                momentum);
    CHECK_OK(mmp_cuda_batchnorm_fwd_train(ctx, d_out, d_mean, d_rstd, d_rmean, d_rvar, d_inp,
                                          d_gamma, d_beta, N, C, HW, eps, momentum));
    check("bn out", d_out, out, n, ATOL);
    check("bn mean", d_mean, mean, C, ATOL);
    check("bn rstd", d_rstd, rstd, C, ATOL);
    check("bn running_mean", d_rmean, rmean, C, ATOL);
    check("bn running_var", d_rvar, rvar, C, ATOL);
    /* without running statistics */
    CHECK_OK(mmp_cuda_batchnorm_fwd_train(ctx, d_out, d_mean, d_rstd, NULL, NULL, d_inp, d_gamma,
                                          d_beta, N, C, HW, eps, momentum));
    check("bn out (no running stats)", d_out, out, n, ATOL);

    mmp_cpu_batchnorm_fwd_infer(out, inp, gamma, beta, rmean, rvar, N, C, HW, eps);
    CHECK_OK(mmp_cuda_batchnorm_fwd_infer(ctx, d_out, d_inp, d_gamma, d_beta, d_rmean, d_rvar, N, C,
                                          HW, eps));
    check("bn infer out", d_out, out, n, ATOL);

    float *dout = rnd(n, -1, 1);
    float *dinp = rnd(n, -1, 1), *dgamma = rnd(C, -1, 1), *dbeta = rnd(C, -1, 1);
    float *d_dout = dev(dout, n), *d_dinp = dev(dinp, n), *d_dgamma = dev(dgamma, C);
    float *d_dbeta = dev(dbeta, C);
    /* both sides differentiate the CPU's saved statistics */
    float *d_cmean = dev(mean, C), *d_crstd = dev(rstd, C);
    mmp_cpu_batchnorm_bwd(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
    CHECK_OK(mmp_cuda_batchnorm_bwd(ctx, d_dinp, d_dgamma, d_dbeta, d_dout, d_inp, d_cmean, d_crstd,
                                    d_gamma, N, C, HW));
    check("bn dinp", d_dinp, dinp, n, ATOL);
    check("bn dgamma", d_dgamma, dgamma, C, ATOL_LONG);
    check("bn dbeta", d_dbeta, dbeta, C, ATOL_LONG);
    mmp_cpu_batchnorm_bwd(dinp, NULL, NULL, dout, inp, mean, rstd, gamma, N, C, HW);
    CHECK_OK(mmp_cuda_batchnorm_bwd(ctx, d_dinp, NULL, NULL, d_dout, d_inp, d_cmean, d_crstd,
                                    d_gamma, N, C, HW));
    check("bn dinp (again, dgamma dbeta NULL)", d_dinp, dinp, n, ATOL);
    check("bn dgamma (untouched)", d_dgamma, dgamma, C, ATOL_LONG);
    release();
}

/* ---- elementwise ------------------------------------------------------------ */

static void test_elementwise(void)
{
    const size_t n = 10007; /* not a multiple of any block size */
    float *x = rnd(n, -4, 4), *y = rnd(n, -1, 1), *out = rnd(n, 0, 0);
    float *dout = rnd(n, -1, 1), *dinp = rnd(n, -1, 1);
    float *d_x = dev(x, n), *d_y = dev(y, n), *d_out = dev(NULL, n), *d_dout = dev(dout, n);

    mmp_cpu_relu_fwd(out, x, n);
    CHECK_OK(mmp_cuda_relu_fwd(ctx, d_out, d_x, n));
    check("relu out", d_out, out, n, 0.0);
    float *d_dinp = dev(dinp, n);
    mmp_cpu_relu_bwd(dinp, dout, out, n);
    CHECK_OK(mmp_cuda_relu_bwd(ctx, d_dinp, d_dout, d_out, n));
    check("relu dinp", d_dinp, dinp, n, 0.0);

    mmp_cpu_gelu_fwd(out, x, n);
    CHECK_OK(mmp_cuda_gelu_fwd(ctx, d_out, d_x, n));
    check("gelu out", d_out, out, n, ATOL);
    mmp_cpu_gelu_bwd(dinp, dout, x, n);
    CHECK_OK(mmp_cuda_gelu_bwd(ctx, d_dinp, d_dout, d_x, n));
    check("gelu dinp", d_dinp, dinp, n, ATOL);

    mmp_cpu_add(out, x, y, n);
    CHECK_OK(mmp_cuda_add(ctx, d_out, d_x, d_y, n));
    check("add", d_out, out, n, 0.0);
    mmp_cpu_add(x, x, y, n); /* out aliasing a */
    CHECK_OK(mmp_cuda_add(ctx, d_x, d_x, d_y, n));
    check("add in place", d_x, x, n, 0.0);

    mmp_cpu_scale(y, -0.37f, n);
    CHECK_OK(mmp_cuda_scale(ctx, d_y, -0.37f, n));
    check("scale", d_y, y, n, 0.0);
    release();
}

/* transpose (plain and accumulating) and the double gradient accumulator:
 * bitwise the CPU's (each is one copy, add or conversion per element). */
static void test_transpose_f64(void)
{
    const int B = 3, R = 37, C = 19;
    const size_t n = (size_t)B * R * C;
    float *inp = rnd(n, -1, 1), *out = rnd(n, -1, 1);
    float *d_inp = dev(inp, n), *d_out = dev(out, n);
    mmp_cpu_transpose(out, inp, B, R, C, 1);
    CHECK_OK(mmp_cuda_transpose(ctx, d_out, d_inp, B, R, C, 1));
    check_bits("transpose (accumulate)", d_out, out, sizeof(float) * n);
    mmp_cpu_transpose(out, inp, B, R, C, 0);
    CHECK_OK(mmp_cuda_transpose(ctx, d_out, d_inp, B, R, C, 0));
    check_bits("transpose", d_out, out, sizeof(float) * n);

    const size_t m = 10007;
    double *acc = host_alloc(sizeof(double) * m);
    double *d_acc = dev_bytes(NULL, sizeof(double) * m);
    for (int k = 0; k < 3; k++) {
        float *x = rnd(m, -1, 1);
        x[k] = k == 0 ? 1e-30f : k == 1 ? -3e38f : 7.0f;
        float *d_x = dev(x, m);
        mmp_cpu_acc_f64(acc, x, m);
        CHECK_OK(mmp_cuda_acc_f64(ctx, d_acc, d_x, m));
    }
    check_bits("acc_f64", d_acc, acc, sizeof(double) * m);
    float *r = rnd(m, 0, 0), *d_r = dev(NULL, m);
    mmp_cpu_round_f64(r, acc, m);
    CHECK_OK(mmp_cuda_round_f64(ctx, d_r, d_acc, m));
    check_bits("round_f64", d_r, r, sizeof(float) * m);
    release();
}

/* The backend's _set ops (kernels/cuda/backend.c: zero, then the
 * accumulating kernel) against the CPU's, and a NULL dinp skipped. */
static void test_backend_set_ops(void)
{
    mmp_backend *be = NULL;
    CHECK_OK(mmp_backend_create(&be, &mmp_backend_cuda_ops, 0));
    if (!be) {
        return;
    }
    const int N = 3, C = 5, HW = 49;
    const size_t n = (size_t)N * C * HW;
    float *inp = rnd(n, -2, 2), *dout = rnd(n, -1, 1), *out = rnd(n, -1, 1);
    float *gamma = rnd(C, 0.5f, 1.5f), *mean = rnd(C, -0.1f, 0.1f), *rstd = rnd(C, 0.5f, 1.5f);
    float *dgamma = rnd(C, -1, 1), *dbeta = rnd(C, -1, 1);
    float *dinp = rnd(n, 0, 0);
    dout[0] = -0.0f; /* 0 + -0 is +0 on both */
    float *d_inp = dev(inp, n), *d_dout = dev(dout, n), *d_out = dev(out, n);
    float *d_gamma = dev(gamma, C), *d_mean = dev(mean, C), *d_rstd = dev(rstd, C);
    float *d_dgamma = dev(dgamma, C), *d_dbeta = dev(dbeta, C);
    float *d_dinp = dev(rnd(n, -1, 1), n); /* garbage the _set ops must not read */

    mmp_cpu_relu_bwd_set(dinp, dout, out, n);
    be->ops->relu_bwd_set(be, d_dinp, d_dout, d_out, n);
    be->ops->sync(be); /* be has a stream of its own; check() reads on ctx's */
    check_bits("relu_bwd_set", d_dinp, dinp, sizeof(float) * n);

    mmp_cpu_batchnorm_bwd_set(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
    be->ops->batchnorm_bwd_set(be, d_dinp, d_dgamma, d_dbeta, d_dout, d_inp, d_mean, d_rstd,
                               d_gamma, N, C, HW);
    be->ops->sync(be);
    check("batchnorm_bwd_set dinp", d_dinp, dinp, n, ATOL);
    check("batchnorm_bwd_set dgamma", d_dgamma, dgamma, C, ATOL_LONG);
    check("batchnorm_bwd_set dbeta", d_dbeta, dbeta, C, ATOL_LONG);
    /* no input gradient wanted: the parameter gradients only, as on the CPU */
    mmp_cpu_batchnorm_bwd_set(NULL, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
    be->ops->batchnorm_bwd_set(be, NULL, d_dgamma, d_dbeta, d_dout, d_inp, d_mean, d_rstd, d_gamma,
                               N, C, HW);
    be->ops->sync(be);
    check("batchnorm_bwd_set dgamma (dinp NULL)", d_dgamma, dgamma, C, ATOL_LONG);
    CHECK_OK(mmp_backend_error(be));
    release();
    mmp_backend_destroy(be);
}

/* ---- pooling ----------------------------------------------------------------- */

static void maxpool_case(int k, int stride, int pad)
{
    const int N = 2, C = 3, H = 16, W = 16;
    const int OH = (H + 2 * pad - k) / stride + 1, OW = (W + 2 * pad - k) / stride + 1;
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * OH * OW;
    float *inp = rnd(ni, -1, 1), *out = rnd(no, 0, 0);
    int32_t *am = host_alloc(sizeof(int32_t) * no), *am_gpu = host_alloc(sizeof(int32_t) * no);
    float *d_inp = dev(inp, ni), *d_out = dev(NULL, no);
    int32_t *d_am = dev_bytes(NULL, sizeof(int32_t) * no);
    mmp_cpu_maxpool2d_fwd(out, am, inp, N, C, H, W, k, stride, pad, OH, OW);
    CHECK_OK(mmp_cuda_maxpool2d_fwd(ctx, d_out, d_am, d_inp, N, C, H, W, k, stride, pad, OH, OW));
    check("maxpool out", d_out, out, no, 0.0);
    CHECK_OK(mmp_cuda_memcpy_d2h(ctx, am_gpu, d_am, sizeof(int32_t) * no));
    CHECK(memcmp(am_gpu, am, sizeof(int32_t) * no) == 0);

    float *dout = rnd(no, -1, 1), *dinp = rnd(ni, -1, 1);
    float *d_dout = dev(dout, no), *d_dinp = dev(dinp, ni);
    mmp_cpu_maxpool2d_bwd(dinp, dout, am, N, C, H, W, OH, OW);
    CHECK_OK(mmp_cuda_maxpool2d_bwd(ctx, d_dinp, d_dout, d_am, N, C, H, W, k, stride, pad, OH, OW));
    check("maxpool dinp", d_dinp, dinp, ni, ATOL);
    release();
}

static void meanpool_case(int use_mask)
{
    const int B = 3, T = 7, C = 33;
    float *inp = rnd((size_t)B * T * C, -1, 1), *out = rnd((size_t)B * C, 0, 0);
    float *mask = NULL, *d_mask = NULL;
    if (use_mask) {
        mask = rnd((size_t)B * T, 0, 0);
        for (int t = 0; t < T; t++) {
            mask[t] = t % 3 != 1;   /* some tokens of sequence 0 are padding */
            mask[T + t] = 1.0f;     /* sequence 1 has none */
            mask[2 * T + t] = 0.0f; /* sequence 2 is all padding: pools to 0 */
        }
        d_mask = dev(mask, (size_t)B * T);
    }
    float *d_inp = dev(inp, (size_t)B * T * C), *d_out = dev(NULL, (size_t)B * C);
    mmp_cpu_meanpool_fwd(out, inp, mask, B, T, C);
    CHECK_OK(mmp_cuda_meanpool_fwd(ctx, d_out, d_inp, d_mask, B, T, C));
    check(use_mask ? "meanpool out (mask)" : "meanpool out", d_out, out, (size_t)B * C, ATOL);

    float *dout = rnd((size_t)B * C, -1, 1), *dinp = rnd((size_t)B * T * C, -1, 1);
    float *d_dout = dev(dout, (size_t)B * C), *d_dinp = dev(dinp, (size_t)B * T * C);
    mmp_cpu_meanpool_bwd(dinp, dout, mask, B, T, C);
    CHECK_OK(mmp_cuda_meanpool_bwd(ctx, d_dinp, d_dout, d_mask, B, T, C));
    check(use_mask ? "meanpool dinp (mask)" : "meanpool dinp", d_dinp, dinp, (size_t)B * T * C,
          ATOL);
    release();
}

static void test_pool(void)
{
    maxpool_case(3, 2, 1); /* overlapping windows, as the ResNet stem */
    maxpool_case(2, 2, 0);
    meanpool_case(1);
    meanpool_case(0);
}

/* ---- layer norm ---------------------------------------------------------------- */

static void layernorm_case(int N, int C)
{
    const size_t n = (size_t)N * C;
    const float eps = 1e-5f;
    float *inp = rnd(n, -2, 2), *w = rnd(C, 0.5f, 1.5f), *b = rnd(C, -1, 1);
    float *out = rnd(n, 0, 0), *mean = rnd(N, 0, 0), *rstd = rnd(N, 0, 0);
    float *d_inp = dev(inp, n), *d_w = dev(w, C), *d_b = dev(b, C);
    float *d_out = dev(NULL, n), *d_mean = dev(NULL, N), *d_rstd = dev(NULL, N);
    mmp_cpu_layernorm_fwd(out, mean, rstd, inp, w, b, N, C, eps);
    CHECK_OK(mmp_cuda_layernorm_fwd(ctx, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, eps));
    check("layernorm out", d_out, out, n, ATOL);
    check("layernorm mean", d_mean, mean, N, ATOL);
    check("layernorm rstd", d_rstd, rstd, N, ATOL);

    float *dout = rnd(n, -1, 1);
    float *dinp = rnd(n, -1, 1), *dw = rnd(C, -1, 1), *db = rnd(C, -1, 1);
    float *d_dout = dev(dout, n), *d_dinp = dev(dinp, n), *d_dw = dev(dw, C), *d_db = dev(db, C);
    float *d_cmean = dev(mean, N), *d_crstd = dev(rstd, N);
    mmp_cpu_layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    CHECK_OK(mmp_cuda_layernorm_bwd(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_cmean, d_crstd,
                                    N, C));
    check("layernorm dinp", d_dinp, dinp, n, ATOL);
    check("layernorm dw", d_dw, dw, C, ATOL);
    check("layernorm db", d_db, db, C, ATOL);
    mmp_cpu_layernorm_bwd(dinp, NULL, NULL, dout, inp, w, mean, rstd, N, C);
    CHECK_OK(mmp_cuda_layernorm_bwd(ctx, d_dinp, NULL, NULL, d_dout, d_inp, d_w, d_cmean, d_crstd,
                                    N, C));
    check("layernorm dinp (again, dw db NULL)", d_dinp, dinp, n, ATOL);
    check("layernorm dw (untouched)", d_dw, dw, C, ATOL);
    release();
}

static void test_layernorm(void)
{
    layernorm_case(19, 80); /* C not a multiple of 32, N not of the rows per block */
    layernorm_case(6, 768);
}

/* ---- embedding ------------------------------------------------------------------- */

static void test_embedding(void)
{
    const int B = 3, T = 6, C = 40, V = 7, P = T + 2; /* V < B*T: ids repeat */
    const size_t n = (size_t)B * T * C;
    int32_t *ids = host_alloc(sizeof(int32_t) * B * T);
    float *u = rnd((size_t)B * T, 0, 1);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(u[i] * V) % V;
    }
    float *wte = rnd((size_t)V * C, -1, 1), *wpe = rnd((size_t)P * C, -1, 1), *out = rnd(n, 0, 0);
    int32_t *d_ids = dev_bytes(ids, sizeof(int32_t) * B * T);
    float *d_wte = dev(wte, (size_t)V * C), *d_wpe = dev(wpe, (size_t)P * C);
    float *d_out = dev(NULL, n);
    mmp_cpu_embedding_fwd(out, ids, wte, wpe, B, T, C);
    CHECK_OK(mmp_cuda_embedding_fwd(ctx, d_out, d_ids, d_wte, d_wpe, B, T, C));
    check("embedding out", d_out, out, n, 0.0);
    mmp_cpu_embedding_fwd(out, ids, wte, NULL, B, T, C);
    CHECK_OK(mmp_cuda_embedding_fwd(ctx, d_out, d_ids, d_wte, NULL, B, T, C));
    check("embedding out (no wpe)", d_out, out, n, 0.0);

    float *dout = rnd(n, -1, 1);
    float *dwte = rnd((size_t)V * C, -1, 1), *dwpe = rnd((size_t)P * C, -1, 1);
    float *d_dout = dev(dout, n), *d_dwte = dev(dwte, (size_t)V * C);
    float *d_dwpe = dev(dwpe, (size_t)P * C);
    mmp_cpu_embedding_bwd(dwte, dwpe, dout, ids, B, T, C);
    CHECK_OK(mmp_cuda_embedding_bwd(ctx, d_dwte, d_dwpe, d_dout, d_ids, B, T, C));
    check("embedding dwte", d_dwte, dwte, (size_t)V * C, ATOL);
    check("embedding dwpe", d_dwpe, dwpe, (size_t)P * C, ATOL);
    mmp_cpu_embedding_bwd(NULL, dwpe, dout, ids, B, T, C);
    CHECK_OK(mmp_cuda_embedding_bwd(ctx, NULL, d_dwpe, d_dout, d_ids, B, T, C));
    check("embedding dwpe (again, dwte NULL)", d_dwpe, dwpe, (size_t)P * C, ATOL);
    check("embedding dwte (untouched)", d_dwte, dwte, (size_t)V * C, ATOL);
    release();
}

/* ---- attention -------------------------------------------------------------------- */

static void attention_case(int B, int Tq, int Tk, int C, int NH, int use_mask)
{
    const size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C;
    const size_t na = (size_t)B * NH * Tq * Tk;
    char label[128];
    float *q = rnd(nq, -1, 1), *k = rnd(nk, -1, 1), *v = rnd(nk, -1, 1);
    float *out = rnd(nq, 0, 0), *att = rnd(na, 0, 0);
    float *mask = NULL, *d_mask = NULL;
    if (use_mask) {
        mask = rnd((size_t)B * Tk, 0, 0);
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < Tk; j++) {
                /* the last sequence is all padding: its queries output 0 */
                mask[(size_t)b * Tk + j] = b == B - 1 ? 0.0f : (float)((j + b) % 3 != 2);
            }
        }
        d_mask = dev(mask, (size_t)B * Tk);
    }
    float *d_q = dev(q, nq), *d_k = dev(k, nk), *d_v = dev(v, nk);
    float *d_out = dev(NULL, nq), *d_att = dev(NULL, na);
    mmp_cpu_attention_fwd(out, att, q, k, v, mask, B, Tq, Tk, C, NH, 0);
    CHECK_OK(mmp_cuda_attention_fwd(ctx, d_out, d_att, d_q, d_k, d_v, d_mask, B, Tq, Tk, C, NH, 0));
    snprintf(label, sizeof label, "attention B%d Tq%d Tk%d C%d NH%d mask%d", B, Tq, Tk, C, NH,
             use_mask);
    check(label, d_out, out, nq, ATOL);
    check("attention att", d_att, att, na, ATOL);

    float *dout = rnd(nq, -1, 1);
    float *dq = rnd(nq, -1, 1), *dk = rnd(nk, -1, 1), *dv = rnd(nk, -1, 1);
    float *d_dout = dev(dout, nq), *d_dq = dev(dq, nq), *d_dk = dev(dk, nk), *d_dv = dev(dv, nk);
    float *d_catt = dev(att, na);
    mmp_cpu_attention_bwd(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH, 0);
    CHECK_OK(mmp_cuda_attention_bwd(ctx, d_dq, d_dk, d_dv, d_dout, d_catt, d_q, d_k, d_v, B, Tq, Tk,
                                    C, NH, 0));
    check("attention dq", d_dq, dq, nq, ATOL);
    check("attention dk", d_dk, dk, nk, ATOL);
    check("attention dv", d_dv, dv, nk, ATOL);
    mmp_cpu_attention_bwd(NULL, dk, NULL, dout, att, q, k, v, B, Tq, Tk, C, NH, 0);
    CHECK_OK(mmp_cuda_attention_bwd(ctx, NULL, d_dk, NULL, d_dout, d_catt, d_q, d_k, d_v, B, Tq, Tk,
                                    C, NH, 0));
    check("attention dk (again, dq dv NULL)", d_dk, dk, nk, ATOL);
    check("attention dv (untouched)", d_dv, dv, nk, ATOL);
    release();
}

static void test_attention(void)
{
    attention_case(2, 5, 7, 16, 4, 1);  /* cross-attention shapes, B < NH */
    attention_case(3, 9, 9, 24, 3, 0);  /* self-attention */
    attention_case(6, 4, 11, 8, 2, 1);  /* B > NH: the other batching */
    attention_case(1, 3, 40, 64, 1, 0); /* one head, a single GEMM */
}

/* ---- softmax and L2 norm -------------------------------------------------------------- */

static void softmax_case(int rows, int cols)
{
    const size_t n = (size_t)rows * cols;
    float *inp = rnd(n, -5, 5), *out = rnd(n, 0, 0);
    float *d_inp = dev(inp, n), *d_out = dev(NULL, n);
    mmp_cpu_softmax_fwd(out, inp, rows, cols);
    CHECK_OK(mmp_cuda_softmax_fwd(ctx, d_out, d_inp, rows, cols));
    check("softmax out", d_out, out, n, ATOL);
    float *dout = rnd(n, -1, 1), *dinp = rnd(n, -1, 1);
    float *d_dout = dev(dout, n), *d_dinp = dev(dinp, n), *d_cout = dev(out, n);
    mmp_cpu_softmax_bwd(dinp, dout, out, rows, cols);
    CHECK_OK(mmp_cuda_softmax_bwd(ctx, d_dinp, d_dout, d_cout, rows, cols));
    check("softmax dinp", d_dinp, dinp, n, ATOL);
    release();
}

static void test_l2norm(void)
{
    const int N = 9, C = 37;
    const size_t n = (size_t)N * C;
    const float eps = 1e-6f;
    float *inp = rnd(n, -1, 1), *out = rnd(n, 0, 0), *norm = rnd(N, 0, 0);
    memset(inp, 0, sizeof(float) * C); /* row 0 is below eps */
    float *d_inp = dev(inp, n), *d_out = dev(NULL, n), *d_norm = dev(NULL, N);
    mmp_cpu_l2norm_fwd(out, norm, inp, N, C, eps);
    CHECK_OK(mmp_cuda_l2norm_fwd(ctx, d_out, d_norm, d_inp, N, C, eps));
    check("l2norm out", d_out, out, n, ATOL);
    check("l2norm norm", d_norm, norm, N, ATOL);
    float *dout = rnd(n, -1, 1), *dinp = rnd(n, -1, 1);
    float *d_dout = dev(dout, n), *d_dinp = dev(dinp, n);
    float *d_cout = dev(out, n), *d_cnorm = dev(norm, N);
    mmp_cpu_l2norm_bwd(dinp, dout, out, norm, N, C, eps);
    CHECK_OK(mmp_cuda_l2norm_bwd(ctx, d_dinp, d_dout, d_cout, d_cnorm, N, C, eps));
    /* row 0's gradient is dout / eps (~1e6): rtol judges it */
    check("l2norm dinp", d_dinp, dinp, n, ATOL);
    release();
}

/* ---- losses ------------------------------------------------------------------------------ */

static void test_infonce(void)
{
    const int B = 16, C = 32;
    const float logit_scale = 2.3025851f; /* exp = 10 */
    float *img = rnd((size_t)B * C, -0.3f, 0.3f), *txt = rnd((size_t)B * C, -0.3f, 0.3f);
    float *sim = rnd((size_t)B * B, 0, 0), *p_i2t = rnd((size_t)B * B, 0, 0);
    float *p_t2i = rnd((size_t)B * B, 0, 0);
    float *d_img = dev(img, (size_t)B * C), *d_txt = dev(txt, (size_t)B * C);
    float *d_sim = dev(NULL, (size_t)B * B), *d_p_i2t = dev(NULL, (size_t)B * B);
    float *d_p_t2i = dev(NULL, (size_t)B * B);
    float loss = mmp_cpu_infonce_fwd(sim, p_i2t, p_t2i, img, txt, logit_scale, B, C);
    float loss_gpu = -1.0f;
    CHECK_OK(mmp_cuda_infonce_fwd(ctx, &loss_gpu, d_sim, d_p_i2t, d_p_t2i, d_img, d_txt,
                                  logit_scale, B, C));
    CHECK_CLOSE("infonce loss", &loss_gpu, &loss, 1, ATOL, RTOL);
    check("infonce sim", d_sim, sim, (size_t)B * B, ATOL);
    check("infonce p_i2t", d_p_i2t, p_i2t, (size_t)B * B, ATOL);
    check("infonce p_t2i", d_p_t2i, p_t2i, (size_t)B * B, ATOL);

    const float dloss = 1.3f;
    float *dimg = rnd((size_t)B * C, -1, 1), *dtxt = rnd((size_t)B * C, -1, 1);
    float *dls = rnd(1, -1, 1);
    float *d_dimg = dev(dimg, (size_t)B * C), *d_dtxt = dev(dtxt, (size_t)B * C);
    float *d_dls = dev(dls, 1);
    float *d_csim = dev(sim, (size_t)B * B), *d_cp_i2t = dev(p_i2t, (size_t)B * B);
    float *d_cp_t2i = dev(p_t2i, (size_t)B * B);
    mmp_cpu_infonce_bwd(dimg, dtxt, dls, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    CHECK_OK(mmp_cuda_infonce_bwd(ctx, d_dimg, d_dtxt, d_dls, d_csim, d_cp_i2t, d_cp_t2i, d_img,
                                  d_txt, logit_scale, dloss, B, C));
    check("infonce dimg", d_dimg, dimg, (size_t)B * C, ATOL);
    check("infonce dtxt", d_dtxt, dtxt, (size_t)B * C, ATOL);
    check("infonce dlogit_scale", d_dls, dls, 1, ATOL);
    mmp_cpu_infonce_bwd(dimg, NULL, NULL, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss, B, C);
    CHECK_OK(mmp_cuda_infonce_bwd(ctx, d_dimg, NULL, NULL, d_csim, d_cp_i2t, d_cp_t2i, d_img, d_txt,
                                  logit_scale, dloss, B, C));
    check("infonce dimg (again, dtxt dlogit_scale NULL)", d_dimg, dimg, (size_t)B * C, ATOL);
    check("infonce dlogit_scale (untouched)", d_dls, dls, 1, ATOL);
    release();
}

static void test_bce(void)
{
    const int n = 37;
    float *logits = rnd(n, -6, 6), *labels = rnd(n, 0, 1);
    for (int i = 0; i < n; i++) {
        labels[i] = labels[i] < 0.5f ? 0.0f : 1.0f;
    }
    float *d_logits = dev(logits, n), *d_labels = dev(labels, n);
    float loss = mmp_cpu_bce_fwd(logits, labels, n), loss_gpu = -1.0f;
    CHECK_OK(mmp_cuda_bce_fwd(ctx, &loss_gpu, d_logits, d_labels, n));
    CHECK_CLOSE("bce loss", &loss_gpu, &loss, 1, ATOL, RTOL);
    float *dlogits = rnd(n, -1, 1);
    float *d_dlogits = dev(dlogits, n);
    mmp_cpu_bce_bwd(dlogits, logits, labels, 0.8f, n);
    CHECK_OK(mmp_cuda_bce_bwd(ctx, d_dlogits, d_logits, d_labels, 0.8f, n));
    check("bce dlogits", d_dlogits, dlogits, n, ATOL);
    release();
}

/* ---- optimizer ------------------------------------------------------------------------------ */

static void test_adamw(void)
{
    const size_t n = 1001;
    float *p = rnd(n, -1, 1), *m = rnd(n, -0.1f, 0.1f), *v = rnd(n, 0, 0.01f);
    float *d_p = dev(p, n), *d_m = dev(m, n), *d_v = dev(v, n);
    for (int t = 1; t <= 3; t++) {
        float *g = rnd(n, -1, 1);
        float *d_g = dev(g, n);
        mmp_cpu_adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, t);
        CHECK_OK(mmp_cuda_adamw(ctx, d_p, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, t));
    }
    check("adamw param", d_p, p, n, ATOL);
    check("adamw m", d_m, m, n, ATOL);
    check("adamw v", d_v, v, n, ATOL);
    release();
}

static void test_sumsq(void)
{
    const size_t sizes[] = {1, 1000, 300007}; /* the last takes every partial block */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        float *x = rnd(n, -1, 1);
        float *d_x = dev(x, n);
        double ref = mmp_cpu_sumsq(x, n), got = -1.0;
        CHECK_OK(mmp_cuda_sumsq(ctx, &got, d_x, n));
        if (fabs(got - ref) > 1e-9 * fabs(ref)) {
            fprintf(stderr, "  sumsq n=%zu: got %.17g want %.17g\n", n, got, ref);
        }
        CHECK(fabs(got - ref) <= 1e-9 * fabs(ref));
        release();
    }
    /* A network's tensors at once (the gradient norm): each sum the bits of
     * its own call, an empty tensor 0, one wait for all of them. */
    const size_t many[] = {1000, 0, 300007, 7};
    enum { N_MANY = sizeof many / sizeof many[0] };
    const float *d_xs[N_MANY];
    double one[N_MANY], got[N_MANY];
    for (int i = 0; i < N_MANY; i++) {
        float *x = rnd(many[i] ? many[i] : 1, -1, 1);
        d_xs[i] = dev(x, many[i] ? many[i] : 1);
        CHECK_OK(mmp_cuda_sumsq(ctx, &one[i], d_xs[i], many[i]));
    }
    CHECK_OK(mmp_cuda_sumsq_many(ctx, got, d_xs, many, N_MANY));
    int same = 1;
    for (int i = 0; i < N_MANY; i++) {
        same &= memcmp(&got[i], &one[i], sizeof got[i]) == 0;
    }
    CHECK(same);
    CHECK(got[1] == 0.0 && got[0] > 0 && got[2] > got[0]);
    release();
}

/* ---- low precision (train.precision) -------------------------------------- */

/* CUDA's round/pack/unpack against the CPU's, bit for bit, NaN included
 * (both sides canonicalise it: kernels/cuda/internal.cuh lp_pack /
 * lp_unpack): random values over many exponents, ties to even, subnormals
 * of both formats, values past fp16's range, +-inf, NaNs of both signs. */
static void test_precision(void)
{
    const size_t n = 4096 + 13;
    float *x = rnd(n, -1, 1);
    for (size_t i = 0; i < 4096; i++) {
        x[i] = ldexpf(x[i], (int)(i % 64) - 40); /* 2^-40 .. 2^23 */
    }
    uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0x00000001u, 0x00400000u, 0x7f7fffffu};
    for (int i = 0; i < 5; i++) {
        memcpy(&x[4096 + i], &ties[i], 4);
    }
    x[4101] = 70000.0f;       /* over fp16's max */
    x[4102] = 65520.0f;       /* fp16's round-to-inf boundary */
    x[4103] = 5.9604645e-08f; /* fp16's smallest subnormal */
    x[4104] = 2.9802322e-08f; /* half of it: a tie to zero */
    x[4105] = INFINITY;
    x[4106] = -INFINITY;
    x[4107] = NAN;
    x[4108] = -NAN;
    for (int prec = 1; prec <= 2; prec++) {
        float *ref = host_alloc(sizeof(float) * n), *got = host_alloc(sizeof(float) * n);
        uint16_t *pref = host_alloc(2 * n), *pgot = host_alloc(2 * n);
        float *back = host_alloc(sizeof(float) * n);
        mmp_cpu_round_lp(ref, x, n, prec);
        mmp_cpu_pack_lp(pref, x, n, prec);
        float *d_x = dev(x, n), *d_r = dev(NULL, n), *d_u = dev(NULL, n);
        void *d_p = dev_bytes(NULL, 2 * n);
        CHECK_OK(mmp_cuda_round_lp(ctx, d_r, d_x, n, prec));
        CHECK_OK(mmp_cuda_pack_lp(ctx, d_p, d_x, n, prec));
        CHECK_OK(mmp_cuda_unpack_lp(ctx, d_u, d_p, n, prec));
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, got, d_r, sizeof(float) * n));
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, pgot, d_p, 2 * n));
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, back, d_u, sizeof(float) * n));
        size_t bad_r = 0, bad_p = 0, bad_u = 0;
        for (size_t i = 0; i < n; i++) {
            const int r = memcmp(&ref[i], &got[i], 4) != 0, p = pref[i] != pgot[i];
            bad_r += r;
            bad_p += p;
            bad_u += memcmp(&ref[i], &back[i], 4) != 0;
            if ((r || p) && bad_r + bad_p < 4) {
                fprintf(stderr, "  %s x[%zu]=%a: cpu %a/%04x, cuda %a/%04x\n",
                        prec == 1 ? "bf16" : "fp16", i, (double)x[i], (double)ref[i], pref[i],
                        (double)got[i], pgot[i]);
            }
        }
        CHECK(bad_r == 0);
        CHECK(bad_p == 0);
        CHECK(bad_u == 0);
    }
    release(); /* after both precisions: x is one of the buffers */
}

/* The conversions' NaN (and every other edge) bit for bit with the CPU's:
 * every 16-bit pattern widened by unpack_lp (fp16 NaNs of any payload and
 * sign to 0x7fffffff, bf16 by the shift: on sm_90 __bfloat162float is a
 * cvt.f32.bf16 whose NaN the PTX ISA leaves open, so the kernels shift
 * themselves), and fp32 NaNs of both signs, quiet and signalling, many
 * payloads, narrowed by pack_lp and round_lp (all to 0x7fff). */
static void test_precision_nan(void)
{
    const size_t n16 = 65536, nn = 256;
    uint16_t *all = host_alloc(2 * n16);
    for (size_t i = 0; i < n16; i++) {
        all[i] = (uint16_t)i;
    }
    float *nans = host_alloc(sizeof(float) * nn);
    for (size_t i = 0; i < nn; i++) {
        /* sign, quiet bit, payloads from 1 to all ones */
        uint32_t u = (i & 1 ? 0x80000000u : 0) | 0x7f800000u | (i & 2 ? 0x400000u : 0) |
                     (uint32_t)(((i >> 2) * 0x2c9277u) % 0x3fffffu) | 1u;
        memcpy(&nans[i], &u, 4);
    }
    void *d_all = dev_bytes(all, 2 * n16);
    float *d_n = dev(nans, nn), *d_w = dev(NULL, n16), *d_r = dev(NULL, nn);
    void *d_p = dev_bytes(NULL, 2 * nn);
    for (int prec = 1; prec <= 2; prec++) {
        const char *name = prec == 1 ? "bf16" : "fp16";
        float *wref = host_alloc(sizeof(float) * n16), *rref = host_alloc(sizeof(float) * nn);
        uint16_t *pref = host_alloc(2 * nn);
        mmp_cpu_unpack_lp(wref, all, n16, prec);
        mmp_cpu_pack_lp(pref, nans, nn, prec);
        mmp_cpu_round_lp(rref, nans, nn, prec);
        CHECK(pref[0] == 0x7fff && pref[nn - 1] == 0x7fff);
        CHECK_OK(mmp_cuda_unpack_lp(ctx, d_w, d_all, n16, prec));
        CHECK_OK(mmp_cuda_pack_lp(ctx, d_p, d_n, nn, prec));
        CHECK_OK(mmp_cuda_round_lp(ctx, d_r, d_n, nn, prec));
        float *w = host_alloc(sizeof(float) * n16), *r = host_alloc(sizeof(float) * nn);
        uint16_t *p = host_alloc(2 * nn);
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, w, d_w, sizeof(float) * n16));
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, p, d_p, 2 * nn));
        CHECK_OK(mmp_cuda_memcpy_d2h(ctx, r, d_r, sizeof(float) * nn));
        size_t bad_w = 0, bad_p = 0, bad_r = 0;
        for (size_t i = 0; i < n16; i++) {
            if (memcmp(&w[i], &wref[i], 4) != 0 && bad_w++ < 3) {
                uint32_t a, b;
                memcpy(&a, &w[i], 4);
                memcpy(&b, &wref[i], 4);
                fprintf(stderr, "  %s unpack %04zx: cuda %08x, cpu %08x\n", name, i, a, b);
            }
        }
        for (size_t i = 0; i < nn; i++) {
            uint32_t u;
            memcpy(&u, &nans[i], 4);
            if (p[i] != pref[i] && bad_p++ < 3) {
                fprintf(stderr, "  %s pack %08x: cuda %04x, cpu %04x\n", name, u, p[i], pref[i]);
            }
            bad_r += memcmp(&r[i], &rref[i], 4) != 0;
        }
        CHECK(bad_w == 0);
        CHECK(bad_p == 0);
        CHECK(bad_r == 0);
    }
    release();
}

static void test_softmax(void)
{
    softmax_case(13, 50);
    softmax_case(7, 3);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_context),
    MMP_TEST_CASE(test_gemm),
    MMP_TEST_CASE(test_linear),
    MMP_TEST_CASE(test_conv),
    MMP_TEST_CASE(test_batchnorm),
    MMP_TEST_CASE(test_elementwise),
    MMP_TEST_CASE(test_pool),
    MMP_TEST_CASE(test_layernorm),
    MMP_TEST_CASE(test_embedding),
    MMP_TEST_CASE(test_attention),
    MMP_TEST_CASE(test_softmax),
    MMP_TEST_CASE(test_l2norm),
    MMP_TEST_CASE(test_infonce),
    MMP_TEST_CASE(test_bce),
    MMP_TEST_CASE(test_adamw),
    MMP_TEST_CASE(test_sumsq),
    MMP_TEST_CASE(test_precision),
    MMP_TEST_CASE(test_precision_nan),
    MMP_TEST_CASE(test_arena_upload),
    MMP_TEST_CASE(test_transpose_f64),
    MMP_TEST_CASE(test_backend_set_ops),
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
    mmp_cuda_ctx_destroy(ctx);
    return rc;
}

#endif
