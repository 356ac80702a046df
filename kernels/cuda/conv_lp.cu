/* conv2d at bf16/fp16: products of the rounded operands on the tensor
 * cores, fp32 accumulation and results, as the CPU reference computes them
 * (kernels/cpu.h: products of rounded inputs, fp32 results). cuDNN's legacy
 * API keeps x, w and y of one type, so a bf16 convolution there would round
 * its OUTPUT too. Two ways around that, the context's conv_lp choosing
 * (kernels/cuda.h, MMP_CUDA_CONV_LP):
 *
 * CUDNN (the default): the operands rounded into fp32 copies (the lp
 * workspace), then cuDNN's fp32 convolution with TF32 tensor ops allowed
 * (conv.cu's TF32 plans). A bf16 value (8-bit exponent, 7-bit mantissa)
 * and an fp16 value (5-bit exponent, 10-bit mantissa, subnormals included)
 * are exact in TF32 (8-bit exponent, 10-bit mantissa), so the tensor cores
 * see exactly the rounded values and their products are exact in fp32:
 * the same values as the GEMMs below, cuDNN's implicit GEMM reading the
 * input in place (no im2col matrix), half the tensor cores' bf16 rate.
 * Deterministic: the backward algorithms are cuDNN's deterministic ones,
 * db is cudnnConvolutionBackwardBias of the rounded dout.
 *
 * IM2COL: GEMMs on the tensor cores (gemm.cu's mmp_cuda_gemm_packed:
 * 16-bit operands, fp32 accumulation and output), over an im2col matrix
 * packed straight from the fp32 input with the rounding on the way (exact:
 * the CPU rounds the same values):
 *   col (C*KH*KW, OH*OW) per image, row r = (c*KH + kh)*KW + kw, as the CPU's
 *   forward   out_n (OC, OH*OW) = w (OC, CKK) @ col_n, batched over n
 *   dinp      dcol_n = w^T @ dout_n (fp32, the context's workspace), then a
 *             gather col2im: each input element adds its KH*KW taps in a
 *             fixed order (no atomics)
 *   dw        one GEMM over all images: dout (OC, N*OH*OW) @ col^T
 *   db        per channel, a fixed-order block sum of the rounded dout
 * Same values as rounding then the fp32 conv, up to the fp32 summation
 * order; deterministic. Memory: the packed operands in the lp workspace
 * (2 bytes per im2col element), dcol (4 bytes per element) in the
 * workspace: about 3x a cuDNN workspace, for ResNet-50 at 224^2 and 32
 * images ~350 MB at the first stage's 3x3 convolutions. */
#include "kernels/cuda/internal.cuh"

#include "kernels/cuda/conv_lp_index.cuh" /* the index math, tested on the host too */

/* dst[n * n_stride + r * ld + p] = inp's im2col element (n, r, p) rounded
 * to prec (1 bf16, 2 fp16); zero padding reads 0 (conv_lp_im2col_at).
 * Padding columns of a row (p >= OH*OW) are not written (never read: the
 * GEMMs' K and N stop short). */
static __global__ void im2col_lp_kernel(unsigned short *dst, const float *inp, mmp_conv_shape s,
                                        long long n_stride, int ld, size_t total, int prec)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        size_t at;
        const long long src = conv_lp_im2col_at(s, i, n_stride, ld, &at);
        dst[at] = lp_pack(src >= 0 ? inp[src] : 0.0f, prec);
    }
}

/* Packs inp's im2col matrix (or, with the shape of a 1x1 convolution, an
 * NCHW tensor's (channels, H*W) planes) at dst: per image (n_stride =
 * rows * ld, ld = lp_ld(P)) or all images side by side (n_stride = P,
 * ld = lp_ld(N * P)). */
static mmp_err im2col(mmp_cuda_ctx *ctx, int prec, void *dst, const float *inp,
                      const mmp_conv_shape *s, int merged, mmp_cuda_packed *out)
{
    const int P = s->OH * s->OW, rows = s->C * s->KH * s->KW;
    const int ld = lp_ld(merged ? s->N * P : P);
    const long long n_stride = merged ? P : (long long)rows * ld;
    const size_t total = (size_t)s->N * rows * P;
    out->p = dst;
    out->ld = ld;
    out->stride = n_stride;
    return launch_grid(ctx, im2col_lp_kernel, total, (unsigned short *)dst, inp, *s, n_stride, ld,
                       total, prec);
}

/* Bytes im2col writes for s. */
static size_t im2col_bytes(const mmp_conv_shape *s, int merged)
{
    const int P = s->OH * s->OW, rows = s->C * s->KH * s->KW;
    return merged ? lp_packed_bytes(rows, s->N * P, 1) : lp_packed_bytes(rows, P, s->N);
}

