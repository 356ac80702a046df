/* CUDA kernels: the device twin of every op in kernels/cpu.h.
 *
 * Each mmp_cuda_<op> takes the same arguments as mmp_cpu_<op>, on device
 * pointers, with the context first, and follows the same conventions:
 * forward functions overwrite their outputs, backward functions ACCUMULATE
 * (+=) into every gradient they are given, and a NULL gradient pointer skips
 * that gradient. tests/gpu_kernels.c holds each one to its CPU twin.
 *
 * Contracts shared by every op below:
 *  - Work is queued on the context's stream and the call returns without
 *    waiting for it, except where a result comes back through a HOST pointer
 *    (mmp_cuda_infonce_fwd, mmp_cuda_bce_fwd, mmp_cuda_sumsq, the d2h copy):
 *    those wait for the stream.
 *  - Device pointers must belong to the context's device, which must be the
 *    calling thread's current device (mmp_cuda_ctx_create makes it so).
 *  - Returns MMP_OK, MMP_ERR_INVALID for a shape the op cannot take (nothing
 *    is queued then), or MMP_ERR_CUDA / MMP_ERR_NOMEM naming the failed call
 *    (mmp_last_error()). After MMP_ERR_CUDA the outputs are undefined.
 *  - All arithmetic is fp32 without TF32 (cuBLAS default math, cuDNN FMA
 *    math), so results agree with the CPU reference to fp32 rounding; the
 *    *_lp GEMMs and attention with prec bf16/fp16 multiply 16-bit copies of
 *    operands rounded to that precision on the tensor cores, accumulating in
 *    fp32 (exact products: the same agreement).
 *  - A context is not thread-safe: one thread uses it at a time.
 *
 * Scratch memory comes from the context's workspace and, for the bf16/fp16
 * products' 16-bit operands, its lp workspace; both grow on demand (the
 * only cudaMallocs outside mmp_cuda_malloc besides cuBLAS's own workspace,
 * made once with the context; a growth happens on the first call of a new,
 * larger shape and waits for the device). This header needs no CUDA
 * header, so C code includes it as is; it is only linked where the build
 * defines MMP_HAVE_CUDA. */
#ifndef MMP_KERNELS_CUDA_H
#define MMP_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the headers below are C and declare no linkage themselves */
#endif

#include "common/err.h"
#include "kernels/shape.h" /* mmp_conv_shape */

/* ---- context ------------------------------------------------------------ */
typedef struct mmp_cuda_ctx mmp_cuda_ctx;

/* Devices visible to this process; 0 when there is no device or no driver.
 * Never fails and never aborts. */
int mmp_cuda_device_count(void);
/* Device d's name and total memory (for `mmpipe devices`). */
mmp_err mmp_cuda_device_info(int d, char *name, size_t name_size, size_t *total_bytes);

/* Makes device current for this thread and creates a context on it: a
 * stream, cuBLAS and cuDNN handles bound to that stream, and an empty
 * workspace. *out is NULL on failure. */
mmp_err mmp_cuda_ctx_create(mmp_cuda_ctx **out, int device);
/* Waits for the context's stream and frees everything; NULL-safe. */
void mmp_cuda_ctx_destroy(mmp_cuda_ctx *ctx);
/* The context's device ordinal and its cudaStream_t (as void *, so that
 * this header needs no CUDA header), for code that queues its own work. */
int mmp_cuda_ctx_device(const mmp_cuda_ctx *ctx);
void *mmp_cuda_ctx_stream(const mmp_cuda_ctx *ctx);

/* ---- memory ------------------------------------------------------------- */
/* Device memory on the current device; *out is NULL for bytes == 0 and on
 * failure (MMP_ERR_NOMEM names the size). The caller owns it. */
mmp_err mmp_cuda_malloc(void **out, size_t bytes);
/* NULL-safe. Waits for the device (cudaFree does). */
mmp_err mmp_cuda_free(void *p);
/* Copies on the context's stream, after the work already queued there, and
 * return when the copy is complete (src may be reused, dst may be read). */
