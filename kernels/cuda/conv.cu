/* 2-D convolution through cuDNN's legacy convolution API (NCHW, fp32).
 *
 * Each shape gets a plan: descriptors plus one algorithm per direction,
 * chosen once by cuDNN's heuristics and cached in the context. The fp32
 * descriptors ask for FMA math (no TF32), and FFT / Winograd algorithms are
 * passed over: their fp32 error is larger than the 1e-4 by which the CPU
 * reference judges this file. The TF32 plans (mmp_cuda_conv2d_*_tf32, for
 * operands already rounded to bf16/fp16, which TF32 holds exactly) ask for
 * the default math, under which cuDNN may use TF32 tensor ops for fp32 data
 * (never a conversion to fp16: that takes
 * CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, refused below), and pass over FFT /
 * Winograd too: they transform the operands, so the products would no
 * longer be those of the rounded values. Every direction's algorithm must
 * also be CUDNN_DETERMINISTIC (backward data ALGO_0 and filter ALGO_0 /
 * ALGO_3 add with atomics), so the fallbacks are the deterministic
 * IMPLICIT_GEMM forward and ALGO_1 backward. A choice asking for more than
 * CONV_WS_CAP of workspace is passed over too (a fixed cap: see there).
 * Backward accumulates with beta = 1, as every backward in kernels/ does. */
#include "kernels/cuda/internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fwd_algo_ok(cudnnConvolutionFwdAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}

static int bwd_data_algo_ok(cudnnConvolutionBwdDataAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}

static int bwd_filter_algo_ok(cudnnConvolutionBwdFilterAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/* The math an algorithm of a plan may use: FMA for fp32; for TF32 plans
 * also tensor ops, never a down-conversion of the fp32 operands. */
static int math_ok(cudnnMathType_t m, int tf32)
{
    return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH || (tf32 && m == CUDNN_TENSOR_OP_MATH);
}

static void plan_fini(mmp_cuda_conv_plan *p)
{
    if (p->x) {
        cudnnDestroyTensorDescriptor(p->x);
    }
    if (p->y) {
        cudnnDestroyTensorDescriptor(p->y);
    }
    if (p->bias) {
        cudnnDestroyTensorDescriptor(p->bias);
    }
    if (p->w) {
        cudnnDestroyFilterDescriptor(p->w);
    }
    if (p->conv) {
        cudnnDestroyConvolutionDescriptor(p->conv);
    }
    memset(p, 0, sizeof *p);
}

void mmp_cuda_conv_plans_clear(mmp_cuda_ctx *ctx)
{
    for (int i = 0; i < ctx->n_conv; i++) {
        plan_fini(&ctx->conv[i]);
    }
    ctx->n_conv = 0;
    ctx->conv_next = 0;
}

/* The most workspace an algorithm may ask for: a fixed figure, never the
 * memory free at the time, so that every process of a job (the pipeline's
 * stages and the single process it must equal bitwise) picks the same
 * algorithm for the same shape, however full the GPU is. An explicit im2col
 * GEMM forward, the hungriest of the algorithms allowed here, asks
 * N*C*KH*KW*OH*OW*4 bytes: 220 MiB for ResNet-50's 3x3, 64-channel
 * convolution at 56^2 and batch 32, well under the cap. The fallbacks
 * (implicit GEMM forward, ALGO_1 backward) are taken whatever they ask. */
#define CONV_WS_CAP ((size_t)1 << 30)

/* The first of cuDNN's ranked choices perf[0..got) that ran, passes ok and
 * math_ok, is deterministic and asks for at most CONV_WS_CAP bytes of
 * workspace; else fallback. *math:
 * the math to run it with: FMA on fp32 plans whatever cuDNN says (its
 * default math would allow TF32 for fp32 data); on TF32 plans the choice's
 * own (as cuDNN's samples and PyTorch set it), the default for fallback. */
template <typename Perf, typename Algo>
static Algo first_algo(const Perf *perf, int got, int (*ok)(Algo), int tf32, Algo fallback,
                       cudnnMathType_t *math)
{
    *math = tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    for (int i = 0; i < got; i++) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS && ok(perf[i].algo) &&
            perf[i].determinism == CUDNN_DETERMINISTIC && math_ok(perf[i].mathType, tf32) &&
            perf[i].memory <= CONV_WS_CAP) {
            if (tf32) {
                *math = perf[i].mathType;
            }
            return perf[i].algo;
        }
    }
    return fallback;
}

