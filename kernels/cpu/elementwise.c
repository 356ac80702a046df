/* Elementwise ops on the CPU: ReLU, GELU (tanh approximation), add, scale.
 * Every loop here is written so that the compiler vectorises it (no calls,
 * selects instead of branches); the large ones run on the kernels' pool
 * (parallel.h) in ranges of at least EW_GRAIN elements. */
#include "kernels/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/parallel.h"

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_CUBIC 0.044715f
#define EW_GRAIN 16384

/* one op's arrays, for its range function */
typedef struct {
    float *y;
    const float *a, *b;
} ew_args;

MMP_CPU_CLONES static void relu_fwd_range(void *p, size_t lo, size_t hi)
{
    float *out = ((ew_args *)p)->y;
    const float *inp = ((ew_args *)p)->a;
    for (size_t i = lo; i < hi; i++) {
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    }
}

void mmp_cpu_relu_fwd(float *out, const float *inp, size_t n)
{
    // out (n), inp (n); out may alias inp
    ew_args a = {out, inp, NULL};
    mmp_cpu_parallel_for(n, EW_GRAIN, relu_fwd_range, &a);
}

MMP_CPU_CLONES static void relu_bwd_range(void *p, size_t lo, size_t hi)
{
    float *dinp = ((ew_args *)p)->y;
    const float *dout = ((ew_args *)p)->a, *out = ((ew_args *)p)->b;
    for (size_t i = lo; i < hi; i++) {
        /* a select, not a branch, so the loop vectorises; dinp is left
         * untouched (not += 0) where out <= 0, as the branch did */
        float a = dinp[i];
        float sum = a + dout[i];
        dinp[i] = out[i] > 0.0f ? sum : a;
    }
}

void mmp_cpu_relu_bwd(float *dinp, const float *dout, const float *out, size_t n)
{
    // dinp (n), dout (n), out (n): the forward's output
    ew_args a = {dinp, dout, out};
    mmp_cpu_parallel_for(n, EW_GRAIN, relu_bwd_range, &a);
}

MMP_CPU_CLONES static void relu_bwd_set_range(void *p, size_t lo, size_t hi)
{
    float *dinp = ((ew_args *)p)->y;
    const float *dout = ((ew_args *)p)->a, *out = ((ew_args *)p)->b;
    for (size_t i = lo; i < hi; i++) {
        /* relu_bwd_range with a = +0: 0 + dout (not dout: a -0 becomes +0) */
        float sum = 0.0f + dout[i];
        dinp[i] = out[i] > 0.0f ? sum : 0.0f;
    }
}

void mmp_cpu_relu_bwd_set(float *dinp, const float *dout, const float *out, size_t n)
{
    // dinp (n), dout (n), out (n): the forward's output
    ew_args a = {dinp, dout, out};
    mmp_cpu_parallel_for(n, EW_GRAIN, relu_bwd_set_range, &a);
}

/* exp(x) for x clamped to [-60, 60], within 1 ulp of expf (Cephes' expf:
 * x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial for exp(r), 2^n put
 * into the exponent bits). Branch-free and without library calls so that
 * GELU's loops vectorise; tanhf is a scalar call that cost GELU more than
 * the GEMMs around it. The clamp keeps every intermediate, and GELU's
 * x / (1 + exp) for any |x| > 1e-12, clear of denormals (each costs a
 * microcode assist; GCC evaluates the clamped lanes' quotients for every
 * lane). exp(+-60) is 1 / 1e26 from the limits of sigmoid in float. */
static inline float exp_approx(float x)
{
    /* written so that NaN becomes -60 here (no undefined float-to-int
     * conversion below); GELU still returns NaN through its factor x */
    x = x > -60.0f ? x : -60.0f;
    x = x < 60.0f ? x : 60.0f;
    float v = x * 1.44269504088896341f;
    /* round to nearest without floorf (no vector form before SSE4.1):
     * adding and subtracting 1.5 * 2^23 leaves the rounded value (|v| < 2^22) */
    float nf = (v + 12582912.0f) - 12582912.0f;
    float r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)nf + 127) << 23; /* 2^n, n in [-87, 87] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* GELU(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
 * The sigmoid form is what the loops compute: no tanhf call, and no
 * cancellation in 1 + tanh(u) for negative x. The tanhf form is kept in
 * tests/test_kernels_cpu.c as the reference (within 1e-6 of each other). */
