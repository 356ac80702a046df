/* 2-D convolution on the CPU: per image, im2col then one GEMM.
 *
 * This is the hot loop of CPU training (a small ResNet on 2 cores), so the
 * only work outside OpenBLAS is the im2col / col2im copy, and a 1x1 stride-1
 * unpadded convolution skips even that (the image already is its column
 * matrix). Never allocates except the im2col buffer when the caller passes
 * no scratch. */
#include "kernels/cpu.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void mmp_conv_shape_set(mmp_conv_shape *s, int N, int C, int H, int W, int OC, int KH, int KW,
                        int stride, int pad)
{
    s->N = N;
    s->C = C;
    s->H = H;
    s->W = W;
    s->OC = OC;
    s->KH = KH;
    s->KW = KW;
    s->stride = stride;
    s->pad = pad;
    s->OH = (H + 2 * pad - KH) / stride + 1;
    s->OW = (W + 2 * pad - KW) / stride + 1;
}

size_t mmp_cpu_conv2d_scratch_floats(const mmp_conv_shape *s)
{
    return (size_t)s->C * s->KH * s->KW * s->OH * s->OW;
}

static int is_pointwise(const mmp_conv_shape *s)
{
    return s->KH == 1 && s->KW == 1 && s->stride == 1 && s->pad == 0;
}

/* Output columns [*lo, *hi) whose input column ow * stride - pad + kw lies
 * inside [0, W); the same formula serves rows. */
static void valid_range(int k, int W, int OW, int stride, int pad, int *lo, int *hi)
{
    int first = pad - k; /* smallest ow * stride allowed */
    int last = W - 1 + pad - k;
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    *hi = last < 0 ? 0 : last / stride + 1;
    if (*hi > OW) {
        *hi = OW;
    }
    if (*lo > *hi) {
        *lo = *hi;
    }
}

/* col (C*KH*KW, OH*OW) from one image img (C,H,W); padding reads as 0. */
static void im2col(float *col, const float *img, const mmp_conv_shape *s)
{
    int H = s->H, W = s->W, OH = s->OH, OW = s->OW, st = s->stride, pad = s->pad;
    for (int c = 0; c < s->C; c++) {
        for (int kh = 0; kh < s->KH; kh++) {
            for (int kw = 0; kw < s->KW; kw++) {
                float *row = col + ((size_t)(c * s->KH + kh) * s->KW + kw) * OH * OW;
                int lo, hi;
                valid_range(kw, W, OW, st, pad, &lo, &hi);
                for (int oh = 0; oh < OH; oh++) {
                    float *dst = row + (size_t)oh * OW;
                    int ih = oh * st - pad + kh;
                    if (ih < 0 || ih >= H) {
                        memset(dst, 0, sizeof(float) * OW);
                        continue;
                    }
                    const float *src = img + ((size_t)c * H + ih) * W;
                    for (int ow = 0; ow < lo; ow++) {
                        dst[ow] = 0.0f;
                    }
                    if (st == 1 && hi > lo) {
                        /* the common case is a contiguous run: let memcpy vectorise it */
                        memcpy(dst + lo, src + (lo - pad + kw), sizeof(float) * (hi - lo));
                    } else {
                        for (int ow = lo; ow < hi; ow++) {
                            dst[ow] = src[ow * st - pad + kw];
                        }
                    }
                    for (int ow = hi; ow < OW; ow++) {
                        dst[ow] = 0.0f;
                    }
                }
            }
        }
    }
}

/* img (C,H,W) += col (C*KH*KW, OH*OW) scattered back; padding is dropped. */
static void col2im_add(float *img, const float *col, const mmp_conv_shape *s)
{
    int H = s->H, W = s->W, OH = s->OH, OW = s->OW, st = s->stride, pad = s->pad;
    for (int c = 0; c < s->C; c++) {
        for (int kh = 0; kh < s->KH; kh++) {
            for (int kw = 0; kw < s->KW; kw++) {
                const float *row = col + ((size_t)(c * s->KH + kh) * s->KW + kw) * OH * OW;
                int lo, hi;
                valid_range(kw, W, OW, st, pad, &lo, &hi);
                for (int oh = 0; oh < OH; oh++) {
                    int ih = oh * st - pad + kh;
                    if (ih < 0 || ih >= H) {
                        continue;
                    }
                    const float *src = row + (size_t)oh * OW;
                    float *dst = img + ((size_t)c * H + ih) * W;
                    if (st == 1 && hi > lo) {
                        /* a contiguous run: the compiler vectorises it */
                        float *run = dst + (lo - pad + kw);
                        for (int i = 0; i < hi - lo; i++) {
                            run[i] += src[lo + i];
                        }
                    } else {
                        for (int ow = lo; ow < hi; ow++) {
                            dst[ow * st - pad + kw] += src[ow];
                        }
                    }
                }
            }
        }
    }
}

