/* The index math of the bf16/fp16 convolutions (kernels/cuda/conv_lp.cu,
 * through kernels/cuda/conv_lp_index.cuh: the im2col placement, the packing
 * of a tensor "as it is", the gather col2im) run on the CPU and held to the
 * CPU's fp32 convolution (kernels/cpu.h, the spec), so that a wrong index
 * shows here and not on a rare GPU. Runs without a GPU, in CUDA builds only
 * (nvcc compiles the helpers for the host); the device's own run is
 * gpu_gemm_lp's conv cases. For each shape (odd sizes, strides, padding
 * wider than the kernel's reach, even and 1x1 kernels, non-square planes):
 *  - im2col per image (conv2d_fwd_lp's layout, ld past P): every (n, r, p)
 *    written once, padding read as 0; out_n = w @ col_n (in double) = the
 *    CPU's forward;
 *  - dout packed "as it is" (conv_lp_plain) and the input's im2col merged
 *    over the images (conv2d_bwd_lp's dw layout): dw = dout @ col^T and
 *    db = the rows' sums = the CPU's;
 *  - dcol_n = w^T @ dout_n, then the gather col2im = the CPU's dinp.
 * Tolerance: |got - cpu| <= 1e-5 * (the sum of the terms' magnitudes) +
 * 1e-6 (both are fp32-or-better sums of the same terms). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/conv_lp_index.cuh"

extern "C" {
#include "kernels/cpu.h"
}

static size_t checks, failed;

static void check(int ok, const char *what, const mmp_conv_shape *s)
{
    checks++;
    if (!ok && failed++ < 10) {
        fprintf(stderr, "  (%d,%d,%d,%d) k%dx%d s%d p%d -> %d: %s\n", s->N, s->C, s->H, s->W, s->KH,
                s->KW, s->stride, s->pad, s->OC, what);
    }
}

static unsigned long long rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *floats(size_t n, int random)
{
    float *x = (float *)calloc(n ? n : 1, sizeof(float));
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; random && i < n; i++) {
        x[i] = frand();
    }
    return x;
}

/* got (n) against the CPU's ref, with the terms' magnitudes mag. */
static int close_all(const double *got, const double *mag, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6)) {
            fprintf(stderr, "  [%zu]: %.9g, the CPU's %.9g\n", i, got[i], (double)ref[i]);
            return 0;
        }
    }
    return 1;
}

/* The im2col matrix of t from x, as the kernel places it (n_stride, ld),
 * into col (NaN where nothing is placed); 0 when a place is hit twice or
 * falls outside cap. */
static int place(const mmp_conv_shape &t, const float *x, long long n_stride, int ld, double *col,
                 size_t cap)
{
    const size_t total = (size_t)t.N * t.C * t.KH * t.KW * t.OH * t.OW;
    for (size_t j = 0; j < cap; j++) {
        col[j] = NAN;
    }
    for (size_t i = 0; i < total; i++) {
        size_t at;
        const long long src = conv_lp_im2col_at(t, i, n_stride, ld, &at);
        if (at >= cap || !isnan(col[at])) {
            return 0;
        }
        col[at] = src >= 0 ? (double)x[src] : 0.0;
    }
    return 1;
}