MMP_CPU_CLONES static void gelu_fwd_range(void *p, size_t lo, size_t hi)
{
    float *out = ((ew_args *)p)->y;
    const float *inp = ((ew_args *)p)->a;
    for (size_t i = lo; i < hi; i++) {
        float x = inp[i];
        float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
        out[i] = x / (1.0f + exp_approx(-2.0f * u));
    }
}

void mmp_cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
    // out (n), inp (n)
    ew_args a = {out, inp, NULL};
    mmp_cpu_parallel_for(n, EW_GRAIN, gelu_fwd_range, &a);
}

MMP_CPU_CLONES static void gelu_bwd_range(void *p, size_t lo, size_t hi)
{
    float *dinp = ((ew_args *)p)->y;
    const float *dout = ((ew_args *)p)->a, *inp = ((ew_args *)p)->b;
    for (size_t i = lo; i < hi; i++) {
        /* with s = sigmoid(2u) = 0.5 (1 + tanh u): 0.5 (1 - tanh^2 u) = 2 s (1 - s),
         * so d/dx = s + 2 x s (1 - s) du/dx, and 1 - s = e s with e = exp(-2u) */
        float x = inp[i];
        float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
        float e = exp_approx(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float grad = s + 2.0f * x * s * (e * s) * du;
        dinp[i] += grad * dout[i];
    }
}

void mmp_cpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n)
{
    // dinp (n), dout (n), inp (n)
    ew_args a = {dinp, dout, inp};
    mmp_cpu_parallel_for(n, EW_GRAIN, gelu_bwd_range, &a);
}

MMP_CPU_CLONES static void add_range(void *p, size_t lo, size_t hi)
{
    float *out = ((ew_args *)p)->y;
    const float *a = ((ew_args *)p)->a, *b = ((ew_args *)p)->b;
    for (size_t i = lo; i < hi; i++) {
        out[i] = a[i] + b[i];
    }
}

void mmp_cpu_add(float *out, const float *a, const float *b, size_t n)
{
    // out (n), a (n), b (n); out may alias a or b
    ew_args args = {out, a, b};
    mmp_cpu_parallel_for(n, EW_GRAIN, add_range, &args);
}

void mmp_cpu_scale(float *x, float s, size_t n)
{
    // x (n)
    for (size_t i = 0; i < n; i++) {
        x[i] *= s;
    }
}

void mmp_cpu_transpose(float *out, const float *inp, int B, int R, int C, int accumulate)
{
    // out (B,C,R), inp (B,R,C)
    for (int b = 0; b < B; b++) {
        const float *x = inp + (size_t)b * R * C;
        float *y = out + (size_t)b * R * C;
        for (int c = 0; c < C; c++) {
            for (int r = 0; r < R; r++) {
                if (accumulate) {
                    y[(size_t)c * R + r] += x[(size_t)r * C + c];
                } else {
                    y[(size_t)c * R + r] = x[(size_t)r * C + c];
                }
            }
        }
    }
}

typedef struct {
    double *acc;
    float *x;
} f64_args;

MMP_CPU_CLONES static void acc_f64_range(void *p, size_t lo, size_t hi)
{
    double *restrict acc = ((f64_args *)p)->acc;
    const float *restrict x = ((f64_args *)p)->x;
    for (size_t i = lo; i < hi; i++) {
        acc[i] += x[i];
    }
}

void mmp_cpu_acc_f64(double *restrict acc, const float *restrict x, size_t n)
{
    // acc (n), x (n)
    f64_args a = {acc, (float *)x};
    mmp_cpu_parallel_for(n, EW_GRAIN, acc_f64_range, &a);
}

MMP_CPU_CLONES static void round_f64_range(void *p, size_t lo, size_t hi)
{
    const double *restrict acc = ((f64_args *)p)->acc;
    float *restrict x = ((f64_args *)p)->x;
    for (size_t i = lo; i < hi; i++) {
        x[i] = (float)acc[i];
    }
}

void mmp_cpu_round_f64(float *restrict x, const double *restrict acc, size_t n)
{
    // x (n), acc (n)
    f64_args a = {(double *)acc, x};
    mmp_cpu_parallel_for(n, EW_GRAIN, round_f64_range, &a);
}
