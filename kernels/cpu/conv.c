/* 2-D convolution on the CPU: per image, im2col then one GEMM.
 *
 * This is the hot loop of CPU training (a small ResNet on 2 cores), so the
 * only work outside OpenBLAS is the im2col / col2im copy, and a 1x1 stride-1
 * unpadded convolution skips even that (the image already is its column
 * matrix). Never allocates except the im2col buffer when the caller passes
 * no scratch. */
#include "kernels/cpu.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/parallel.h"

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

/* A "same" stride-1 convolution (OW == W) reads, for each (c, kh, kw), the
 * image plane shifted by off = (kh - pad) W + (kw - pad): col row element j
 * is plane element j + off, except in the columns ow outside [lo, hi), which
 * read padding (their j + off lands on the neighbouring image row). So one
 * contiguous copy (or add) over the valid rows [j0, j1) does the work of a
 * short loop per row; the caller fixes the padding columns. The range is
 * trimmed where j + off would leave the plane (only padding columns are
 * there). */
static int is_same_stride1(const mmp_conv_shape *s)
{
    return s->stride == 1 && s->OW == s->W;
}

static void shifted_range(const mmp_conv_shape *s, int kh, int kw, size_t *j0, size_t *j1,
                          ptrdiff_t *off)
{
    int oh_lo, oh_hi;
    valid_range(kh, s->H, s->OH, 1, s->pad, &oh_lo, &oh_hi);
    ptrdiff_t o = (ptrdiff_t)(kh - s->pad) * s->W + (kw - s->pad);
    ptrdiff_t a = (ptrdiff_t)oh_lo * s->OW, b = (ptrdiff_t)oh_hi * s->OW;
    ptrdiff_t plane = (ptrdiff_t)s->H * s->W;
    if (a < -o) {
        a = -o;
    }
    if (b > plane - o) {
        b = plane - o;
    }
    if (b < a) {
        b = a;
    }
    *j0 = (size_t)a;
    *j1 = (size_t)b;
    *off = o;
}

/* Zeroes the padding columns (ow outside [lo, hi)) of the col rows that
 * the same-stride-1 run [j0, j1) touches, rows r0 = j0 / OW on. */
static void zero_pad_cols(float *row, size_t j1, size_t r0, int lo, int hi, int OW)
{
    if (lo <= 0 && hi >= OW) {
        return;
    }
    for (size_t r = r0; r * OW < j1; r++) {
        float *dst = row + r * OW;
        for (int ow = 0; ow < lo; ow++) {
            dst[ow] = 0.0f;
        }
        for (int ow = hi; ow < OW; ow++) {
            dst[ow] = 0.0f;
        }
    }
}

/* Where kernel tap (kh, kw) reads, the same for every channel and image:
 * its valid output columns [lo, hi) and, on the same-stride-1 path (same),
 * the run [j0, j1) at plane offset off (shifted_range). */
typedef struct {
    int kh, kw, lo, hi, same;
    size_t j0, j1, r0; /* r0 = j0 / OW, the run's first row */
    ptrdiff_t off;
} conv_tap;

static void tap_set(conv_tap *t, const mmp_conv_shape *s, int kh, int kw)
{
    t->kh = kh;
    t->kw = kw;
    t->same = is_same_stride1(s);
    t->j0 = t->j1 = t->r0 = 0;
    t->off = 0;
    valid_range(kw, s->W, s->OW, s->stride, s->pad, &t->lo, &t->hi);
    if (t->same) {
        shifted_range(s, kh, kw, &t->j0, &t->j1, &t->off);
        t->r0 = t->j0 / (size_t)s->OW;
    }
}

/* Taps are worked out once per call (up to MAX_TAPS, a 7x7 kernel; a larger
 * one has each tap worked out where it is used), not once per row: the
 * small maps of a deep layer have rows of 16 floats, where that bookkeeping
 * (divisions among it) cost more than the copy. */
#define MAX_TAPS 49

/* im2col's and col2im's arguments; channels are independent (each writes
 * its own rows of col, or its own plane of img), so they run on the pool */
typedef struct {
    float *col, *img;
    const float *src;
    const mmp_conv_shape *s;
    int n_taps; /* KH * KW when taps holds them all, else 0 */
    conv_tap taps[MAX_TAPS];
} cols_args;

