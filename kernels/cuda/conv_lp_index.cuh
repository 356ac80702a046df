/* conv_lp.cu's index math, for the host as for the device:
 * tests/test_conv_lp_host.cu runs it on the CPU (no GPU needed) against the
 * CPU's convolution, so a wrong index shows before any device time is
 * spent. Pure arithmetic on what the callers pass; no CUDA call. */
#ifndef MMP_KERNELS_CUDA_CONV_LP_INDEX_CUH
#define MMP_KERNELS_CUDA_CONV_LP_INDEX_CUH

#include <stddef.h>

extern "C" { /* a C header: mmp_conv_shape_set has C linkage */
#include "kernels/shape.h"
}

/* The shape that makes im2col pack an (N, C, H, W) tensor as it is: C rows
 * of H*W per image. */
static __host__ __device__ inline mmp_conv_shape conv_lp_plain(int N, int C, int H, int W)
{
    mmp_conv_shape t = {N, C, H, W, C, 1, 1, 1, 0, H, W};
    return t;
}

/* Element i of s's im2col matrix, i in [0, N * C*KH*KW * OH*OW) in (n, r, p)
 * order (row r = (c*KH + kh)*KW + kw, column p = oh*OW + ow): *dst is where
 * it goes (n * n_stride + r * ld + p); returns the index of the input
 * element (N,C,H,W) it copies, or -1 where the window reads the padding. */
static __host__ __device__ inline long long
conv_lp_im2col_at(const mmp_conv_shape &s, size_t i, long long n_stride, int ld, size_t *dst)
{
    const int P = s.OH * s.OW, KK = s.KH * s.KW, CKK = s.C * KK;
    const int p = (int)(i % P);
    const int r = (int)((i / P) % CKK);
    const size_t n = i / ((size_t)P * CKK);
    const int c = r / KK, kh = (r / s.KW) % s.KH, kw = r % s.KW;
    const int h = (p / s.OW) * s.stride - s.pad + kh, w = (p % s.OW) * s.stride - s.pad + kw;
    *dst = n * n_stride + (size_t)r * ld + p;
    return h >= 0 && h < s.H && w >= 0 && w < s.W ? (long long)(((n * s.C + c) * s.H + h) * s.W + w)
                                                  : -1;
}

/* Input element i of (N,C,H,W): the sum of its taps in dcol (N, C*KH*KW,
 * OH*OW), kh then kw (the order fixes the bits). */
static __host__ __device__ inline float conv_lp_col2im_sum(const float *dcol,
                                                           const mmp_conv_shape &s, size_t i)
{
    const int P = s.OH * s.OW, KK = s.KH * s.KW;
    const int w = (int)(i % s.W), h = (int)((i / s.W) % s.H);
    const size_t nc = i / ((size_t)s.H * s.W); /* n * C + c */
    const float *d = dcol + nc * KK * P;       /* (n, c*KK, .) */
    float sum = 0.0f;
    for (int kh = 0; kh < s.KH; kh++) {
        const int y = h + s.pad - kh;
        if (y < 0 || y % s.stride != 0 || y / s.stride >= s.OH) {
            continue;
        }
        for (int kw = 0; kw < s.KW; kw++) {
            const int x = w + s.pad - kw;
            if (x < 0 || x % s.stride != 0 || x / s.stride >= s.OW) {
                continue;
            }
            sum += d[(size_t)(kh * s.KW + kw) * P + (y / s.stride) * s.OW + x / s.stride];
        }
    }
    return sum;
}

#endif