/* The caller's scratch, or a fresh buffer (*owned set) when it passed none. */
static float *get_scratch(const mmp_conv_shape *s, float *scratch, float **owned)
{
    *owned = NULL;
    if (scratch || is_pointwise(s)) {
        return scratch;
    }
    *owned = malloc(sizeof(float) * mmp_cpu_conv2d_scratch_floats(s));
    if (!*owned) {
        /* The contract has no error path: callers that must survive this pass scratch. */
        mmp_panic(__FILE__, __LINE__, "out of memory for the conv2d im2col buffer");
    }
    return *owned;
}

void mmp_cpu_conv2d_fwd(float *out, const float *inp, const float *w, const float *b,
                        const mmp_conv_shape *s, float *scratch)
{
    // out (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW), b (OC) or NULL
    float *owned;
    float *col = get_scratch(s, scratch, &owned);
    int OHW = s->OH * s->OW;
    int CKK = s->C * s->KH * s->KW;
    for (int n = 0; n < s->N; n++) {
        const float *x = inp + (size_t)n * s->C * s->H * s->W;
        float *y = out + (size_t)n * s->OC * OHW;
        const float *xcol = x;
        if (!is_pointwise(s)) {
            im2col(col, x, s);
            xcol = col;
        }
        float beta = 0.0f;
        if (b) {
            for (int o = 0; o < s->OC; o++) {
                for (int i = 0; i < OHW; i++) {
                    y[(size_t)o * OHW + i] = b[o];
                }
            }
            beta = 1.0f;
        }
        // y (OC, OHW) = w (OC, CKK) @ xcol (CKK, OHW)
        mmp_cpu_gemm(0, 0, s->OC, OHW, CKK, 1.0f, w, CKK, xcol, OHW, beta, y, OHW);
    }
    free(owned);
}

void mmp_cpu_conv2d_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const mmp_conv_shape *s, float *scratch)
{
    // dinp (N,C,H,W), dw (OC,C,KH,KW), db (OC), dout (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW)
    float *owned = NULL;
    float *col = NULL;
    if (dinp || dw) {
        col = get_scratch(s, scratch, &owned);
    }
    int OHW = s->OH * s->OW;
    int HW = s->H * s->W;
    int CKK = s->C * s->KH * s->KW;
    for (int n = 0; n < s->N; n++) {
        const float *dy = dout + (size_t)n * s->OC * OHW;
        if (db) {
            for (int o = 0; o < s->OC; o++) {
                float sum = 0.0f;
                for (int i = 0; i < OHW; i++) {
                    sum += dy[(size_t)o * OHW + i];
                }
                db[o] += sum;
            }
        }
        if (dw) {
            const float *x = inp + (size_t)n * s->C * HW;
            const float *xcol = x;
            if (!is_pointwise(s)) {
                im2col(col, x, s);
                xcol = col;
            }
            // dw (OC, CKK) += dy (OC, OHW) @ xcol^T (OHW, CKK)
            mmp_cpu_gemm(0, 1, s->OC, CKK, OHW, 1.0f, dy, OHW, xcol, OHW, 1.0f, dw, CKK);
        }
        if (dinp) {
            float *dx = dinp + (size_t)n * s->C * HW;
            if (is_pointwise(s)) {
                // dx (C, HW) += w^T (C, OC) @ dy (OC, HW)
                mmp_cpu_gemm(1, 0, s->C, HW, s->OC, 1.0f, w, CKK, dy, OHW, 1.0f, dx, HW);
            } else {
                // dcol (CKK, OHW) = w^T (CKK, OC) @ dy (OC, OHW), then scattered into dx
                mmp_cpu_gemm(1, 0, CKK, OHW, s->OC, 1.0f, w, CKK, dy, OHW, 0.0f, col, OHW);
                col2im_add(dx, col, s);
            }
        }
    }
    free(owned);
}
