/* Elementwise ops on the CPU: ReLU, GELU (tanh approximation), add, scale. */
#include "kernels/cpu.h"
#include "kernels/pointwise.h"

#include <math.h>

void mmp_cpu_relu_fwd(float *out, const float *inp, size_t n)
{
    // out (n), inp (n); out may alias inp
    for (size_t i = 0; i < n; i++) {
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    }
}

void mmp_cpu_relu_bwd(float *dinp, const float *dout, const float *out, size_t n)
{
    // dinp (n), dout (n), out (n): the forward's output
    for (size_t i = 0; i < n; i++) {
        if (out[i] > 0.0f) {
            dinp[i] += dout[i];
        }
    }
}

void mmp_cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
    // out (n), inp (n)
    for (size_t i = 0; i < n; i++) {
        out[i] = mmp_gelu(inp[i]);
    }
}

void mmp_cpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n)
{
    // dinp (n), dout (n), inp (n)
    for (size_t i = 0; i < n; i++) {
        dinp[i] += mmp_gelu_grad(inp[i]) * dout[i];
    }
}

void mmp_cpu_add(float *out, const float *a, const float *b, size_t n)
{
    // out (n), a (n), b (n); out may alias a or b
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
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

void mmp_cpu_acc_f64(double *restrict acc, const float *restrict x, size_t n)
{
    // acc (n), x (n)
    for (size_t i = 0; i < n; i++) {
        acc[i] += x[i];
    }
}

void mmp_cpu_round_f64(float *restrict x, const double *restrict acc, size_t n)
{
    // x (n), acc (n)
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)acc[i];
    }
}