/* The first heuristic choice that passes the filters above, else fallback. */
static mmp_err choose_algos(mmp_cuda_ctx *ctx, mmp_cuda_conv_plan *p)
{
    /* each direction asks with the plan's own math set, then its choice's */
    const cudnnMathType_t base = p->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CU_TRY(cudnnSetConvolutionMathType(p->conv, base));
    CU_TRY(cudnnGetConvolutionForwardAlgorithm_v7(ctx->cudnn, p->x, p->w, p->conv, p->y,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fwd));
    /* forward too takes only what cuDNN reports deterministic (a split-K
     * tensor-op kernel may add its parts in any order; and another cuDNN
     * or GPU may rank such a kernel first for fp32 as well) */
    p->fwd = first_algo(fwd, got, fwd_algo_ok, p->tf32, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                        &p->fwd_math);
    CU_TRY(cudnnSetConvolutionMathType(p->conv, p->fwd_math));
    CU_TRY(cudnnGetConvolutionForwardWorkspaceSize(ctx->cudnn, p->x, p->w, p->conv, p->y, p->fwd,
                                                   &p->fwd_ws));

    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CU_TRY(cudnnSetConvolutionMathType(p->conv, base));
    CU_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        ctx->cudnn, p->w, p->y, p->conv, p->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd));
    p->bwd_data = first_algo(bd, got, bwd_data_algo_ok, p->tf32, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                             &p->bwd_data_math);
    CU_TRY(cudnnSetConvolutionMathType(p->conv, p->bwd_data_math));
    CU_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx->cudnn, p->w, p->y, p->conv, p->x,
                                                        p->bwd_data, &p->bwd_data_ws));

    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CU_TRY(cudnnSetConvolutionMathType(p->conv, base));
    CU_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        ctx->cudnn, p->x, p->y, p->conv, p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf));
    p->bwd_filter = first_algo(bf, got, bwd_filter_algo_ok, p->tf32,
                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, &p->bwd_filter_math);
    CU_TRY(cudnnSetConvolutionMathType(p->conv, p->bwd_filter_math));
    CU_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx->cudnn, p->x, p->y, p->conv, p->w,
                                                          p->bwd_filter, &p->bwd_filter_ws));
    return MMP_OK;
}

/* With MMP_CUDA_PROFILE set (backend.c's op table), one line per plan on
 * stderr: the algorithm, math (0 default, 1 tensor ops, 3 FMA) and
 * workspace of each direction, to read the table's conv rows by. */
static void plan_log(const mmp_cuda_conv_plan *p)
{
    const char *e = getenv("MMP_CUDA_PROFILE");
    if (!e || !e[0] || strcmp(e, "0") == 0) {
        return;
    }
    const mmp_conv_shape *s = &p->shape;
    fprintf(stderr,
            "cuda conv plan%s (%d,%d,%d,%d) k%dx%d s%d p%d -> %d: fwd algo %d math %d ws %zu, "
            "bwd data algo %d math %d ws %zu, bwd filter algo %d math %d ws %zu\n",
            p->tf32 ? " tf32" : "", s->N, s->C, s->H, s->W, s->KH, s->KW, s->stride, s->pad, s->OC,
            (int)p->fwd, (int)p->fwd_math, p->fwd_ws, (int)p->bwd_data, (int)p->bwd_data_math,
            p->bwd_data_ws, (int)p->bwd_filter, (int)p->bwd_filter_math, p->bwd_filter_ws);
}

