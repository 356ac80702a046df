/* Per-element math that the CPU reference (kernels/cpu) and the CUDA kernels
 * (kernels/cuda) share, so the two devices compute one definition: GELU and
 * its derivative, a sigmoid that never overflows, one max-pool window and
 * the token count of a masked mean.
 * Compiles as C11 and as CUDA C++ (each function is host and device code
 * under nvcc). Pure functions of their arguments: no state, no allocation.
 * The only definitions in a kernels/ header, since nvcc and gcc must both
 * inline them. */
#ifndef MMP_KERNELS_POINTWISE_H
#define MMP_KERNELS_POINTWISE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MMP_POINTWISE static __host__ __device__ __forceinline__
#else
#define MMP_POINTWISE static inline
#endif

#define MMP_GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define MMP_GELU_CUBIC 0.044715f

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
MMP_POINTWISE float mmp_gelu(float x)
{
    float u = MMP_GELU_SQRT_2_OVER_PI * (x + MMP_GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu(x) / dx of the same approximation. */
MMP_POINTWISE float mmp_gelu_grad(float x)
{
    float u = MMP_GELU_SQRT_2_OVER_PI * (x + MMP_GELU_CUBIC * x * x * x);
    float t = tanhf(u);
    float du = MMP_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * MMP_GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* 1 / (1 + e^-x), through e^x for negative x so neither side overflows. */
MMP_POINTWISE float mmp_sigmoid(float x)
{
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

/* Max pool of the k x k window of output (oh, ow) over one (H, W) plane x:
 * only real pixels compete (padding never wins) and the first maximum in
 * row-major order wins ties. Returns the winner's index in the plane, -1 (and
 * *best 0) for a window entirely in the padding. */
MMP_POINTWISE int32_t mmp_maxpool_window(const float *x, int H, int W, int k, int stride, int pad,
                                         int oh, int ow, float *best)
{
    float b = 0.0f;
    int32_t best_i = -1;
    for (int kh = 0; kh < k; kh++) {
        int ih = oh * stride - pad + kh;
        if (ih < 0 || ih >= H) {
            continue;
        }
        for (int kw = 0; kw < k; kw++) {
            int iw = ow * stride - pad + kw;
            if (iw < 0 || iw >= W) {
                continue;
            }
            float v = x[ih * W + iw];
            if (best_i < 0 || v > b) {
                b = v;
                best_i = ih * W + iw;
            }
        }
    }
    *best = b;
    return best_i;
}

/* Tokens of sequence b that count in a masked mean over (B,T): all T
 * without a mask, else those whose mask entry is not 0. */
MMP_POINTWISE int mmp_token_count(const float *mask, int b, int T)
{
    if (!mask) {
        return T;
    }
    int count = 0;
    for (int t = 0; t < T; t++) {
        count += mask[(size_t)b * T + t] != 0.0f;
    }
    return count;
}

#endif
