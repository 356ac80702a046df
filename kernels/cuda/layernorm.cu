/* Layer norm over the last axis: a warp per row for the forward and the
 * input gradient, and a column kernel for the weight and bias gradients
 * (a fixed summation order, no atomics). */
#include "kernels/cuda/internal.cuh"

static __global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C, float eps)
{
    const int row = warp_row(N);
    const int lane = threadIdx.x % WARP;
    if (row < 0) {
        return;
    }
    const float *x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += WARP) {
        sum += x[i];
    }
    const float m = warp_reduce(sum, sum_op()) / C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += WARP) {
        float d = x[i] - m;
        ss += d * d;
    }
    const float rs = 1.0f / sqrtf(warp_reduce(ss, sum_op()) / C + eps);
    float *y = out + (size_t)row * C;
    for (int i = lane; i < C; i += WARP) {
        y[i] = (x[i] - m) * rs * w[i] + b[i];
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

static __global__ void layernorm_bwd_inp_kernel(float *dinp, const float *dout, const float *inp,
                                                const float *w, const float *mean,
                                                const float *rstd, int N, int C)
{
    const int row = warp_row(N);
    const int lane = threadIdx.x % WARP;
    if (row < 0) {
        return;
    }
    const float *x = inp + (size_t)row * C;
    const float *dy = dout + (size_t)row * C;
    const float m = mean[row], rs = rstd[row];
    float sum_dn = 0.0f, sum_dn_xhat = 0.0f; /* dn = dout * w, the gradient of xhat */
    for (int i = lane; i < C; i += WARP) {
        float dn = dy[i] * w[i];
        sum_dn += dn;
        sum_dn_xhat += dn * ((x[i] - m) * rs);
    }
    const float mean_dn = warp_reduce(sum_dn, sum_op()) / C;
    const float mean_dn_xhat = warp_reduce(sum_dn_xhat, sum_op()) / C;
    float *dx = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += WARP) {
        float xhat = (x[i] - m) * rs;
        dx[i] += rs * (dy[i] * w[i] - mean_dn - xhat * mean_dn_xhat);
    }
}

/* dw (C) += sum_n dout * xhat, db (C) += sum_n dout. A block owns 32 columns
 * and its LN_ROWS rows of threads stride over N; partial sums meet in
 * shared memory in a fixed order. */
#define LN_ROWS 16
static __global__ void layernorm_bwd_param_kernel(float *dw, float *db, const float *dout,
                                                  const float *inp, const float *mean,
                                                  const float *rstd, int N, int C)
{
    __shared__ float part_w[LN_ROWS][WARP + 1];
    __shared__ float part_b[LN_ROWS][WARP + 1];
    const int col = blockIdx.x * WARP + threadIdx.x;
    float acc_w = 0.0f, acc_b = 0.0f;
    if (col < C) {
        for (int n = threadIdx.y; n < N; n += LN_ROWS) {
            size_t idx = (size_t)n * C + col;
            float dy = dout[idx];
            acc_b += dy;
            acc_w += dy * ((inp[idx] - mean[n]) * rstd[n]);
        }
    }
    part_w[threadIdx.y][threadIdx.x] = acc_w;
    part_b[threadIdx.y][threadIdx.x] = acc_b;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        for (int r = 1; r < LN_ROWS; r++) {
            acc_w += part_w[r][threadIdx.x];
            acc_b += part_b[r][threadIdx.x];
        }
        if (dw) {
            dw[col] += acc_w;
        }
        if (db) {
            db[col] += acc_b;
        }
    }
}

mmp_err mmp_cuda_layernorm_fwd(mmp_cuda_ctx *ctx, float *out, float *mean, float *rstd,
                               const float *inp, const float *w, const float *b, int N, int C,
                               float eps)
{
    // out (N,C), mean (N), rstd (N), inp (N,C), w (C), b (C)
    ARG_CHECK(N >= 0 && C > 0);
    if (N == 0) {
        return MMP_OK;
    }
    layernorm_fwd_kernel<<<row_blocks(N), BLOCK, 0, ctx->stream>>>(out, mean, rstd, inp, w, b, N, C,
                                                                   eps);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_layernorm_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C)
{
    // dinp (N,C), dw (C), db (C), dout (N,C), inp (N,C), w (C), mean (N), rstd (N)
    ARG_CHECK(N >= 0 && C > 0);
    if (N == 0) {
        return MMP_OK;
    }
    if (dw || db) {
        dim3 block(WARP, LN_ROWS);
        layernorm_bwd_param_kernel<<<(C + WARP - 1) / WARP, block, 0, ctx->stream>>>(
            dw, db, dout, inp, mean, rstd, N, C);
        LAUNCH_CHECK();
    }
    if (dinp) {
        layernorm_bwd_inp_kernel<<<row_blocks(N), BLOCK, 0, ctx->stream>>>(dinp, dout, inp, w, mean,
                                                                           rstd, N, C);
        LAUNCH_CHECK();
    }
    return MMP_OK;
}