/* Fills a zeroed plan for shape s (tf32: TF32 tensor ops allowed); on
 * failure what was made is left for plan_fini. */
static mmp_err plan_init(mmp_cuda_ctx *ctx, mmp_cuda_conv_plan *p, const mmp_conv_shape *s,
                         int tf32)
{
    p->shape = *s;
    p->tf32 = tf32;
    CU_TRY(cudnnCreateTensorDescriptor(&p->x));
    CU_TRY(cudnnCreateTensorDescriptor(&p->y));
    CU_TRY(cudnnCreateTensorDescriptor(&p->bias));
    CU_TRY(cudnnCreateFilterDescriptor(&p->w));
    CU_TRY(cudnnCreateConvolutionDescriptor(&p->conv));
    CU_TRY(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->N, s->C, s->H,
                                      s->W));
    CU_TRY(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->N, s->OC, s->OH,
                                      s->OW));
    CU_TRY(
        cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, s->OC, 1, 1));
    CU_TRY(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->OC, s->C, s->KH,
                                      s->KW));
    CU_TRY(cudnnSetConvolution2dDescriptor(p->conv, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                           CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    int n, c, h, w;
    CU_TRY(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &c, &h, &w));
    if (n != s->N || c != s->OC || h != s->OH || w != s->OW) {
        return mmp_errorf(MMP_ERR_INTERNAL,
                          "conv2d: cuDNN's output (%d,%d,%d,%d) is not (%d,%d,%d,%d)", n, c, h, w,
                          s->N, s->OC, s->OH, s->OW);
    }
    MMP_TRY(choose_algos(ctx, p));
    plan_log(p);
    return MMP_OK;
}

/* The cached plan for s (tf32: a TF32 plan), made on first use; the oldest
 * goes when all are taken. */
static mmp_err plan_get(mmp_cuda_ctx *ctx, const mmp_conv_shape *s, int tf32,
                        mmp_cuda_conv_plan **out)
{
    ARG_CHECK(s->N > 0 && s->C > 0 && s->H > 0 && s->W > 0 && s->OC > 0 && s->KH > 0 && s->KW > 0 &&
              s->stride > 0 && s->pad >= 0);
    ARG_CHECK(s->OH == (s->H + 2 * s->pad - s->KH) / s->stride + 1 && s->OH > 0);
    ARG_CHECK(s->OW == (s->W + 2 * s->pad - s->KW) / s->stride + 1 && s->OW > 0);
    for (int i = 0; i < ctx->n_conv; i++) {
        if (ctx->conv[i].tf32 == tf32 && memcmp(&ctx->conv[i].shape, s, sizeof *s) == 0) {
            *out = &ctx->conv[i];
            return MMP_OK;
        }
    }
    mmp_cuda_conv_plan *p = NULL;
    if (ctx->n_conv < MMP_CUDA_CONV_PLANS) {
        p = &ctx->conv[ctx->n_conv];
    } else {
        p = &ctx->conv[ctx->conv_next];
        ctx->conv_next = (ctx->conv_next + 1) % MMP_CUDA_CONV_PLANS;
        plan_fini(p);
    }
    mmp_err ret = plan_init(ctx, p, s, tf32);
    if (ret != MMP_OK) {
        plan_fini(p);
        if (p != &ctx->conv[ctx->n_conv]) {
            /* an evicted slot left empty: keep the table dense */
            *p = ctx->conv[ctx->n_conv - 1];
            memset(&ctx->conv[ctx->n_conv - 1], 0, sizeof *p);
            ctx->n_conv--;
        }
        return mmp_error_prefix(ret, "conv2d%s plan (%d,%d,%d,%d) k%dx%d s%d p%d -> %d",
                                tf32 ? " (TF32)" : "", s->N, s->C, s->H, s->W, s->KH, s->KW,
                                s->stride, s->pad, s->OC);
    }
    if (ctx->n_conv < MMP_CUDA_CONV_PLANS) {
        ctx->n_conv++;
    }
    *out = p;
    return MMP_OK;
}

