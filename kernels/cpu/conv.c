/* 2-D convolution on the CPU: im2col then one GEMM per image, or per group
 * of images on small maps (group_images).
 *
 * This is the hot loop of CPU training (a small ResNet on 2 cores), so the
 * only work outside OpenBLAS is the im2col / col2im copy, and a 1x1 stride-1
 * unpadded convolution skips even that (the image already is its column
 * matrix). Never allocates except the scratch buffer when the caller passes
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

static int is_pointwise(const mmp_conv_shape *s)
{
    return s->KH == 1 && s->KW == 1 && s->stride == 1 && s->pad == 0;
}

/* Images per GEMM. A small map (a deep layer's 4x4: 16 output columns per
 * image) makes thin GEMMs that pack w again for every image and run
 * OpenBLAS's kernel on a sliver; the col matrices of several images side by
 * side, up to GROUP_COLS columns, share one GEMM. Larger maps go one image
 * at a time (their col matrix stays in cache). A function of the shape
 * alone, so every caller of a shape computes the same bits. */
#define GROUP_COLS 256

static int group_images(const mmp_conv_shape *s)
{
    int OHW = s->OH * s->OW;
    if (is_pointwise(s) || OHW <= 0 || 2 * OHW > GROUP_COLS || s->N < 2) {
        return 1;
    }
    int g = GROUP_COLS / OHW;
    return g < s->N ? g : s->N;
}