mmp_err mmp_cuda_memcpy_h2d(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);
mmp_err mmp_cuda_memcpy_d2h(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);
/* Queued on the context's stream; does not wait. */
mmp_err mmp_cuda_memcpy_d2d(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);
mmp_err mmp_cuda_memset(mmp_cuda_ctx *ctx, void *dst, int value, size_t bytes);
/* Waits for everything queued on the context's stream. */
mmp_err mmp_cuda_sync(mmp_cuda_ctx *ctx);

/* The context's device arena: bytes (256-aligned) carved from chunks of at
 * least MMP_CUDA_ARENA_CHUNK bytes, cudaMalloc'd as needed and freed only by
 * mmp_cuda_ctx_destroy, so a stage allocates once at set-up, never frees
 * (cudaFree would wait for the device) and knows its device memory:
 * mmp_cuda_ctx_device_bytes = chunks reserved + workspace. Memory from the
 * arena is never passed to mmp_cuda_free. *out NULL on failure (NOMEM). */
#define MMP_CUDA_ARENA_CHUNK ((size_t)64 << 20)
mmp_err mmp_cuda_arena_alloc(mmp_cuda_ctx *ctx, void **out, size_t bytes);
size_t mmp_cuda_ctx_device_bytes(const mmp_cuda_ctx *ctx);
/* An asynchronous host -> device copy on the context's stream (src should
 * be page-locked), and the wait for every one queued so far (an event
 * recorded after the last). */
mmp_err mmp_cuda_upload(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);
mmp_err mmp_cuda_upload_wait(mmp_cuda_ctx *ctx);
/* Page-locked host memory (cudaHostAlloc), zeroed; NULL on failure. */
void *mmp_cuda_host_alloc(size_t bytes);
void mmp_cuda_host_free(void *p);

/* ---- GEMM (cuBLAS) -------------------------------------------------------- */
/* Row-major C (M,N) = alpha * op(A) @ op(B) + beta * C, op(A) (M,K), op(B) (K,N). */
mmp_err mmp_cuda_gemm(mmp_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc);

/* The same with A and B rounded to prec (0 fp32: mmp_cuda_gemm; 1 bf16, 2
 * fp16: tensor cores from 16-bit copies in the context's lp workspace, fp32
 * accumulation and C; deterministic; gemm.cu says how). */
mmp_err mmp_cuda_gemm_lp(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                         float *C, int ldc);

/* ---- linear --------------------------------------------------------------- */
/* out (N,OC) = inp (N,C) @ w^T + b;  w (OC,C), b (OC) or NULL. */
mmp_err mmp_cuda_linear_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                            const float *b, int N, int C, int OC);
/* dinp (N,C) += dout @ w;  dw (OC,C) += dout^T @ inp;  db (OC) += sum_n dout. */
mmp_err mmp_cuda_linear_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);

/* As above with inp, w (and dout) rounded to prec first (the semantics of
 * nn/lowp.h's rounding then the fp32 op; b, db and every gradient fp32, db
 * sums the rounded dout): bf16/fp16 GEMMs on the tensor cores. */
mmp_err mmp_cuda_linear_fwd_lp(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                               const float *b, int N, int C, int OC, int prec);
mmp_err mmp_cuda_linear_bwd_lp(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w, int N, int C,
                               int OC, int prec);

/* ---- conv2d (cuDNN) ------------------------------------------------------- */
/* As mmp_cpu_conv2d_*, without the scratch argument: cuDNN's workspace is
 * the context's. The algorithm for each shape is chosen once and cached in
 * the context. */
mmp_err mmp_cuda_conv2d_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                            const float *b, const mmp_conv_shape *s);
mmp_err mmp_cuda_conv2d_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const mmp_conv_shape *s);

/* As above with inp, w (and dout) rounded to prec first (1 bf16, 2 fp16; 0
 * is the fp32 cuDNN path above): products of the rounded values, fp32
 * accumulation and outputs, deterministic, by the context's conv_lp path
 * (below). Uses the lp workspace (and cuDNN's, or for dinp
 * N*C*KH*KW*OH*OW floats of the workspace). */
mmp_err mmp_cuda_conv2d_fwd_lp(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                               const float *b, const mmp_conv_shape *s, int prec);
mmp_err mmp_cuda_conv2d_bwd_lp(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const mmp_conv_shape *s, int prec);

