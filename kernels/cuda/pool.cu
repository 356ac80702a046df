/* Pooling: 2-D max pool over images (with saved argmax) and a masked mean
 * over the token axis of sequences, as the CPU reference defines them. */
#include "kernels/cuda/internal.cuh"
#include "kernels/pointwise.h"

/* One thread per output. Only real pixels compete (padding never wins), the
 * first maximum in row-major order wins ties, and a window entirely in the
 * padding outputs 0 with argmax -1. */
static __global__ void maxpool_fwd_kernel(float *out, int32_t *argmax, const float *inp,
                                          size_t total, int H, int W, int k, int stride, int pad,
                                          int OH, int OW)
{
    for (size_t o = thread_index(); o < total; o += thread_count()) {
        const size_t plane = o / ((size_t)OH * OW);
        const int oh = (int)(o / OW % OH), ow = (int)(o % OW);
        const float *x = inp + plane * H * W;
        argmax[o] = mmp_maxpool_window(x, H, W, k, stride, pad, oh, ow, &out[o]);
    }
}

/* Windows overlap when stride < k, so several outputs may add to one input.
 * Deterministic, no atomics: one thread per input gathers from the outputs
 * whose windows hold it, in row-major output order, i.e. in the order the
 * CPU reference adds them (it walks the outputs in row-major order), so each
 * input's sum is bitwise the reference's. */
static __global__ void maxpool_bwd_kernel(float *dinp, const float *dout, const int32_t *argmax,
                                          size_t total, int H, int W, int k, int stride, int pad,
                                          int OH, int OW)
{
    for (size_t x = thread_index(); x < total; x += thread_count()) {
        const size_t plane = x / ((size_t)H * W);
        const int ih = (int)(x / W % H), iw = (int)(x % W);
        const int32_t me = ih * W + iw;
        /* outputs o with o * stride - pad <= i <= o * stride - pad + k - 1 */
        int oh0 = ih + pad - k + 1, ow0 = iw + pad - k + 1;
        oh0 = oh0 <= 0 ? 0 : (oh0 + stride - 1) / stride;
        ow0 = ow0 <= 0 ? 0 : (ow0 + stride - 1) / stride;
        const int oh1 = min((ih + pad) / stride, OH - 1), ow1 = min((iw + pad) / stride, OW - 1);
        const float *dy = dout + plane * OH * OW;
        const int32_t *am = argmax + plane * OH * OW;
        float acc = dinp[x];
        for (int oh = oh0; oh <= oh1; oh++) {
            for (int ow = ow0; ow <= ow1; ow++) {
                if (am[oh * OW + ow] == me) {
                    acc += dy[oh * OW + ow];
                }
            }
        }
        dinp[x] = acc;
    }
}

/* One thread per (b, c): neighbouring threads read neighbouring channels. */
static __global__ void meanpool_fwd_kernel(float *out, const float *inp, const float *mask, int B,
                                           int T, int C)
{
    for (size_t o = thread_index(); o < (size_t)B * C; o += thread_count()) {
        const int b = (int)(o / C), c = (int)(o % C);
        const int count = mmp_token_count(mask, b, T);
        float sum = 0.0f;
        if (count > 0) {
            for (int t = 0; t < T; t++) {
                if (mask && mask[(size_t)b * T + t] == 0.0f) {
                    continue;
                }
                sum += inp[((size_t)b * T + t) * C + c];
            }
            sum *= 1.0f / (float)count;
        }
        out[o] = sum;
    }
}

static __global__ void meanpool_bwd_kernel(float *dinp, const float *dout, const float *mask, int B,
                                           int T, int C)
{
    for (size_t o = thread_index(); o < (size_t)B * C; o += thread_count()) {
        const int b = (int)(o / C), c = (int)(o % C);
        const int count = mmp_token_count(mask, b, T);
        if (count == 0) {
            continue;
        }
        const float g = dout[o] * (1.0f / (float)count);
        for (int t = 0; t < T; t++) {
            if (mask && mask[(size_t)b * T + t] == 0.0f) {
                continue;
            }
            dinp[((size_t)b * T + t) * C + c] += g;
        }
    }
}

mmp_err mmp_cuda_maxpool2d_fwd(mmp_cuda_ctx *ctx, float *out, int32_t *argmax, const float *inp,
                               int N, int C, int H, int W, int k, int stride, int pad, int OH,
                               int OW)
{
    // out (N,C,OH,OW), argmax (N,C,OH,OW), inp (N,C,H,W)
    ARG_CHECK(N >= 0 && C >= 0 && H > 0 && W > 0 && k > 0 && stride > 0 && pad >= 0);
    ARG_CHECK(OH > 0 && OW > 0);
    size_t total = (size_t)N * C * OH * OW;
    return launch_grid(ctx, maxpool_fwd_kernel, total, out, argmax, inp, total, H, W, k, stride,
                       pad, OH, OW);
}

mmp_err mmp_cuda_maxpool2d_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, int N, int C, int H, int W, int k, int stride,
                               int pad, int OH, int OW)
{
    // dinp (N,C,H,W), dout (N,C,OH,OW), argmax (N,C,OH,OW): the forward's window k, stride, pad
    ARG_CHECK(N >= 0 && C >= 0 && H > 0 && W > 0 && OH > 0 && OW > 0 && k > 0 && stride > 0 &&
              pad >= 0);
    size_t total = (size_t)N * C * H * W;
    return launch_grid(ctx, maxpool_bwd_kernel, total, dinp, dout, argmax, total, H, W, k, stride,
                       pad, OH, OW);
}

mmp_err mmp_cuda_meanpool_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *mask,
                              int B, int T, int C)
{
    // out (B,C), inp (B,T,C), mask (B,T) or NULL
    ARG_CHECK(B >= 0 && T >= 0 && C >= 0);
    size_t total = (size_t)B * C;
    return launch_grid(ctx, meanpool_fwd_kernel, total, out, inp, mask, B, T, C);
}

mmp_err mmp_cuda_meanpool_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *mask,
                              int B, int T, int C)
{
    // dinp (B,T,C), dout (B,C), mask (B,T) or NULL
    ARG_CHECK(B >= 0 && T >= 0 && C >= 0);
    size_t total = (size_t)B * C;
    return launch_grid(ctx, meanpool_bwd_kernel, total, dinp, dout, mask, B, T, C);
}
