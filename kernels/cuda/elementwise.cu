/* Elementwise ops: ReLU, GELU (tanh approximation), add, scale, transpose,
 * the double gradient accumulator.
 * Grid-stride loops over size_t n; the formulas are the CPU reference's. */
#include "kernels/cuda/internal.cuh"
#include "kernels/pointwise.h"

static __global__ void relu_fwd_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    }
}

static __global__ void relu_bwd_kernel(float *dinp, const float *dout, const float *out, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        if (out[i] > 0.0f) {
            dinp[i] += dout[i];
        }
    }
}

static __global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        out[i] = mmp_gelu(inp[i]);
    }
}

static __global__ void gelu_bwd_kernel(float *dinp, const float *dout, const float *inp, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        dinp[i] += mmp_gelu_grad(inp[i]) * dout[i];
    }
}

static __global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        out[i] = a[i] + b[i];
    }
}

static __global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        x[i] *= s;
    }
}

mmp_err mmp_cuda_relu_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, size_t n)
{
    // out (n), inp (n); out may alias inp
    return launch_grid(ctx, relu_fwd_kernel, n, out, inp, n);
}

mmp_err mmp_cuda_relu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                          size_t n)
{
    // dinp (n), dout (n), out (n): the forward's output
    return launch_grid(ctx, relu_bwd_kernel, n, dinp, dout, out, n);
}

mmp_err mmp_cuda_gelu_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, size_t n)
{
    // out (n), inp (n)
    return launch_grid(ctx, gelu_fwd_kernel, n, out, inp, n);
}

mmp_err mmp_cuda_gelu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *inp,
                          size_t n)
{
    // dinp (n), dout (n), inp (n)
    return launch_grid(ctx, gelu_bwd_kernel, n, dinp, dout, inp, n);
}

mmp_err mmp_cuda_add(mmp_cuda_ctx *ctx, float *out, const float *a, const float *b, size_t n)
{
    // out (n), a (n), b (n); out may alias a or b
    return launch_grid(ctx, add_kernel, n, out, a, b, n);
}

mmp_err mmp_cuda_scale(mmp_cuda_ctx *ctx, float *x, float s, size_t n)
{
    // x (n)
    return launch_grid(ctx, scale_kernel, n, x, s, n);
}

/* One thread per output element (b, c, r) reads inp (b, r, c): writes are
 * coalesced, every output has one writer, accumulate adds once. */
static __global__ void transpose_kernel(float *out, const float *inp, int B, int R, int C,
                                        int accumulate)
{
    const size_t total = (size_t)B * R * C;
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        const size_t b = i / ((size_t)C * R);
        const int c = (int)(i / R % C), r = (int)(i % R);
        const float v = inp[(b * R + r) * C + c];
        out[i] = accumulate ? out[i] + v : v;
    }
}

static __global__ void acc_f64_kernel(double *acc, const float *x, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        acc[i] += (double)x[i];
    }
}

static __global__ void round_f64_kernel(float *x, const double *acc, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        x[i] = (float)acc[i];
    }
}

mmp_err mmp_cuda_transpose(mmp_cuda_ctx *ctx, float *out, const float *inp, int B, int R, int C,
                           int accumulate)
{
    // out (B,C,R), inp (B,R,C)
    ARG_CHECK(B >= 0 && R >= 0 && C >= 0);
    size_t total = (size_t)B * R * C;
    return launch_grid(ctx, transpose_kernel, total, out, inp, B, R, C, accumulate);
}

mmp_err mmp_cuda_acc_f64(mmp_cuda_ctx *ctx, double *acc, const float *x, size_t n)
{
    // acc (n), x (n)
    return launch_grid(ctx, acc_f64_kernel, n, acc, x, n);
}

mmp_err mmp_cuda_round_f64(mmp_cuda_ctx *ctx, float *x, const double *acc, size_t n)
{
    // x (n), acc (n)
    return launch_grid(ctx, round_f64_kernel, n, x, acc, n);
}
