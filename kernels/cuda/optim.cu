/* Optimizer arithmetic: the AdamW update and the sum of squares behind the
 * global gradient norm (in double, in an order fixed by n alone, so a
 * tensor's share of the norm is the same on every run). */
#include "kernels/cuda/internal.cuh"

#define SUMSQ_MAX_BLOCKS 1024

static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float bc1, float bc2)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

/* partial[block] = this block's share of sum x^2. */
static __global__ void sumsq_partial_kernel(double *partial, const float *x, size_t n)
{
    double sum = 0.0;
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        sum += (double)x[i] * x[i];
    }
    sum = block_reduce(sum, sum_op());
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
    }
}

/* *out = sum of partial (count). One block. */
static __global__ void sumsq_final_kernel(double *out, const double *partial, int count)
{
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        sum += partial[i];
    }
    sum = block_reduce(sum, sum_op());
    if (threadIdx.x == 0) {
        *out = sum;
    }
}

mmp_err mmp_cuda_adamw(mmp_cuda_ctx *ctx, float *param, const float *grad, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                       int t)
{
    // param (n), grad (n), m (n), v (n); t >= 1
    ARG_CHECK(t >= 1);
    if (n == 0) {
        return MMP_OK;
    }
    /* bias corrections on the host, in float, as the CPU computes them */
    const float bc1 = 1.0f - powf(beta1, (float)t);
    const float bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(param, grad, m, v, n, lr, beta1,
                                                                beta2, eps, weight_decay, bc1, bc2);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_sumsq_many(mmp_cuda_ctx *ctx, double *out, const float *const *x, const size_t *n,
                            int count)
{
    // x[i] (n[i]); out[i] on the host, one copy for all
    ARG_CHECK(out != NULL && count >= 0 && (count == 0 || (x != NULL && n != NULL)));
    if (count == 0) {
        return MMP_OK;
    }
    void *ws;
    const size_t partial_bytes = ws_align(sizeof(double) * SUMSQ_MAX_BLOCKS);
    MMP_TRY(mmp_cuda_ws_get(ctx, partial_bytes + sizeof(double) * (size_t)count, &ws));
    double *partial = (double *)ws; /* reused by each: the stream orders them */
    double *d_out = (double *)((char *)ws + partial_bytes);
    for (int i = 0; i < count; i++) {
        if (n[i] == 0) {
            MMP_TRY(mmp_cuda_memset(ctx, d_out + i, 0, sizeof(double)));
            continue;
        }
        unsigned blocks = grid_for(n[i], BLOCK);
        if (blocks > SUMSQ_MAX_BLOCKS) {
            blocks = SUMSQ_MAX_BLOCKS;
        }
        sumsq_partial_kernel<<<blocks, BLOCK, 0, ctx->stream>>>(partial, x[i], n[i]);
        LAUNCH_CHECK();
        sumsq_final_kernel<<<1, SUMSQ_MAX_BLOCKS, 0, ctx->stream>>>(d_out + i, partial,
                                                                    (int)blocks);
        LAUNCH_CHECK();
    }
    return mmp_cuda_memcpy_d2h(ctx, out, d_out, sizeof(double) * (size_t)count);
}

mmp_err mmp_cuda_sumsq(mmp_cuda_ctx *ctx, double *out, const float *x, size_t n)
{
    return mmp_cuda_sumsq_many(ctx, out, &x, &n, 1);
}