size_t mmp_cpu_conv2d_scratch_floats(const mmp_conv_shape *s)
{
    size_t OHW = (size_t)s->OH * s->OW, CKK = (size_t)s->C * s->KH * s->KW;
    int g = group_images(s);
    if (g == 1) {
        return CKK * OHW;
    }
    /* a group's col, then its (OC, g OH OW) output or output gradient */
    return (size_t)g * OHW * (CKK + (size_t)s->OC);
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
static MMP_CPU_INLINE void zero_pad_cols(float *row, size_t j1, size_t r0, int lo, int hi, int OW)
{
    if (lo <= 0 && hi >= OW) {
        return;
    }
    size_t r1 = (j1 + (size_t)OW - 1) / (size_t)OW; /* rows r0 .. r1 - 1 */
    float *dst = row + r0 * (size_t)OW;
    if (lo <= 1 && hi >= OW - 1) {
        /* a 3x3 pad-1 tap: at most one column each side, one store per
         * row and side without a loop around it (was 2% of a demo step) */
        int left = lo == 1, right = hi == OW - 1;
        for (size_t r = r0; r < r1; r++, dst += OW) {
            if (left) {
                dst[0] = 0.0f;
            }
            if (right) {
                dst[OW - 1] = 0.0f;
            }
        }
        return;
    }
    for (size_t r = r0; r < r1; r++, dst += OW) {
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
    int phase;         /* phase-plane path: the phase (p, q) read, as 2 p + q */
    size_t j0, j1, r0; /* r0 = j0 / OW, the run's first row */
    ptrdiff_t off;
} conv_tap;

/* A stride-2 convolution of an even map whose output is half its size
 * (3x3/2 pad 1, 1x1/2 pad 0) reads, for tap (kh, kw), one of the map's four
 * phases P_pq[i][j] = x[2 i + p][2 j + q] (p, q = (kh - pad) mod 2, (kw -
 * pad) mod 2), each OH x OW, shifted by (dh, dw) = ((kh - pad - p) / 2,
 * (kw - pad - q) / 2): a same-stride-1 run on the phase plane. im2col then
 * copies runs where it copied every other float of each short output row,
 * and col2im adds runs into the phases (each element still takes its taps
 * in (kh, kw) order). A channel's phases are split off on the stack, so
 * maps up to PHASE_MAX_FLOATS floats. */
#define PHASE_MAX_FLOATS 4096

static int is_phase_path(const mmp_conv_shape *s)
{
    return s->stride == 2 && s->H % 2 == 0 && s->W % 2 == 0 && s->OH == s->H / 2 &&
           s->OW == s->W / 2 && (size_t)s->H * s->W <= PHASE_MAX_FLOATS;
}

/* The run of a shift (dh, dw) read from a plane of src_h rows of OW floats
 * into an (OH, OW) col row: valid columns [lo, hi), the run [j0, j1) of col
 * elements j that read plane[j + off], trimmed to the plane. */
static void shift_run(conv_tap *t, int dh, int dw, int src_h, int OH, int OW)
{
    int lo = -dw > 0 ? -dw : 0, hi = OW - dw < OW ? OW - dw : OW;
    hi = hi > 0 ? hi : 0;
    t->lo = lo < hi ? lo : hi;
    t->hi = hi;
    int oh_lo = -dh > 0 ? -dh : 0, oh_hi = src_h - dh < OH ? src_h - dh : OH;
    oh_hi = oh_hi > oh_lo ? oh_hi : oh_lo;
    ptrdiff_t off = (ptrdiff_t)dh * OW + dw;
    ptrdiff_t a = (ptrdiff_t)oh_lo * OW, b = (ptrdiff_t)oh_hi * OW;
    ptrdiff_t plane = (ptrdiff_t)src_h * OW;
    a = a > -off ? a : -off;
    b = b < plane - off ? b : plane - off;
    b = b > a ? b : a;
    t->j0 = (size_t)a;
    t->j1 = (size_t)b;
    t->off = off;
    t->r0 = t->j0 / (size_t)OW;
}

/* The plane (H,W) split into the phases ph (4, H/2, W/2) that used has a
 * bit 1 << (2 p + q) for (a 1x1/2 conv reads only phase 0). */
static MMP_CPU_INLINE void split_phases(float *restrict ph, const float *restrict plane, int H,
                                        int W, unsigned used)
{
    int OW = W / 2;
    size_t OHW = (size_t)(H / 2) * OW;
    for (int ih = 0; ih < H; ih++) {
        unsigned both = used >> (2 * (ih & 1)) & 3u;
        const float *src = plane + (size_t)ih * W;
        float *e = ph + (size_t)(ih & 1) * 2 * OHW + (size_t)(ih >> 1) * OW;
        float *o = e + OHW;
        if (both == 3u) {
            for (int j = 0; j < OW; j++) {
                e[j] = src[2 * j];
                o[j] = src[2 * j + 1];
            }
        } else if (both == 1u) {
            for (int j = 0; j < OW; j++) {
                e[j] = src[2 * j];
            }
        } else if (both == 2u) {
            for (int j = 0; j < OW; j++) {
                o[j] = src[2 * j + 1];
            }
        }
    }
}

/* split_phases undone for the same phases: those written back from ph */
static MMP_CPU_INLINE void join_phases(float *restrict plane, const float *restrict ph, int H,
                                       int W, unsigned used)
{
    int OW = W / 2;
    size_t OHW = (size_t)(H / 2) * OW;
    for (int ih = 0; ih < H; ih++) {
        unsigned both = used >> (2 * (ih & 1)) & 3u;
        float *dst = plane + (size_t)ih * W;
        const float *e = ph + (size_t)(ih & 1) * 2 * OHW + (size_t)(ih >> 1) * OW;
        const float *o = e + OHW;
        if (both == 3u) {
            for (int j = 0; j < OW; j++) {
                dst[2 * j] = e[j];
                dst[2 * j + 1] = o[j];
            }
        } else if (both == 1u) {
            for (int j = 0; j < OW; j++) {
                dst[2 * j] = e[j];
            }
        } else if (both == 2u) {
            for (int j = 0; j < OW; j++) {
                dst[2 * j + 1] = o[j];
            }
        }
    }
}

static void tap_set(conv_tap *t, const mmp_conv_shape *s, int kh, int kw)
{
    t->kh = kh;
    t->kw = kw;
    t->same = is_same_stride1(s);
    t->phase = 0;
    t->j0 = t->j1 = t->r0 = 0;
    t->off = 0;
    if (is_phase_path(s)) {
        int p = ((kh - s->pad) % 2 + 2) % 2, q = ((kw - s->pad) % 2 + 2) % 2;
        t->same = 1; /* a same-stride-1 run, on the phase plane */
        t->phase = 2 * p + q;
        shift_run(t, (kh - s->pad - p) / 2, (kw - s->pad - q) / 2, s->OH, s->OH, s->OW);
        return;
    }
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
    float *col, *img; /* image i's planes at img + i C H W, its col rows at col + i OH OW */
    const float *src; /* the same for im2col's images */
    size_t ld;        /* col's row stride: images' rows lie side by side */
    const mmp_conv_shape *s;
    int n_taps;      /* KH * KW when taps holds them all, else 0 */
    unsigned phases; /* phase-plane path: bit 2 p + q for each phase a tap reads */
    conv_tap taps[MAX_TAPS];
    /* padded-plane path (padded set, padded_init): the image plane in a
     * zero-bordered (Hp, Wp) plane */
    int padded, Hp, Wp;
    int padded_max_ow; /* the widest output a caller takes this path for */
} cols_args;

/* Floats of stack the padded-plane path may use for its plane (32 KiB; a
 * 3x3 conv's padded 32x32 map is 34 x 34). Larger maps take the run path. */
#define PAD_MAX_FLOATS 8192

/* Output widths up to which im2col and col2im take the padded-plane path:
 * measured (bench/bench_conv, the demo's shapes), it beats the run path
 * there (im2col of a 16x16 map 0.89x the time, 8x8 0.81x, 4x4 0.85x;
 * col2im of a 16x16 map 1.07x, so col2im stops at 8) */
#define IM2COL_PADDED_OW 16
#define COL2IM_PADDED_OW 8

/* Small maps on the same-stride-1 path read every col row as OH short rows
 * of a zero-bordered copy of the image plane, P (H + 2 pad, W + 2 pad): no
 * per-row valid ranges, no zeroing of padding columns, and OW a constant in
 * the copy loops (4, 8 or 16 floats), where the run path spent more on a
 * 4x4 map's bookkeeping than on its copy. The col matrix holds the same
 * bits (padding reads as +0, the zero the run path wrote). Tap (kh, kw)
 * reads P from element kh Wp + kw on. Sets a->padded or leaves it 0. */
static void padded_init(cols_args *a)
{
    const mmp_conv_shape *s = a->s;
    a->padded = 0;
    if (!a->n_taps || !is_same_stride1(s) || s->OW > a->padded_max_ow) {
        return;
    }
    /* rows oh + kh - pad for oh in [0, OH) lie in [-pad, H + pad), columns alike */
    long Hp = (long)s->H + 2L * s->pad, Wp = (long)s->W + 2L * s->pad;
    if (Hp * Wp > PAD_MAX_FLOATS) {
        return;
    }
    a->Hp = (int)Hp;
    a->Wp = (int)Wp;
    a->padded = 1;
}

static void cols_args_init(cols_args *a, const mmp_conv_shape *s, size_t ld, int padded_max_ow)
{
    a->s = s;
    a->padded_max_ow = padded_max_ow;
    a->ld = ld;
    a->n_taps = 0;
    a->phases = 0xFu;
    if (s->KH * s->KW <= MAX_TAPS) {
        a->phases = 0;
        for (int kh = 0; kh < s->KH; kh++) {
            for (int kw = 0; kw < s->KW; kw++) {
                conv_tap *t = &a->taps[kh * s->KW + kw];
                tap_set(t, s, kh, kw);
                a->phases |= 1u << t->phase;
            }
        }
        a->n_taps = s->KH * s->KW;
    }
    padded_init(a);
}

/* Tap k = kh * KW + kw of a's conv: from the table, or worked out into *own. */
static MMP_CPU_INLINE const conv_tap *tap_at(const cols_args *a, int k, conv_tap *own)
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

static MMP_CPU_INLINE void zero_floats(float *restrict dst, size_t n)
{
    if (n >= CALL_FLOATS) {
        memset(dst, 0, sizeof(float) * n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        dst[i] = 0.0f;
    }
}

static MMP_CPU_INLINE void copy_floats(float *restrict dst, const float *restrict src, size_t n)
{
    if (n >= CALL_FLOATS) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        dst[i] = src[i];
    }
}

/* One row of col: tap t read from one image plane (H,W); padding reads as 0. */
static MMP_CPU_INLINE void im2col_row(const cols_args *a, const float *plane, const conv_tap *t,
                                      float *row)
{
    const mmp_conv_shape *s = a->s;
    int H = s->H, W = s->W, OH = s->OH, OW = s->OW, st = s->stride, pad = s->pad;
    int lo = t->lo, hi = t->hi;
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

/* ---- the padded-plane path (padded_init) ---- */

/* P (Hp, Wp) from the image plane (H, W): the interior a copy, the border
 * of pad rows and columns zero. Writes all of P. */
static MMP_CPU_INLINE void pad_plane(float *restrict P, const cols_args *a,
                                     const float *restrict plane)
{
    int H = a->s->H, W = a->s->W, pad = a->s->pad, Wp = a->Wp;
    zero_floats(P, (size_t)pad * Wp);
    for (int i = 0; i < H; i++) {
        float *dst = P + (size_t)(i + pad) * Wp;
        const float *src = plane + (size_t)i * W;
        zero_floats(dst, (size_t)pad);
        for (int j = 0; j < W; j++) {
            dst[pad + j] = src[j];
        }
        zero_floats(dst + pad + W, (size_t)pad);
    }
    zero_floats(P + (size_t)(pad + H) * Wp, (size_t)pad * Wp);
}

/* pad_plane undone: P's interior written back into the image plane */
static MMP_CPU_INLINE void unpad_plane(float *restrict plane, const cols_args *a,
                                       const float *restrict P)
{
    int H = a->s->H, W = a->s->W, pad = a->s->pad, Wp = a->Wp;
    for (int i = 0; i < H; i++) {
        const float *src = P + (size_t)(i + pad) * Wp + pad;
        float *dst = plane + (size_t)i * W;
        for (int j = 0; j < W; j++) {
            dst[j] = src[j];
        }
    }
}

/* OH rows of OW floats: row (OH, OW) = P's rows at src, Wp apart (im2col),
 * or P's rows += row (col2im). OW is a constant where inlined. */
static MMP_CPU_INLINE void rows_get(float *restrict row, const float *restrict src, int OH, int OW,
                                    int Wp)
{
    for (int oh = 0; oh < OH; oh++) {
        for (int ow = 0; ow < OW; ow++) {
            row[(size_t)oh * OW + ow] = src[(size_t)oh * Wp + ow];
        }
    }
}

static MMP_CPU_INLINE void rows_add(float *restrict dst, const float *restrict row, int OH, int OW,
                                    int Wp)
{
    for (int oh = 0; oh < OH; oh++) {
        for (int ow = 0; ow < OW; ow++) {
            dst[(size_t)oh * Wp + ow] += row[(size_t)oh * OW + ow];
        }
    }
}

/* rows_get / rows_add with the common widths made constants */
static MMP_CPU_INLINE void rows_move(int add, float *restrict P, float *restrict row, int OH,
                                     int OW, int Wp)
{
#define MMP_ROWS_MOVE(w)                                                                           \
    do {                                                                                           \
        if (add) {                                                                                 \
            rows_add(P, row, OH, w, Wp);                                                           \
        } else {                                                                                   \
            rows_get(row, P, OH, w, Wp);                                                           \
        }                                                                                          \
    } while (0)
    switch (OW) {
    case 4:
        MMP_ROWS_MOVE(4);
        break;
    case 8:
        MMP_ROWS_MOVE(8);
        break;
    case 16:
        MMP_ROWS_MOVE(16);
        break;
    default:
        MMP_ROWS_MOVE(OW);
        break;
    }
#undef MMP_ROWS_MOVE
}

/* A 1x1 convolution with stride > 1 and no padding (a shortcut's 1x1/2)
 * reads every stride-th element of every stride-th row: its one col row
 * per channel is that subsample, copied (im2col) or added back (col2im) in
 * one strided pass, where the phase path split the plane, copied and
 * joined. Each element still takes its one add. */
static int is_strided_pointwise(const mmp_conv_shape *s)
{
    return s->KH == 1 && s->KW == 1 && s->pad == 0 && s->stride > 1;
}

/* row (OH, OW) = plane's subsample (add 0), or plane's subsample += row
 * (add 1); st a constant where inlined */
static MMP_CPU_INLINE void subsample_move(int add, float *restrict plane, float *restrict row,
                                          int OH, int OW, int W, int st)
{
    for (int oh = 0; oh < OH; oh++) {
        float *p = plane + (size_t)oh * st * W;
        float *r = row + (size_t)oh * OW;
        if (add) {
            for (int ow = 0; ow < OW; ow++) {
                p[(size_t)ow * st] += r[ow];
            }
        } else {
            for (int ow = 0; ow < OW; ow++) {
                r[ow] = p[(size_t)ow * st];
            }
        }
    }
}

static MMP_CPU_INLINE void strided_pointwise(int add, const mmp_conv_shape *s, float *plane,
                                             float *row)
{
    if (s->stride == 2) {
        subsample_move(add, plane, row, s->OH, s->OW, s->W, 2);
    } else {
        subsample_move(add, plane, row, s->OH, s->OW, s->W, s->stride);
    }
}

/* Item it = i C + c of a's images: image i's channel c. */
static MMP_CPU_INLINE void item_at(const cols_args *a, size_t it, size_t *i, int *c)
{
    *i = it / (size_t)a->s->C;
    *c = (int)(it % (size_t)a->s->C);
}

/* col rows of items [lo, hi): image i's rows (c, kh, kw) at
 * col + ((c KH + kh) KW + kw) ld + i OH OW, from src (images of (C,H,W)). */
MMP_CPU_CLONES static void im2col_range(void *p, size_t lo, size_t hi)
{
    const cols_args *a = p;
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t OHW = (size_t)s->OH * s->OW, HW = (size_t)s->H * s->W;
    for (size_t it = lo; it < hi; it++) {
        size_t i;
        int c;
        item_at(a, it, &i, &c);
        const float *plane = a->src + (i * (size_t)s->C + (size_t)c) * HW;
        if (is_strided_pointwise(s)) {
            /* only read: the plane is the input, never written */
            strided_pointwise(0, s, (float *)plane, a->col + (size_t)c * a->ld + i * OHW);
            continue;
        }
        if (a->padded) {
            float P[PAD_MAX_FLOATS];
            pad_plane(P, a, plane);
            for (int k = 0; k < K; k++) {
                const conv_tap *t = &a->taps[k];
                float *row = a->col + ((size_t)c * K + k) * a->ld + i * OHW;
                rows_move(0, P + (size_t)t->kh * a->Wp + t->kw, row, s->OH, s->OW, a->Wp);
            }
            continue;
        }
        float ph[PHASE_MAX_FLOATS];
        int phased = is_phase_path(s);
        if (phased) {
            split_phases(ph, plane, s->H, s->W, a->phases);
        }
        for (int k = 0; k < K; k++) {
            conv_tap own;
            const conv_tap *t = tap_at(a, k, &own);
            const float *src = phased ? ph + (size_t)t->phase * OHW : plane;
            im2col_row(a, src, t, a->col + ((size_t)c * K + k) * a->ld + i * OHW);
        }
    }
}

/* col (C*KH*KW, ld) from n images img (n,C,H,W), side by side: image i in
 * columns [i OH OW, (i + 1) OH OW). */
static void im2col(float *col, size_t ld, const float *img, int n, const mmp_conv_shape *s)
{
    cols_args a = {.col = col, .src = img};
    cols_args_init(&a, s, ld, IM2COL_PADDED_OW);
    mmp_cpu_parallel_for((size_t)n * s->C, cols_grain(s), im2col_range, &a);
}

/* One row of col (tap t) added into its image plane. */
static MMP_CPU_INLINE void col2im_row(const cols_args *a, float *plane, const conv_tap *t,
                                      const float *row)
{
    const mmp_conv_shape *s = a->s;
    for (int oh = 0; oh < s->OH; oh++) {
        int ih = oh * s->stride - s->pad + t->kh;
        if (ih < 0 || ih >= s->H) {
            continue;
        }
        const float *src = row + (size_t)oh * s->OW + t->lo;
        float *dst = plane + (size_t)ih * s->W + (ptrdiff_t)t->lo * s->stride - s->pad + t->kw;
        if (s->stride == 2) {
            /* a constant stride the compiler vectorises (shuffles) */
            for (int i = 0; i < t->hi - t->lo; i++) {
                dst[2 * i] += src[i];
            }
        } else {
            for (int i = 0; i < t->hi - t->lo; i++) {
                dst[(ptrdiff_t)i * s->stride] += src[i];
            }
        }
    }
}

/* Elements of a plane per block of the same-stride-1 col2im: the block and
 * the tap rows' pieces of it stay in L1 while every tap adds into it. */
#define COL2IM_BLOCK 512

/* One image channel (plane, its col rows at rows, stride ld) on the
 * same-stride-1 path: each tap's row adds one contiguous
 * run into the plane (element j takes row[j - off] for j in [j0, j1) + off),
 * after its padding columns were zeroed. The plane goes block by block,
 * every tap's run within a block in turn: each element still takes its
 * contributions in (kh, kw) order, the order a whole run per tap gives. */
static MMP_CPU_INLINE void col2im_channel_same(const cols_args *a, float *plane, float *rows)
{
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t HW = (size_t)s->H * s->W, ld = a->ld;
    float ph[PHASE_MAX_FLOATS];
    int phased = is_phase_path(s);
    if (phased) {
        /* the runs land in the phases (each OH x OW), then back in the plane */
        split_phases(ph, plane, s->H, s->W, a->phases);
        HW = (size_t)s->OH * s->OW;
    }
    for (int k = 0; k < K; k++) {
        conv_tap own;
        const conv_tap *t = tap_at(a, k, &own);
        zero_pad_cols(rows + (size_t)k * ld, t->j1, t->r0, t->lo, t->hi, s->OW);
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
            float *restrict dst = (phased ? ph + (size_t)t->phase * HW : plane) + lo;
            const float *restrict src = rows + (size_t)k * ld + (lo - t->off);
            for (ptrdiff_t i = 0; i < hi - lo; i++) {
                dst[i] += src[i];
            }
        }
    }
    if (phased) {
        join_phases(plane, ph, s->H, s->W, a->phases);
    }
}

/* Images += col's items [lo, hi) scattered back; padding is dropped.
 * Each image element takes its contributions in (c, kh, kw) order. The
 * same-stride-1 path zeroes col's padding columns first (col is the
 * caller's scratch) and then adds contiguous runs: those zeros land on
 * neighbouring elements, where x + 0 == x (a -0 element becomes +0). */
MMP_CPU_CLONES static void col2im_range(void *p, size_t lo, size_t hi)
{
    const cols_args *a = p;
    const mmp_conv_shape *s = a->s;
    int K = s->KH * s->KW;
    size_t OHW = (size_t)s->OH * s->OW, HW = (size_t)s->H * s->W;
    for (size_t it = lo; it < hi; it++) {
        size_t i;
        int c;
        item_at(a, it, &i, &c);
        float *plane = a->img + (i * (size_t)s->C + (size_t)c) * HW;
        float *rows = a->col + (size_t)c * K * a->ld + i * OHW;
        if (is_strided_pointwise(s)) {
            strided_pointwise(1, s, plane, rows);
            continue;
        }
        if (a->padded) {
            /* each interior element takes its taps in (kh, kw) order; the
             * border takes the padding columns' values and is dropped */
            float P[PAD_MAX_FLOATS];
            pad_plane(P, a, plane);
            for (int k = 0; k < K; k++) {
                const conv_tap *t = &a->taps[k];
                rows_move(1, P + (size_t)t->kh * a->Wp + t->kw, rows + (size_t)k * a->ld, s->OH,
                          s->OW, a->Wp);
            }
            unpad_plane(plane, a, P);
            continue;
        }
        if (is_same_stride1(s) || is_phase_path(s)) {
            col2im_channel_same(a, plane, rows);
            continue;
        }
        for (int k = 0; k < K; k++) {
            conv_tap own;
            col2im_row(a, plane, tap_at(a, k, &own), rows + (size_t)k * a->ld);
        }
    }
}

/* n images img (n,C,H,W) += col (C*KH*KW, ld) laid out as im2col's. */
static void col2im_add(float *img, float *col, size_t ld, int n, const mmp_conv_shape *s)
{
    cols_args a = {.col = col, .img = img};
    cols_args_init(&a, s, ld, COL2IM_PADDED_OW);
    mmp_cpu_parallel_for((size_t)n * s->C, cols_grain(s), col2im_range, &a);
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
    int g = group_images(s);
    size_t CHW = (size_t)s->C * s->H * s->W;
    for (int n0 = 0; n0 < s->N; n0 += g) {
        int gn = s->N - n0 < g ? s->N - n0 : g;
        int ld = gn * OHW;
        const float *x = inp + (size_t)n0 * CHW;
        float *y = out + (size_t)n0 * s->OC * OHW;
        /* one image's product lands in place; a group's (OC, ld) in scratch */
        float *yg = g > 1 ? col + (size_t)CKK * g * OHW : y;
        const float *xcol = x;
        if (!is_pointwise(s)) {
            im2col(col, (size_t)ld, x, gn, s);
            xcol = col;
        }
        float beta = 0.0f;
        if (b) {
            for (int o = 0; o < s->OC; o++) {
                for (int i = 0; i < ld; i++) {
                    yg[(size_t)o * ld + i] = b[o];
                }
            }
            beta = 1.0f;
        }
        // yg (OC, ld) = w (OC, CKK) @ xcol (CKK, ld)
        mmp_cpu_gemm(0, 0, s->OC, ld, CKK, 1.0f, w, CKK, xcol, ld, beta, yg, ld);
        for (int i = 0; g > 1 && i < gn; i++) {
            for (int o = 0; o < s->OC; o++) {
                memcpy(y + ((size_t)i * s->OC + o) * OHW, yg + (size_t)o * ld + (size_t)i * OHW,
                       sizeof(float) * (size_t)OHW);
            }
        }
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
    size_t CHW = (size_t)s->C * s->H * s->W;
    int CKK = s->C * s->KH * s->KW;
    int g = group_images(s);
    for (int n0 = 0; n0 < s->N; n0 += g) {
        int gn = s->N - n0 < g ? s->N - n0 : g;
        int ld = gn * OHW;
        const float *dy = dout + (size_t)n0 * s->OC * OHW;
        for (int i = 0; db && i < gn; i++) {
            const float *dyi = dy + (size_t)i * s->OC * OHW;
            for (int o = 0; o < s->OC; o++) {
                float sum = 0.0f;
                for (int j = 0; j < OHW; j++) {
                    sum += dyi[(size_t)o * OHW + j];
                }
                db[o] += sum;
            }
        }
        if (dw) {
            const float *x = inp + (size_t)n0 * CHW;
            const float *xcol = x;
            if (!is_pointwise(s)) {
                im2col(col, (size_t)ld, x, gn, s);
                xcol = col;
            }
            /* one GEMM per image, in image order, whatever the group: dw's sums
             * are those of the image-by-image loop */
            for (int i = 0; i < gn; i++) {
                // dw (OC, CKK) += dy_i (OC, OHW) @ xcol_i^T (OHW, CKK)
                mmp_cpu_gemm(0, 1, s->OC, CKK, OHW, 1.0f, dy + (size_t)i * s->OC * OHW, OHW,
                             xcol + (size_t)i * OHW, ld, 1.0f, dw, CKK);
            }
        }
        if (dinp) {
            float *dx = dinp + (size_t)n0 * CHW;
            if (is_pointwise(s)) {
                // dx (C, HW) += w^T (C, OC) @ dy (OC, HW), one image (no groups)
                mmp_cpu_gemm(1, 0, s->C, OHW, s->OC, 1.0f, w, CKK, dy, OHW, 1.0f, dx, OHW);
            } else {
                const float *dyg = dy;
                if (g > 1) {
                    /* the group's dy (gn,OC,OHW) as (OC, ld), beside its col */
                    float *t = col + (size_t)CKK * g * OHW;
                    for (int i = 0; i < gn; i++) {
                        for (int o = 0; o < s->OC; o++) {
                            memcpy(t + (size_t)o * ld + (size_t)i * OHW,
                                   dy + ((size_t)i * s->OC + o) * OHW, sizeof(float) * (size_t)OHW);
                        }
                    }
                    dyg = t;
                }
                // dcol (CKK, ld) = w^T (CKK, OC) @ dyg (OC, ld), then scattered into dx
                mmp_cpu_gemm(1, 0, CKK, ld, s->OC, 1.0f, w, CKK, dyg, ld, 0.0f, col, ld);
                col2im_add(dx, col, (size_t)ld, gn, s);
            }
        }
    }
    free(owned);
}
