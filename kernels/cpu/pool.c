/* Pooling on the CPU: 2-D max pool over images (with saved argmax) and a
 * masked mean over the token axis of sequences. */
#include "kernels/cpu.h"
#include "kernels/pointwise.h"

void mmp_cpu_maxpool2d_fwd(float *out, int32_t *argmax, const float *inp, int N, int C, int H,
                           int W, int k, int stride, int pad, int OH, int OW)
{
    // out (N,C,OH,OW), argmax (N,C,OH,OW), inp (N,C,H,W)
    for (size_t p = 0; p < (size_t)N * C; p++) {
        const float *x = inp + p * H * W;
        float *y = out + p * OH * OW;
        int32_t *am = argmax + p * OH * OW;
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow++) {
                /* a window entirely in the padding (pad >= k) outputs 0, gradient nowhere */
                am[oh * OW + ow] =
                    mmp_maxpool_window(x, H, W, k, stride, pad, oh, ow, &y[oh * OW + ow]);
            }
        }
    }
}

void mmp_cpu_maxpool2d_bwd(float *dinp, const float *dout, const int32_t *argmax, int N, int C,
                           int H, int W, int OH, int OW)
{
    // dinp (N,C,H,W), dout (N,C,OH,OW), argmax (N,C,OH,OW)
    for (size_t p = 0; p < (size_t)N * C; p++) {
        float *dx = dinp + p * H * W;
        const float *dy = dout + p * OH * OW;
        const int32_t *am = argmax + p * OH * OW;
        for (int i = 0; i < OH * OW; i++) {
            if (am[i] >= 0) {
                dx[am[i]] += dy[i];
            }
        }
    }
}

void mmp_cpu_meanpool_fwd(float *out, const float *inp, const float *mask, int B, int T, int C)
{
    // out (B,C), inp (B,T,C), mask (B,T) or NULL
    for (int b = 0; b < B; b++) {
        float *y = out + (size_t)b * C;
        for (int c = 0; c < C; c++) {
            y[c] = 0.0f;
        }
        int count = mmp_token_count(mask, b, T);
        if (count == 0) {
            continue;
        }
        for (int t = 0; t < T; t++) {
            if (mask && mask[(size_t)b * T + t] == 0.0f) {
                continue;
            }
            const float *x = inp + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) {
                y[c] += x[c];
            }
        }
        float inv = 1.0f / (float)count;
        for (int c = 0; c < C; c++) {
            y[c] *= inv;
        }
    }
}

void mmp_cpu_meanpool_bwd(float *dinp, const float *dout, const float *mask, int B, int T, int C)
{
    // dinp (B,T,C), dout (B,C), mask (B,T) or NULL
    for (int b = 0; b < B; b++) {
        int count = mmp_token_count(mask, b, T);
        if (count == 0) {
            continue;
        }
        float inv = 1.0f / (float)count;
        const float *dy = dout + (size_t)b * C;
        for (int t = 0; t < T; t++) {
            if (mask && mask[(size_t)b * T + t] == 0.0f) {
                continue;
            }
            float *dx = dinp + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) {
                dx[c] += dy[c] * inv;
            }
        }
    }
}