/* How conv2d_*_lp computes (conv_lp.cu's top comment):
 *  CUDNN   the rounded operands as fp32 through cuDNN with TF32 tensor
 *          ops allowed: a bf16 or fp16 value is exact in TF32 (8-bit
 *          exponent, 10-bit mantissa), so the products are those of the
 *          rounded values, accumulated in fp32 (implicit GEMM, no im2col
 *          matrix); the default
 *  IM2COL  im2col into 16-bit storage, then tensor-core GEMMs (gemm.cu)
 * A context takes MMP_CUDA_CONV_LP=cudnn|im2col from the environment when
 * it is made (anything else there is an error of mmp_cuda_ctx_create). */
typedef enum mmp_cuda_conv_lp {
    MMP_CUDA_CONV_LP_CUDNN = 0,
    MMP_CUDA_CONV_LP_IM2COL = 1,
} mmp_cuda_conv_lp;
void mmp_cuda_set_conv_lp(mmp_cuda_ctx *ctx, mmp_cuda_conv_lp path);

/* ---- batch norm ----------------------------------------------------------- */
mmp_err mmp_cuda_batchnorm_fwd_train(mmp_cuda_ctx *ctx, float *out, float *mean, float *rstd,
                                     float *running_mean, float *running_var, const float *inp,
                                     const float *gamma, const float *beta, int N, int C, int HW,
                                     float eps, float momentum);
mmp_err mmp_cuda_batchnorm_fwd_infer(mmp_cuda_ctx *ctx, float *out, const float *inp,
                                     const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var, int N,
                                     int C, int HW, float eps);
mmp_err mmp_cuda_batchnorm_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dgamma, float *dbeta,
                               const float *dout, const float *inp, const float *mean,
                               const float *rstd, const float *gamma, int N, int C, int HW);

/* ---- elementwise ---------------------------------------------------------- */
mmp_err mmp_cuda_relu_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, size_t n);
mmp_err mmp_cuda_relu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                          size_t n);
mmp_err mmp_cuda_gelu_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, size_t n);
mmp_err mmp_cuda_gelu_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *inp,
                          size_t n);
mmp_err mmp_cuda_add(mmp_cuda_ctx *ctx, float *out, const float *a, const float *b, size_t n);
mmp_err mmp_cuda_scale(mmp_cuda_ctx *ctx, float *x, float s, size_t n);
/* As mmp_cpu_transpose: out (B,C,R) = (or +=) inp (B,R,C), last two axes swapped. */
mmp_err mmp_cuda_transpose(mmp_cuda_ctx *ctx, float *out, const float *inp, int B, int R, int C,
                           int accumulate);
/* acc (n) += x (n) in double;  x (n) = (float) acc (n). */
mmp_err mmp_cuda_acc_f64(mmp_cuda_ctx *ctx, double *acc, const float *x, size_t n);
mmp_err mmp_cuda_round_f64(mmp_cuda_ctx *ctx, float *x, const double *acc, size_t n);

/* ---- pooling -------------------------------------------------------------- */
mmp_err mmp_cuda_maxpool2d_fwd(mmp_cuda_ctx *ctx, float *out, int32_t *argmax, const float *inp,
                               int N, int C, int H, int W, int k, int stride, int pad, int OH,
                               int OW);
/* Deterministic: each plane's outputs add in row-major order (no atomics). */
mmp_err mmp_cuda_maxpool2d_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, int N, int C, int H, int W, int k, int stride,
                               int pad, int OH, int OW);
mmp_err mmp_cuda_meanpool_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *mask,
                              int B, int T, int C);
mmp_err mmp_cuda_meanpool_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *mask,
                              int B, int T, int C);

/* ---- layer norm ----------------------------------------------------------- */
mmp_err mmp_cuda_layernorm_fwd(mmp_cuda_ctx *ctx, float *out, float *mean, float *rstd,
                               const float *inp, const float *w, const float *b, int N, int C,
                               float eps);
mmp_err mmp_cuda_layernorm_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);

/* ---- embedding ------------------------------------------------------------ */
/* ids in [0,V) as for the CPU (not checked on the device). */
mmp_err mmp_cuda_embedding_fwd(mmp_cuda_ctx *ctx, float *out, const int32_t *ids, const float *wte,
                               const float *wpe, int B, int T, int C);