static void cols_args_init(cols_args *a, const mmp_conv_shape *s)
{
    a->s = s;
    a->n_taps = 0;
    if (s->KH * s->KW <= MAX_TAPS) {
        for (int kh = 0; kh < s->KH; kh++) {
            for (int kw = 0; kw < s->KW; kw++) {
                tap_set(&a->taps[kh * s->KW + kw], s, kh, kw);
            }
        }
        a->n_taps = s->KH * s->KW;
    }
}

/* Tap k = kh * KW + kw of a's conv: from the table, or worked out into *own. */
static const conv_tap *tap_at(const cols_args *a, int k, conv_tap *own)
{
    if (a->n_taps) {
        return &a->taps[k];
    }
    tap_set(own, a->s, k / a->s->KW, k % a->s->KW);
    return own;
}

#define COLS_GRAIN_FLOATS 16384

static size_t cols_grain(const mmp_conv_shape *s)
{
    size_t per_channel = (size_t)s->KH * s->KW * s->OH * s->OW;
    return per_channel >= COLS_GRAIN_FLOATS ? 1
                                            : COLS_GRAIN_FLOATS / (per_channel ? per_channel : 1);
}

/* Short runs are plain loops (vectorised, inlined): a libc call per run of
 * 16 floats costs more than the copy. */
#define CALL_FLOATS 256

static void zero_floats(float *restrict dst, size_t n)
{
    if (n >= CALL_FLOATS) {
        memset(dst, 0, sizeof(float) * n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        dst[i] = 0.0f;
    }
}

static void copy_floats(float *restrict dst, const float *restrict src, size_t n)
{
    if (n >= CALL_FLOATS) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        dst[i] = src[i];
    }
}

/* Row k = kh * KW + kw of channel c's block of col: tap t read from one
 * image src (C,H,W); padding reads as 0. */
static void im2col_row(const cols_args *a, int c, const conv_tap *t, float *row)
{
    const mmp_conv_shape *s = a->s;
    int H = s->H, W = s->W, OH = s->OH, OW = s->OW, st = s->stride, pad = s->pad;
    int lo = t->lo, hi = t->hi;
    const float *plane = a->src + (size_t)c * H * W;
    if (t->same) {
        size_t j0 = t->j0, j1 = t->j1;
        zero_floats(row, j0);
        copy_floats(row + j0, plane + (ptrdiff_t)j0 + t->off, j1 - j0);
        zero_floats(row + j1, (size_t)OH * OW - j1);
        zero_pad_cols(row, j1, t->r0, lo, hi, OW);
        return;
    }
    for (int oh = 0; oh < OH; oh++) {
        float *dst = row + (size_t)oh * OW;
        int ih = oh * st - pad + t->kh;
        if (ih < 0 || ih >= H) {
            zero_floats(dst, (size_t)OW);
            continue;
        }
        const float *src = plane + (size_t)ih * W;
        for (int ow = 0; ow < lo; ow++) {
            dst[ow] = 0.0f;
        }
        const float *run = src + (ptrdiff_t)lo * st - pad + t->kw;
        if (st == 2) {
            /* a constant stride the compiler vectorises (shuffles) */
            for (int i = 0; i < hi - lo; i++) {
                dst[lo + i] = run[2 * i];
            }
        } else {
            for (int i = 0; i < hi - lo; i++) {
                dst[lo + i] = run[(ptrdiff_t)i * st];
            }
        }
        for (int ow = hi; ow < OW; ow++) {
            dst[ow] = 0.0f;
        }
    }
}

/* col (C*KH*KW, OH*OW) from one image img (C,H,W), channels [lo, hi). */
static void im2col_range(void *p, size_t lo_c, size_t hi_c)
{
    const cols_args *a = p;
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t OHW = (size_t)s->OH * s->OW;
    for (int c = (int)lo_c; c < (int)hi_c; c++) {
        for (int k = 0; k < K; k++) {
            conv_tap own;
            im2col_row(a, c, tap_at(a, k, &own), a->col + ((size_t)c * K + k) * OHW);
        }
    }
}

