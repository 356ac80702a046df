/* Row softmax and row L2 normalisation: a warp per row, as the rows here
 * (attention keys, a batch of embeddings) are at most a few thousand wide. */
#include "kernels/cuda/internal.cuh"

static __global__ void softmax_fwd_kernel(float *out, const float *inp, int rows, int cols)
{
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    warp_softmax_row(out + (size_t)row * cols, inp + (size_t)row * cols, NULL, cols);
}

static __global__ void softmax_bwd_kernel(float *dinp, const float *dout, const float *out,
                                          int rows, int cols)
{
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP;
    const float *dy = dout + (size_t)row * cols;
    const float *y = out + (size_t)row * cols;
    float *dx = dinp + (size_t)row * cols;
    const float s = warp_dot<float>(dy, y, cols);
    for (int c = lane; c < cols; c += WARP) {
        dx[c] += y[c] * (dy[c] - s);
    }
}

static __global__ void l2norm_fwd_kernel(float *out, float *norm, const float *inp, int N, int C,
                                         float eps)
{
    const int row = warp_row(N);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP;
    const float *x = inp + (size_t)row * C;
    float *y = out + (size_t)row * C;
    const float nrm = (float)sqrt(warp_dot<double>(x, x, C));
    const float inv = 1.0f / (nrm > eps ? nrm : eps);
    for (int i = lane; i < C; i += WARP) {
        y[i] = x[i] * inv;
    }
    if (lane == 0) {
        norm[row] = nrm;
    }
}

static __global__ void l2norm_bwd_kernel(float *dinp, const float *dout, const float *out,
                                         const float *norm, int N, int C, float eps)
{
    const int row = warp_row(N);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP;
    const float *dy = dout + (size_t)row * C;
    const float *y = out + (size_t)row * C;
    float *dx = dinp + (size_t)row * C;
    if (!(norm[row] > eps)) {
        /* below eps the op is x / eps, a plain scaling */
        for (int i = lane; i < C; i += WARP) {
            dx[i] += dy[i] / eps;
        }
        return;
    }
    const float d = (float)warp_dot<double>(dy, y, C);
    const float inv = 1.0f / norm[row];
    for (int i = lane; i < C; i += WARP) {
        dx[i] += (dy[i] - y[i] * d) * inv;
    }
}

mmp_err mmp_cuda_softmax_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, int rows, int cols)
{
    // out (rows,cols), inp (rows,cols)
    ARG_CHECK(rows >= 0 && cols >= 0);
    if (rows == 0 || cols == 0) {
        return MMP_OK;
    }
    softmax_fwd_kernel<<<row_blocks(rows), BLOCK, 0, ctx->stream>>>(out, inp, rows, cols);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_softmax_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                             int rows, int cols)
{
    // dinp (rows,cols), dout (rows,cols), out (rows,cols)
    ARG_CHECK(rows >= 0 && cols >= 0);
    if (rows == 0 || cols == 0) {
        return MMP_OK;
    }
    softmax_bwd_kernel<<<row_blocks(rows), BLOCK, 0, ctx->stream>>>(dinp, dout, out, rows, cols);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_l2norm_fwd(mmp_cuda_ctx *ctx, float *out, float *norm, const float *inp, int N,
                            int C, float eps)
{
    // out (N,C), norm (N), inp (N,C)
    ARG_CHECK(N >= 0 && C >= 0);
    if (N == 0) {
        return MMP_OK;
    }
    l2norm_fwd_kernel<<<row_blocks(N), BLOCK, 0, ctx->stream>>>(out, norm, inp, N, C, eps);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_l2norm_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                            const float *norm, int N, int C, float eps)
{
    // dinp (N,C), dout (N,C), out (N,C), norm (N)
    ARG_CHECK(N >= 0 && C >= 0);
    if (N == 0) {
        return MMP_OK;
    }
    l2norm_bwd_kernel<<<row_blocks(N), BLOCK, 0, ctx->stream>>>(dinp, dout, out, norm, N, C, eps);
    LAUNCH_CHECK();
    return MMP_OK;
}