static void conv_case(int N, int C, int H, int W, int OC, int k, int stride, int pad)
{
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, N, C, H, W, OC, k, k, stride, pad);
    const int P = s.OH * s.OW, CKK = C * k * k;
    const size_t ni = (size_t)N * C * H * W, nw = (size_t)OC * CKK, no = (size_t)N * OC * P;
    float *inp = floats(ni, 1), *w = floats(nw, 1), *dout = floats(no, 1);
    float *out = floats(no, 0), *dinp = floats(ni, 0), *dw = floats(nw, 0), *db = floats(OC, 0);
    mmp_cpu_conv2d_fwd(out, inp, w, NULL, &s, NULL);
    mmp_cpu_conv2d_bwd(dinp, dw, db, dout, inp, w, &s, NULL);

    /* forward: per image, rows of ld = P + 5 (as lp_ld pads them) */
    const int ld = P + 5;
    const long long n_stride = (long long)CKK * ld;
    const size_t cap = (size_t)N * n_stride;
    double *col = (double *)malloc(cap * sizeof(double));
    double *got = (double *)malloc((no > nw ? no : nw) * sizeof(double) + ni * sizeof(double));
    double *mag = (double *)malloc((no > nw ? no : nw) * sizeof(double) + ni * sizeof(double));
    check(place(s, inp, n_stride, ld, col, cap), "im2col: a place hit twice or out of range", &s);
    for (int n = 0; n < N; n++) {
        for (int oc = 0; oc < OC; oc++) {
            for (int p = 0; p < P; p++) {
                double acc = 0, m = 0;
                for (int r = 0; r < CKK; r++) {
                    const double t =
                        (double)w[(size_t)oc * CKK + r] * col[n * n_stride + r * ld + p];
                    acc += t;
                    m += fabs(t);
                }
                got[((size_t)n * OC + oc) * P + p] = acc;
                mag[((size_t)n * OC + oc) * P + p] = m;
            }
        }
    }
    check(close_all(got, mag, out, no), "forward: w @ im2col is not the CPU's conv", &s);

    /* dw and db: dout "as it is" and the input's im2col, both merged */
    const mmp_conv_shape d_shape = conv_lp_plain(N, OC, s.OH, s.OW);
    const int ldm = N * P + 3;
    double *dm = (double *)malloc((size_t)OC * ldm * sizeof(double));
    double *cm = (double *)malloc((size_t)CKK * ldm * sizeof(double));
    check(place(d_shape, dout, P, ldm, dm, (size_t)OC * ldm), "dout as it is: placement", &s);
    check(place(s, inp, P, ldm, cm, (size_t)CKK * ldm), "merged im2col: placement", &s);
    for (int oc = 0; oc < OC; oc++) {
        for (int r = 0; r < CKK; r++) {
            double acc = 0, m = 0;
            for (int j = 0; j < N * P; j++) {
                const double t = dm[(size_t)oc * ldm + j] * cm[(size_t)r * ldm + j];
                acc += t;
                m += fabs(t);
            }
            got[(size_t)oc * CKK + r] = acc;
            mag[(size_t)oc * CKK + r] = m;
        }
    }
    check(close_all(got, mag, dw, nw), "dw: dout @ im2col^T is not the CPU's", &s);
    for (int oc = 0; oc < OC; oc++) {
        double acc = 0, m = 0;
        for (int j = 0; j < N * P; j++) {
            acc += dm[(size_t)oc * ldm + j];
            m += fabs(dm[(size_t)oc * ldm + j]);
        }
        got[oc] = acc;
        mag[oc] = m;
    }
    check(close_all(got, mag, db, (size_t)OC), "db: the rows' sums are not the CPU's", &s);

    /* dinp: dcol_n = w^T @ dout_n in fp32, then the gather */
    float *dcol = floats((size_t)N * CKK * P, 0);
    double *dcol_mag = (double *)calloc((size_t)N * CKK * P, sizeof(double));
    for (int n = 0; n < N; n++) {
        for (int r = 0; r < CKK; r++) {
            for (int p = 0; p < P; p++) {
                double acc = 0, m = 0;
                for (int oc = 0; oc < OC; oc++) {
                    const double t =
                        (double)w[(size_t)oc * CKK + r] * dout[((size_t)n * OC + oc) * P + p];
                    acc += t;
                    m += fabs(t);
                }
                dcol[((size_t)n * CKK + r) * P + p] = (float)acc;
                dcol_mag[((size_t)n * CKK + r) * P + p] = m;
            }
        }
    }
    /* the magnitudes gathered the same way, for the tolerance */
    float *magf = floats((size_t)N * CKK * P, 0);
    for (size_t j = 0; j < (size_t)N * CKK * P; j++) {
        magf[j] = (float)dcol_mag[j];
    }
    for (size_t i = 0; i < ni; i++) {
        got[i] = conv_lp_col2im_sum(dcol, s, i);
        mag[i] = conv_lp_col2im_sum(magf, s, i);
    }
    check(close_all(got, mag, dinp, ni), "dinp: the gather col2im is not the CPU's", &s);

    free(inp), free(w), free(dout), free(out), free(dinp), free(dw), free(db), free(col);
    free(got), free(mag), free(dm), free(cm), free(dcol), free(dcol_mag), free(magf);
}

int main(void)
{
    conv_case(2, 5, 9, 9, 7, 3, 2, 1);    /* odd everything: CKK 45, P 25 */
    conv_case(3, 16, 8, 8, 24, 1, 1, 0);  /* a 1x1 bottleneck convolution */
    conv_case(2, 16, 9, 9, 32, 1, 2, 0);  /* a strided 1x1 projection */
    conv_case(2, 3, 32, 32, 16, 7, 2, 3); /* a stem: CKK 147 */
    conv_case(1, 4, 5, 7, 3, 3, 1, 2);    /* padding wider than a 3x3 needs, H != W */
    conv_case(2, 3, 6, 5, 4, 2, 2, 0);    /* an even kernel */
    conv_case(1, 2, 4, 4, 3, 5, 1, 2);    /* a kernel larger than the plane */
    conv_case(2, 3, 11, 8, 5, 3, 3, 1);   /* stride 3: taps that skip */
    fprintf(stderr, "test_conv_lp_host: %zu checks, %zu failed\n", checks, failed);
    return failed ? 1 : 0;
}