static void im2col(float *col, const float *img, const mmp_conv_shape *s)
{
    cols_args a = {.col = col, .src = img};
    cols_args_init(&a, s);
    mmp_cpu_parallel_for((size_t)s->C, cols_grain(s), im2col_range, &a);
}

/* One row of col (tap t of channel c) added into img's plane. */
static void col2im_row(const cols_args *a, int c, const conv_tap *t, const float *row)
{
    const mmp_conv_shape *s = a->s;
    float *plane = a->img + (size_t)c * s->H * s->W;
    for (int oh = 0; oh < s->OH; oh++) {
        int ih = oh * s->stride - s->pad + t->kh;
        if (ih < 0 || ih >= s->H) {
            continue;
        }
        const float *src = row + (size_t)oh * s->OW;
        float *dst = plane + (size_t)ih * s->W;
        for (int ow = t->lo; ow < t->hi; ow++) {
            dst[ow * s->stride - s->pad + t->kw] += src[ow];
        }
    }
}

/* Elements of a plane per block of the same-stride-1 col2im: the block and
 * the tap rows' pieces of it stay in L1 while every tap adds into it. */
#define COL2IM_BLOCK 512

/* Channel c on the same-stride-1 path: each tap's row adds one contiguous
 * run into the plane (element j takes row[j - off] for j in [j0, j1) + off),
 * after its padding columns were zeroed. The plane goes block by block,
 * every tap's run within a block in turn: each element still takes its
 * contributions in (kh, kw) order, the order a whole run per tap gives. */
static void col2im_channel_same(const cols_args *a, int c)
{
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t OHW = (size_t)s->OH * s->OW, HW = (size_t)s->H * s->W;
    float *plane = a->img + (size_t)c * HW;
    float *rows = a->col + (size_t)c * K * OHW;
    for (int k = 0; k < K; k++) {
        conv_tap own;
        const conv_tap *t = tap_at(a, k, &own);
        zero_pad_cols(rows + (size_t)k * OHW, t->j1, t->r0, t->lo, t->hi, s->OW);
    }
    for (size_t b0 = 0; b0 < HW; b0 += COL2IM_BLOCK) {
        size_t b1 = b0 + COL2IM_BLOCK < HW ? b0 + COL2IM_BLOCK : HW;
        for (int k = 0; k < K; k++) {
            conv_tap own;
            const conv_tap *t = tap_at(a, k, &own);
            /* the run's image elements are [j0 + off, j1 + off), within the plane */
            ptrdiff_t r0 = (ptrdiff_t)t->j0 + t->off, r1 = (ptrdiff_t)t->j1 + t->off;
            ptrdiff_t lo = r0 > (ptrdiff_t)b0 ? r0 : (ptrdiff_t)b0;
            ptrdiff_t hi = r1 < (ptrdiff_t)b1 ? r1 : (ptrdiff_t)b1;
            if (hi <= lo) {
                continue;
            }
            float *restrict dst = plane + lo;
            const float *restrict src = rows + (size_t)k * OHW + (lo - t->off);
            for (ptrdiff_t i = 0; i < hi - lo; i++) {
                dst[i] += src[i];
            }
        }
    }
}

/* img (C,H,W) += col (C*KH*KW, OH*OW) scattered back; padding is dropped.
 * Each image element takes its contributions in (c, kh, kw) order. The
 * same-stride-1 path zeroes col's padding columns first (col is the
 * caller's scratch) and then adds contiguous runs: those zeros land on
 * neighbouring elements, where x + 0 == x (a -0 element becomes +0). */
static void col2im_range(void *p, size_t lo_c, size_t hi_c)
{
    const cols_args *a = p;
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t OHW = (size_t)s->OH * s->OW;
    for (int c = (int)lo_c; c < (int)hi_c; c++) {
        if (is_same_stride1(s)) {
            col2im_channel_same(a, c);
            continue;
        }
        for (int k = 0; k < K; k++) {
            conv_tap own;
            col2im_row(a, c, tap_at(a, k, &own), a->col + ((size_t)c * K + k) * OHW);
        }
    }
}

static void col2im_add(float *img, float *col, const mmp_conv_shape *s)
{
    cols_args a = {.col = col, .img = img};
    cols_args_init(&a, s);
    mmp_cpu_parallel_for((size_t)s->C, cols_grain(s), col2im_range, &a);
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