/* out (N,OC,P) = b (OC) broadcast. */
static __global__ void conv_bias_fill_kernel(float *out, const float *b, size_t total, int OC,
                                             int P)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        out[i] = b[(i / P) % OC];
    }
}

/* dinp (N,C,H,W) += the taps of dcol (N, C*KH*KW, OH*OW), kh then kw
 * (conv_lp_col2im_sum). */
static __global__ void col2im_add_kernel(float *dinp, const float *dcol, mmp_conv_shape s,
                                         size_t total)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        dinp[i] += conv_lp_col2im_sum(dcol, s, i);
    }
}

/* db (OC) += the sum of each row of the merged, packed dout (OC, len). */
static __global__ void rowsum_lp_kernel(float *db, const unsigned short *dout, int ld, int len,
                                        int prec)
{
    const unsigned short *row = dout + (size_t)blockIdx.x * ld;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        sum += lp_unpack(row[i], prec);
    }
    sum = block_reduce(sum, sum_op());
    if (threadIdx.x == 0) {
        db[blockIdx.x] += sum;
    }
}

/* The CUDNN path (top comment): rounded fp32 copies of inp and w, then
 * the TF32 plan's forward. */
static mmp_err tf32_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                        const float *b, const mmp_conv_shape *s, int prec)
{
    const size_t ni = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->OC * s->C * s->KH * s->KW;
    void *ws;
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, ws_align(ni * sizeof(float)) + nw * sizeof(float), &ws));
    float *ri = (float *)ws, *rw = (float *)((char *)ws + ws_align(ni * sizeof(float)));
    MMP_TRY(mmp_cuda_round_lp(ctx, ri, inp, ni, prec));
    MMP_TRY(mmp_cuda_round_lp(ctx, rw, w, nw, prec));
    return mmp_cuda_conv2d_fwd_tf32(ctx, out, ri, rw, b, s);
}

/* The CUDNN path's backward: dout rounded, inp rounded for dw, w for dinp. */
static mmp_err tf32_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const mmp_conv_shape *s, int prec)
{
    const size_t ni = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->OC * s->C * s->KH * s->KW;
    const size_t nd = (size_t)s->N * s->OC * s->OH * s->OW;
    const size_t d_bytes = ws_align(nd * sizeof(float));
    const size_t i_bytes = dw ? ws_align(ni * sizeof(float)) : 0;
    const size_t w_bytes = dinp ? nw * sizeof(float) : 0;
    void *ws;
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, d_bytes + i_bytes + w_bytes, &ws));
    float *rd = (float *)ws;
    const float *ri = inp, *rw = w; /* as given where unused (no dw, no dinp) */
    MMP_TRY(mmp_cuda_round_lp(ctx, rd, dout, nd, prec));
    if (dw) {
        float *r = (float *)((char *)ws + d_bytes);
        MMP_TRY(mmp_cuda_round_lp(ctx, r, inp, ni, prec));
        ri = r;
    }
    if (dinp) {
        float *r = (float *)((char *)ws + d_bytes + i_bytes);
        MMP_TRY(mmp_cuda_round_lp(ctx, r, w, nw, prec));
        rw = r;
    }
    return mmp_cuda_conv2d_bwd_tf32(ctx, dinp, dw, db, rd, ri, rw, s);
}

void mmp_cuda_set_conv_lp(mmp_cuda_ctx *ctx, mmp_cuda_conv_lp path)
{
    ctx->conv_lp = path;
}

#define SHAPE_OK(s)                                                                                \
    ((s)->N > 0 && (s)->C > 0 && (s)->OC > 0 && (s)->KH > 0 && (s)->KW > 0 && (s)->stride > 0 &&   \
     (s)->pad >= 0 && (s)->OH > 0 && (s)->OW > 0)

