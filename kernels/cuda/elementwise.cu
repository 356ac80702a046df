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
    if (n == 0) {
        return MMP_OK;
    }
    relu_fwd_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(out, inp, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_relu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                          size_t n)
{
    // dinp (n), dout (n), out (n): the forward's output
    if (n == 0) {
        return MMP_OK;
    }
    relu_bwd_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(dinp, dout, out, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_gelu_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, size_t n)
{
    // out (n), inp (n)
    if (n == 0) {
        return MMP_OK;
    }
    gelu_fwd_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(out, inp, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_gelu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *inp,
                          size_t n)
{
    // dinp (n), dout (n), inp (n)
    if (n == 0) {
        return MMP_OK;
    }
    gelu_bwd_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(dinp, dout, inp, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_add(mmp_cuda_ctx *ctx, float *out, const float *a, const float *b, size_t n)
{
    // out (n), a (n), b (n); out may alias a or b
    if (n == 0) {
        return MMP_OK;
    }
    add_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(out, a, b, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_scale(mmp_cuda_ctx *ctx, float *x, float s, size_t n)
{
    // x (n)
    if (n == 0) {
        return MMP_OK;
    }
    scale_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(x, s, n);
    LAUNCH_CHECK();
    return MMP_OK;
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
    if (total == 0) {
        return MMP_OK;
    }
    transpose_kernel<<<grid_for(total, BLOCK), BLOCK, 0, ctx->stream>>>(out, inp, B, R, C,
                                                                        accumulate);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_acc_f64(mmp_cuda_ctx *ctx, double *acc, const float *x, size_t n)
{
    // acc (n), x (n)
    if (n == 0) {
        return MMP_OK;
    }
    acc_f64_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(acc, x, n);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_round_f64(mmp_cuda_ctx *ctx, float *x, const double *acc, size_t n)
{
    // x (n), acc (n)
    if (n == 0) {
        return MMP_OK;
    }
    round_f64_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(x, acc, n);
    LAUNCH_CHECK();
    return MMP_OK;
}