/* The context's workspace for an algorithm that asked for bytes of it;
 * *ws stays NULL where it asked for none. */
static mmp_err plan_ws(mmp_cuda_ctx *ctx, size_t bytes, void **ws)
{
    return bytes > 0 ? mmp_cuda_ws_get(ctx, bytes, ws) : MMP_OK;
}

static mmp_err conv_fwd(mmp_cuda_ctx *ctx, int tf32, float *out, const float *inp, const float *w,
                        const float *b, const mmp_conv_shape *s)
{
    // out (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW), b (OC) or NULL
    mmp_cuda_conv_plan *p = NULL;
    MMP_TRY(plan_get(ctx, s, tf32, &p));
    void *ws = NULL;
    MMP_TRY(plan_ws(ctx, p->fwd_ws, &ws));
    const float one = 1.0f, zero = 0.0f;
    CU_TRY(cudnnSetConvolutionMathType(p->conv, p->fwd_math));
    CU_TRY(cudnnConvolutionForward(ctx->cudnn, &one, p->x, inp, p->w, w, p->conv, p->fwd, ws,
                                   p->fwd_ws, &zero, p->y, out));
    if (b) {
        CU_TRY(cudnnAddTensor(ctx->cudnn, &one, p->bias, b, &one, p->y, out));
    }
    return MMP_OK;
}

static mmp_err conv_bwd(mmp_cuda_ctx *ctx, int tf32, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w,
                        const mmp_conv_shape *s)
{
    // dinp (N,C,H,W), dw (OC,C,KH,KW), db (OC), dout (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW)
    mmp_cuda_conv_plan *p = NULL;
    MMP_TRY(plan_get(ctx, s, tf32, &p));
    const float one = 1.0f;
    if (db) {
        CU_TRY(cudnnConvolutionBackwardBias(ctx->cudnn, &one, p->y, dout, &one, p->bias, db));
    }
    if (dw) {
        void *ws = NULL;
        MMP_TRY(plan_ws(ctx, p->bwd_filter_ws, &ws));
        CU_TRY(cudnnSetConvolutionMathType(p->conv, p->bwd_filter_math));
        CU_TRY(cudnnConvolutionBackwardFilter(ctx->cudnn, &one, p->x, inp, p->y, dout, p->conv,
                                              p->bwd_filter, ws, p->bwd_filter_ws, &one, p->w, dw));
    }
    if (dinp) {
        void *ws = NULL;
        MMP_TRY(plan_ws(ctx, p->bwd_data_ws, &ws));
        CU_TRY(cudnnSetConvolutionMathType(p->conv, p->bwd_data_math));
        CU_TRY(cudnnConvolutionBackwardData(ctx->cudnn, &one, p->w, w, p->y, dout, p->conv,
                                            p->bwd_data, ws, p->bwd_data_ws, &one, p->x, dinp));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_conv2d_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                            const float *b, const mmp_conv_shape *s)
{
    return conv_fwd(ctx, 0, out, inp, w, b, s);
}

mmp_err mmp_cuda_conv2d_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const mmp_conv_shape *s)
{
    return conv_bwd(ctx, 0, dinp, dw, db, dout, inp, w, s);
}

mmp_err mmp_cuda_conv2d_fwd_tf32(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                                 const float *b, const mmp_conv_shape *s)
{
    return conv_fwd(ctx, 1, out, inp, w, b, s);
}

mmp_err mmp_cuda_conv2d_bwd_tf32(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                                 const float *dout, const float *inp, const float *w,
                                 const mmp_conv_shape *s)
{
    return conv_bwd(ctx, 1, dinp, dw, db, dout, inp, w, s);
}