mmp_err mmp_cuda_conv2d_fwd_lp(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                               const float *b, const mmp_conv_shape *s, int prec)
{
    // out (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW), b (OC) or NULL
    ARG_CHECK(prec >= 0 && prec <= 2);
    if (prec == 0) {
        return mmp_cuda_conv2d_fwd(ctx, out, inp, w, b, s);
    }
    ARG_CHECK(SHAPE_OK(s));
    if (ctx->conv_lp == MMP_CUDA_CONV_LP_CUDNN) {
        return tf32_fwd(ctx, out, inp, w, b, s, prec);
    }
    const int P = s->OH * s->OW, CKK = s->C * s->KH * s->KW;
    const size_t w_bytes = lp_packed_bytes(s->OC, CKK, 1);
    void *ws;
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, w_bytes + im2col_bytes(s, 0), &ws));
    mmp_cuda_packed pw, pc;
    const mmp_conv_shape w_shape = conv_lp_plain(1, s->OC, 1, CKK); /* w: OC rows of CKK */
    MMP_TRY(im2col(ctx, prec, ws, w, &w_shape, 0, &pw));
    pw.stride = 0; /* every image's GEMM reads the same weights */
    MMP_TRY(im2col(ctx, prec, (char *)ws + w_bytes, inp, s, 0, &pc));
    float beta = 0.0f;
    if (b) {
        const size_t total = (size_t)s->N * s->OC * P;
        MMP_TRY(launch_grid(ctx, conv_bias_fill_kernel, total, out, b, total, s->OC, P));
        beta = 1.0f;
    }
    // out_n (OC, P) = w (OC, CKK) @ col_n (CKK, P)
    return mmp_cuda_gemm_packed(ctx, prec, 0, 0, s->OC, P, CKK, 1.0f, pw, pc, beta, out, P,
                                (long long)s->OC * P, s->N);
}

mmp_err mmp_cuda_conv2d_bwd_lp(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const mmp_conv_shape *s, int prec)
{
    // dinp (N,C,H,W) +=, dw (OC,C,KH,KW) +=, db (OC) +=, dout (N,OC,OH,OW)
    ARG_CHECK(prec >= 0 && prec <= 2);
    if (prec == 0) {
        return mmp_cuda_conv2d_bwd(ctx, dinp, dw, db, dout, inp, w, s);
    }
    ARG_CHECK(SHAPE_OK(s));
    if (ctx->conv_lp == MMP_CUDA_CONV_LP_CUDNN) {
        return tf32_bwd(ctx, dinp, dw, db, dout, inp, w, s, prec);
    }
    const int P = s->OH * s->OW, CKK = s->C * s->KH * s->KW;
    const mmp_conv_shape d_shape = conv_lp_plain(s->N, s->OC, s->OH, s->OW);
    const mmp_conv_shape w_shape = conv_lp_plain(1, s->OC, 1, CKK); /* w: OC rows of CKK */
    /* the lp workspace: dout merged (dw, db), then for dw the merged
     * im2col, for dinp w and dout per image */
    const size_t dm_bytes = im2col_bytes(&d_shape, 1);
    const size_t cm_bytes = dw ? im2col_bytes(s, 1) : 0;
    const size_t w_bytes = dinp ? lp_packed_bytes(s->OC, CKK, 1) : 0;
    const size_t dn_bytes = dinp ? im2col_bytes(&d_shape, 0) : 0;
    void *ws, *fws = NULL;
    if (dinp) {
        /* dcol first: growing one workspace never moves the other */
        MMP_TRY(mmp_cuda_ws_get(ctx, sizeof(float) * (size_t)s->N * CKK * P, &fws));
    }
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, dm_bytes + cm_bytes + w_bytes + dn_bytes, &ws));
    char *at = (char *)ws;
    mmp_cuda_packed pdm, pcm, pw, pdn;
    if (dw || db) {
        MMP_TRY(im2col(ctx, prec, at, dout, &d_shape, 1, &pdm));
    }
    if (dw) {
        MMP_TRY(im2col(ctx, prec, at + dm_bytes, inp, s, 1, &pcm));
        // dw (OC, CKK) += dout (OC, N*P) @ col^T (N*P, CKK)
        MMP_TRY(mmp_cuda_gemm_packed(ctx, prec, 0, 1, s->OC, CKK, s->N * P, 1.0f, pdm, pcm, 1.0f,
                                     dw, CKK, 0, 1));
    }
    if (db) {
        rowsum_lp_kernel<<<s->OC, BLOCK, 0, ctx->stream>>>(db, (const unsigned short *)pdm.p,
                                                           pdm.ld, s->N * P, prec);
        LAUNCH_CHECK();
    }
    if (dinp) {
        MMP_TRY(im2col(ctx, prec, at + dm_bytes + cm_bytes, w, &w_shape, 0, &pw));
        pw.stride = 0;
        MMP_TRY(im2col(ctx, prec, at + dm_bytes + cm_bytes + w_bytes, dout, &d_shape, 0, &pdn));
        float *dcol = (float *)fws;
        // dcol_n (CKK, P) = w^T (CKK, OC) @ dout_n (OC, P)
        MMP_TRY(mmp_cuda_gemm_packed(ctx, prec, 1, 0, CKK, P, s->OC, 1.0f, pw, pdn, 0.0f, dcol, P,
                                     (long long)CKK * P, s->N));
        const size_t total = (size_t)s->N * s->C * s->H * s->W;
        MMP_TRY(launch_grid(ctx, col2im_add_kernel, total, dinp, (const float *)dcol, *s, total));
    }
    return MMP_OK;
}