/* dwte rows of repeated ids add in position order (no atomics): deterministic. */
mmp_err mmp_cuda_embedding_bwd(mmp_cuda_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                               const int32_t *ids, int B, int T, int C);

/* ---- low precision -------------------------------------------------------- */
/* prec 0 fp32 (a copy), 1 bf16, 2 fp16: kernels/cpu/precision.c's bits,
 * NaN included (round to nearest even; every NaN narrows to 0x7fff). */
mmp_err mmp_cuda_round_lp(mmp_cuda_ctx *ctx, float *dst, const float *src, size_t n, int prec);
mmp_err mmp_cuda_pack_lp(mmp_cuda_ctx *ctx, void *dst, const float *src, size_t n, int prec);
mmp_err mmp_cuda_unpack_lp(mmp_cuda_ctx *ctx, float *dst, const void *src, size_t n, int prec);

/* ---- attention ------------------------------------------------------------ */
/* C % NH == 0. Backward uses B*NH*Tq*Tk floats of workspace. prec rounds the
 * probabilities and the score gradients as the CPU does. */
mmp_err mmp_cuda_attention_fwd(mmp_cuda_ctx *ctx, float *out, float *att, const float *q,
                               const float *k, const float *v, const float *key_mask, int B, int Tq,
                               int Tk, int C, int NH, int prec);
mmp_err mmp_cuda_attention_bwd(mmp_cuda_ctx *ctx, float *dq, float *dk, float *dv,
                               const float *dout, const float *att, const float *q, const float *k,
                               const float *v, int B, int Tq, int Tk, int C, int NH, int prec);

/* ---- softmax / normalisation ---------------------------------------------- */
mmp_err mmp_cuda_softmax_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, int rows, int cols);
mmp_err mmp_cuda_softmax_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                             int rows, int cols);
mmp_err mmp_cuda_l2norm_fwd(mmp_cuda_ctx *ctx, float *out, float *norm, const float *inp, int N,
                            int C, float eps);
mmp_err mmp_cuda_l2norm_bwd(mmp_cuda_ctx *ctx, float *dinp, const float *dout, const float *out,
                            const float *norm, int N, int C, float eps);

/* ---- losses --------------------------------------------------------------- */
/* *loss (HOST) = the symmetric InfoNCE loss; waits for the stream. */
mmp_err mmp_cuda_infonce_fwd(mmp_cuda_ctx *ctx, float *loss, float *sim, float *p_i2t, float *p_t2i,
                             const float *img, const float *txt, float logit_scale, int B, int C);
/* dlogit_scale is a DEVICE pointer (1 float), as the parameter's gradient. */
mmp_err mmp_cuda_infonce_bwd(mmp_cuda_ctx *ctx, float *dimg, float *dtxt, float *dlogit_scale,
                             const float *sim, const float *p_i2t, const float *p_t2i,
                             const float *img, const float *txt, float logit_scale, float dloss,
                             int B, int C);
/* *loss (HOST) = mean BCE with logits; waits for the stream. */
mmp_err mmp_cuda_bce_fwd(mmp_cuda_ctx *ctx, float *loss, const float *logits, const float *labels,
                         int n);
mmp_err mmp_cuda_bce_bwd(mmp_cuda_ctx *ctx, float *dlogits, const float *logits,
                         const float *labels, float dloss, int n);

/* ---- optimizer ------------------------------------------------------------ */
mmp_err mmp_cuda_adamw(mmp_cuda_ctx *ctx, float *param, const float *grad, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                       int t);
/* *out (HOST) = sum of x^2 in double, in a fixed order; waits for the stream. */
mmp_err mmp_cuda_sumsq(mmp_cuda_ctx *ctx, double *out, const float *x, size_t n);
/* out[i] (HOST) = mmp_cuda_sumsq of x[i] (n[i] floats) for i < count, bit for
 * bit, with one wait for the stream for all of them (a gradient norm over a
 * network's tensors: one host synchronisation a step, not one a tensor). */
mmp_err mmp_cuda_sumsq_many(mmp_cuda_ctx *ctx, double *out, const float *const *x, const size_t *n,
                            int count);

#ifdef __cplusplus
}
#endif

#endif
