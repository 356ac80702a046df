/* Batch norm (per channel over N and HW) with our own kernels rather than
 * cuDNN's, so that the semantics are exactly the CPU reference's: biased
 * variance for normalising, unbiased variance into running_var, momentum
 * r = (1 - m) r + m x, the saved rstd = 1 / sqrt(var + eps), and statistics
 * summed in double.
 *
 * One block per channel. That is little parallelism for a large N*HW with few
 * channels, but a ResNet's channels already fill most of the device and the
 * kernels stay simple and deterministic (fixed reduction order). */
#include "kernels/cuda/internal.cuh"

#define BN_THREADS 512

/* Element j of channel c, j < N*HW, in an (N,C,HW) tensor. */
static __device__ inline size_t bn_index(size_t j, int c, int C, int HW)
{
    size_t n = j / (size_t)HW, i = j % (size_t)HW;
    return (n * C + c) * HW + i;
}

static __global__ void bn_fwd_train_kernel(float *out, float *mean, float *rstd,
                                           float *running_mean, float *running_var,
                                           const float *inp, const float *gamma, const float *beta,
                                           int N, int C, int HW, float eps, float momentum)
{
    const int c = blockIdx.x;
    const size_t count = (size_t)N * HW;
    double sum = 0.0;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
        sum += inp[bn_index(j, c, C, HW)];
    }
    const double m = block_reduce(sum, sum_op()) / (double)count;
    double ss = 0.0;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
        double d = inp[bn_index(j, c, C, HW)] - m;
        ss += d * d;
    }
    const double var = block_reduce(ss, sum_op()) / (double)count;
    const float mf = (float)m;
    const float rs = (float)(1.0 / sqrt(var + eps));
    if (threadIdx.x == 0) {
        mean[c] = mf;
        rstd[c] = rs;
        if (running_mean) {
            /* no fused multiply-add: the host's replay of these updates
             * (replicas, nn/image.c) computes them with two roundings */
            running_mean[c] =
                __fadd_rn(__fmul_rn(1.0f - momentum, running_mean[c]), __fmul_rn(momentum, mf));
        }
        if (running_var) {
            double unbiased = count > 1 ? var * (double)count / (double)(count - 1) : var;
            running_var[c] = __fadd_rn(__fmul_rn(1.0f - momentum, running_var[c]),
                                       __fmul_rn(momentum, (float)unbiased));
        }
    }
    const float g = gamma[c], b = beta[c];
    for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
        size_t idx = bn_index(j, c, C, HW);
        out[idx] = (inp[idx] - mf) * rs * g + b;
    }
}

static __global__ void bn_fwd_infer_kernel(float *out, const float *inp, const float *gamma,
                                           const float *beta, const float *running_mean,
                                           const float *running_var, size_t total, int C, int HW,
                                           float eps)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        int c = (int)((i / HW) % C);
        float rs = 1.0f / sqrtf(running_var[c] + eps);
        out[i] = (inp[i] - running_mean[c]) * rs * gamma[c] + beta[c];
    }
}

static __global__ void bn_bwd_kernel(float *dinp, float *dgamma, float *dbeta, const float *dout,
                                     const float *inp, const float *mean, const float *rstd,
                                     const float *gamma, int N, int C, int HW)
{
    const int c = blockIdx.x;
    const size_t count = (size_t)N * HW;
    const float m = mean[c], rs = rstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
        size_t idx = bn_index(j, c, C, HW);
        float dy = dout[idx];
        sum_dy += dy;
        sum_dy_xhat += dy * ((inp[idx] - m) * rs);
    }
    sum_dy = block_reduce(sum_dy, sum_op());
    sum_dy_xhat = block_reduce(sum_dy_xhat, sum_op());
    if (threadIdx.x == 0) {
        if (dbeta) {
            dbeta[c] += (float)sum_dy;
        }
        if (dgamma) {
            dgamma[c] += (float)sum_dy_xhat;
        }
    }
    if (!dinp) {
        return;
    }
    const float mean_dy = (float)(sum_dy / (double)count);
    const float mean_dy_xhat = (float)(sum_dy_xhat / (double)count);
    const float g = gamma[c] * rs;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
        size_t idx = bn_index(j, c, C, HW);
        float xhat = (inp[idx] - m) * rs;
        dinp[idx] += g * (dout[idx] - mean_dy - xhat * mean_dy_xhat);
    }
}

mmp_err mmp_cuda_batchnorm_fwd_train(mmp_cuda_ctx *ctx, float *out, float *mean, float *rstd,
                                     float *running_mean, float *running_var, const float *inp,
                                     const float *gamma, const float *beta, int N, int C, int HW,
                                     float eps, float momentum)
{
    // out (N,C,HW), mean (C), rstd (C), running_mean (C) or NULL, running_var (C) or NULL,
    // inp (N,C,HW), gamma (C), beta (C)
    ARG_CHECK(N > 0 && C > 0 && HW > 0);
    ARG_CHECK(mean && rstd && gamma && beta);
    bn_fwd_train_kernel<<<C, BN_THREADS, 0, ctx->stream>>>(
        out, mean, rstd, running_mean, running_var, inp, gamma, beta, N, C, HW, eps, momentum);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_batchnorm_fwd_infer(mmp_cuda_ctx *ctx, float *out, const float *inp,
                                     const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var, int N,
                                     int C, int HW, float eps)
{
    // out (N,C,HW), inp (N,C,HW), gamma (C), beta (C), running_mean (C), running_var (C)
    ARG_CHECK(N >= 0 && C > 0 && HW > 0);
    size_t total = (size_t)N * C * HW;
    return launch_grid(ctx, bn_fwd_infer_kernel, total, out, inp, gamma, beta, running_mean,
                       running_var, total, C, HW, eps);
}

mmp_err mmp_cuda_batchnorm_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dgamma, float *dbeta,
                               const float *dout, const float *inp, const float *mean,
                               const float *rstd, const float *gamma, int N, int C, int HW)
{
    // dinp (N,C,HW), dgamma (C), dbeta (C), dout (N,C,HW), inp (N,C,HW),
    // mean (C), rstd (C), gamma (C)
    ARG_CHECK(N > 0 && C > 0 && HW > 0);
    if (!dinp && !dgamma && !dbeta) {
        return MMP_OK;
    }
    bn_bwd_kernel<<<C, BN_THREADS, 0, ctx->stream>>>(dinp, dgamma, dbeta, dout, inp, mean, rstd,
                                                     gamma, N, C, HW);
    LAUNCH_CHECK();
    return MMP_OK;
}
