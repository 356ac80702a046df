/* The device backend: the one seam between the model code (nn/) and the
 * kernels of a device. nn/ allocates, copies and computes only through it, so
 * the same model code runs on the CPU reference kernels (kernels/cpu.h,
 * mmp_backend_cpu_ops in kernels/cpu/backend.c) and on the CUDA kernels
 * (kernels/cuda.h, mmp_backend_cuda_ops in kernels/cuda/backend.c, in the
 * CUDA module of a build with MMP_HAVE_CUDA: common/cuda_module.h).
 *
 * An implementation is a const table of function pointers (mmp_backend_ops,
 * written with designated initializers, one exported table per file); a
 * backend INSTANCE (mmp_backend) pairs a table with its device state: NULL for
 * the CPU, an mmp_cuda_ctx (stream, cuBLAS/cuDNN handles, workspace) for CUDA.
 *
 * Contract, shared by every implementation:
 *  - Memory. "Backend memory" is what alloc returned (device memory for CUDA,
 *    64-byte aligned host memory for the CPU). Every tensor pointer an op
 *    takes is backend memory of the same instance, unless its comment says
 *    HOST. alloc returns zeroed memory; the caller owns it and gives it back
 *    with free (NULL-safe). alloc is the only call that fails by return
 *    value. CUDA carves alloc from the instance's arena (kernels/cuda.h):
 *    free returns nothing before the instance is destroyed, so a stage
 *    allocates at set-up, and its device memory is device_bytes.
 *  - Copies. to_device (host -> backend) and to_host (backend -> host) run
 *    after the work already queued and return when the copy is complete, so
 *    the host buffer may be reused or read at once. copy (backend ->
 *    backend) and zero are queued like any op. The CPU backend's copies are
 *    memcpy (a copy onto itself is skipped), so on the CPU a to_host is a
 *    plain read of memory that is already host memory: nn/ copies to the host
 *    only what it must read there (a loss value, the similarity matrix it
 *    mines hard negatives from, batch-norm statistics, checkpoints), never a
 *    whole activation.
 *  - Blocking. Ops are queued on the instance's stream and may return before
 *    the work is done (CUDA); the CPU does everything at once. Ops whose
 *    result comes back through a HOST value (infonce_fwd, bce_fwd, sumsq,
 *    to_host) wait for the stream. sync waits for everything queued.
 *  - Failures. Ops other than alloc return no error: a failed op records the
 *    FIRST error in the instance (mmp_backend_error) and later ops still run
 *    (their outputs are then undefined). Callers check once, after a forward,
 *    backward or optimizer step. The CPU backend never fails. An op a
 *    backend does not implement records MMP_ERR_UNSUPPORTED naming it: never
 *    a silently wrong result.
 *  - Semantics are kernels/cpu.h's, op for op: forward ops overwrite their
 *    outputs, backward ops ACCUMULATE (+=) into every gradient they are given,
 *    a NULL gradient pointer skips that gradient. The CPU backend is bitwise
 *    today's reference kernels; the CUDA backend agrees with it to fp32
 *    rounding and is deterministic (no atomics in backward scatters,
 *    deterministic cuDNN algorithms only).
 *  - Threads: one thread uses an instance at a time (the CPU instance has no
 *    state to race on, so mmp_backend_cpu() is shared). */
#ifndef MMP_KERNELS_BACKEND_H
#define MMP_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h" /* mmp_precision */
#include "common/err.h"
#include "kernels/shape.h"

typedef struct mmp_backend mmp_backend;

typedef struct mmp_backend_ops {
    const char *name; /* "cpu", "cuda" */

    /* ---- instance ------------------------------------------------------ */
    /* Creates the device state for device (ignored by the CPU); *ctx NULL on failure. */
    mmp_err (*open)(void **ctx, int device);
    void (*close)(void *ctx); /* NULL-safe; waits for queued work */

    /* ---- memory -------------------------------------------------------- */
    mmp_err (*alloc)(mmp_backend *be, void **out, size_t bytes); /* zeroed; bytes 0 -> one line */
    void (*free)(mmp_backend *be, void *p);
    void (*zero)(mmp_backend *be, void *dst, size_t bytes);
    void (*to_device)(mmp_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*to_host)(mmp_backend *be, void *dst_host, const void *src, size_t bytes);
    void (*copy)(mmp_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(mmp_backend *be);
    /* Optional (NULL on the CPU): the native stream the ops are queued on
     * (CUDA: cudaStream_t), for code that orders its own work after them (a
     * cuda_ipc channel of the stage); and the device memory this instance
     * holds at most (arena high-water mark + workspace), in bytes. */
    void *(*stream)(mmp_backend *be);
    size_t (*device_bytes)(mmp_backend *be);
    /* Optional (NULL: malloc/free): HOST memory the device copies from and
     * to asynchronously (CUDA: page-locked), for input staging. */
    void *(*host_alloc)(mmp_backend *be, size_t bytes);
    void (*host_free)(mmp_backend *be, void *p);
    /* Optional (NULL: to_device, which waits): a host -> backend copy queued
     * like an op, returning at once; src (host_alloc memory for the copy to
     * be truly asynchronous) must stay unchanged until upload_wait returns,
     * which waits for the uploads queued so far (not for other work queued
     * after them). */
    void (*upload)(mmp_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*upload_wait)(mmp_backend *be);

    /* ---- low precision (kernels/cpu.h's mmp_cpu_*_lp are the spec) ------- */
    /* Mixed precision rounds the inputs of every product (GEMM, linear,
     * conv2d, attention) to prec and accumulates in fp32: nn/ rounds into
     * scratch with round_lp and calls the fp32 op, so the CPU computes
     * exactly what a GPU computing from bf16/fp16 storage computes, up to the
     * fp32 accumulation order. fp32 rounds nothing (a copy, skipped onto
     * itself). */
    // dst (n) = widen(round_prec(src (n))); dst may equal src
    void (*round_lp)(mmp_backend *be, float *dst, const float *src, size_t n, mmp_precision prec);
    // dst (n elements of 2 bytes; 4 for fp32) = src (n) stored in prec; no overlap
    void (*pack_lp)(mmp_backend *be, void *dst, const float *src, size_t n, mmp_precision prec);
    // dst (n) = widen(src (n elements of 2 bytes; 4 for fp32)); no overlap
    void (*unpack_lp)(mmp_backend *be, float *dst, const void *src, size_t n, mmp_precision prec);

    /* ---- GEMM / linear ------------------------------------------------- */
    // C (M,N) = alpha op(A) @ op(B) + beta C, row-major
    void (*gemm)(mmp_backend *be, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
    // out (N,OC), inp (N,C), w (OC,C), b (OC) or NULL
    void (*linear_fwd)(mmp_backend *be, float *out, const float *inp, const float *w,
                       const float *b, int N, int C, int OC);
    // dinp (N,C) +=, dw (OC,C) +=, db (OC) +=, dout (N,OC)
    void (*linear_bwd)(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);
    /* Optional (NULL on the CPU: nn/lowp.h rounds into its scratch and calls
     * linear_fwd/_bwd): linear with inp, w and dout rounded to prec (bf16 or
     * fp16) by the op itself; b, db and the gradients fp32, db sums the
     * rounded dout. Same values as rounding then linear_*, up to the fp32
     * accumulation order (CUDA: tensor-core GEMMs on 16-bit copies). */
    void (*linear_fwd_lp)(mmp_backend *be, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int OC, mmp_precision prec);
    void (*linear_bwd_lp)(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC,
                          mmp_precision prec);

    /* ---- conv2d -------------------------------------------------------- */
    /* Floats of scratch the caller passes to conv2d (CPU: im2col matrices; CUDA: 0,
     * cuDNN uses the context's workspace). scratch may be NULL when it is 0. */
    size_t (*conv2d_scratch_floats)(const mmp_conv_shape *s);
    // out (N,OC,OH,OW), inp (N,C,H,W), w (OC,C,KH,KW), b (OC) or NULL
    void (*conv2d_fwd)(mmp_backend *be, float *out, const float *inp, const float *w,
                       const float *b, const mmp_conv_shape *s, float *scratch);
    void (*conv2d_bwd)(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, const mmp_conv_shape *s, float *scratch);
    /* Optional (NULL on the CPU), as linear_*_lp: conv2d with inp, w and dout
     * rounded to prec by the op (CUDA: im2col GEMMs on the tensor cores);
     * takes no scratch. */
    void (*conv2d_fwd_lp)(mmp_backend *be, float *out, const float *inp, const float *w,
                          const float *b, const mmp_conv_shape *s, mmp_precision prec);
    void (*conv2d_bwd_lp)(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const mmp_conv_shape *s,
                          mmp_precision prec);

    /* ---- batch norm ------------------------------------------------------ */
    // out, inp (N,C,HW); mean, rstd, running_*, gamma, beta (C)
    void (*batchnorm_fwd_train)(mmp_backend *be, float *out, float *mean, float *rstd,
                                float *running_mean, float *running_var, const float *inp,
                                const float *gamma, const float *beta, int N, int C, int HW,
                                float eps, float momentum);
    void (*batchnorm_fwd_infer)(mmp_backend *be, float *out, const float *inp, const float *gamma,
                                const float *beta, const float *running_mean,
                                const float *running_var, int N, int C, int HW, float eps);
    void (*batchnorm_bwd)(mmp_backend *be, float *dinp, float *dgamma, float *dbeta,
                          const float *dout, const float *inp, const float *mean, const float *rstd,
                          const float *gamma, int N, int C, int HW);
    /* batchnorm_bwd / relu_bwd that write dinp: the bits a zeroed dinp holds
     * after the accumulating op (0 + x: a -0 becomes +0), without zeroing or
     * reading dinp first */
    void (*batchnorm_bwd_set)(mmp_backend *be, float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *inp, const float *mean,
                              const float *rstd, const float *gamma, int N, int C, int HW);
    void (*relu_bwd_set)(mmp_backend *be, float *dinp, const float *dout, const float *out,
                         size_t n);

    /* ---- elementwise ----------------------------------------------------- */
    // out, inp, dinp, dout (n)
    void (*relu_fwd)(mmp_backend *be, float *out, const float *inp, size_t n);
    void (*relu_bwd)(mmp_backend *be, float *dinp, const float *dout, const float *out, size_t n);
    void (*gelu_fwd)(mmp_backend *be, float *out, const float *inp, size_t n);
    void (*gelu_bwd)(mmp_backend *be, float *dinp, const float *dout, const float *inp, size_t n);
    void (*add)(mmp_backend *be, float *out, const float *a, const float *b, size_t n);
    void (*scale)(mmp_backend *be, float *x, float s, size_t n);
    // out (B,C,R) = (or +=) inp (B,R,C) with the last two axes swapped
    void (*transpose)(mmp_backend *be, float *out, const float *inp, int B, int R, int C,
                      int accumulate);
    // acc (n) += x (n) in double;  x (n) = (float) acc (n)
    void (*acc_f64)(mmp_backend *be, double *acc, const float *x, size_t n);
    void (*round_f64)(mmp_backend *be, float *x, const double *acc, size_t n);

    /* ---- pooling --------------------------------------------------------- */
    // out, argmax (N,C,OH,OW), inp (N,C,H,W)
    void (*maxpool2d_fwd)(mmp_backend *be, float *out, int32_t *argmax, const float *inp, int N,
                          int C, int H, int W, int k, int stride, int pad, int OH, int OW);
    /* k, stride, pad: the forward's window (a device may gather per input with them) */
    void (*maxpool2d_bwd)(mmp_backend *be, float *dinp, const float *dout, const int32_t *argmax,
                          int N, int C, int H, int W, int k, int stride, int pad, int OH, int OW);

    /* ---- layer norm ------------------------------------------------------ */
    // out, inp (N,C), w, b (C), mean, rstd (N)
    void (*layernorm_fwd)(mmp_backend *be, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);

    /* ---- embedding ------------------------------------------------------- */
    // out (B,T,C), ids (B,T) in [0,V), wte (V,C), wpe (>=T,C) or NULL
    void (*embedding_fwd)(mmp_backend *be, float *out, const int32_t *ids, const float *wte,
                          const float *wpe, int B, int T, int C);
    void (*embedding_bwd)(mmp_backend *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *ids, int B, int T, int C);

    /* ---- attention ------------------------------------------------------- */
    // out, q (B,Tq,C), k, v (B,Tk,C), key_mask (B,Tk) or NULL, att (B,NH,Tq,Tk).
    // prec: q, k, v, dout come rounded to it; the op rounds att and the score
    // gradients (mmp_cpu_attention_fwd's comment).
    void (*attention_fwd)(mmp_backend *be, float *out, float *att, const float *q, const float *k,
                          const float *v, const float *key_mask, int B, int Tq, int Tk, int C,
                          int NH, mmp_precision prec);
    void (*attention_bwd)(mmp_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *att, const float *q, const float *k, const float *v, int B,
                          int Tq, int Tk, int C, int NH, mmp_precision prec);

    /* ---- normalisation --------------------------------------------------- */
    // out, inp (N,C), norm (N)
    void (*l2norm_fwd)(mmp_backend *be, float *out, float *norm, const float *inp, int N, int C,
                       float eps);
    void (*l2norm_bwd)(mmp_backend *be, float *dinp, const float *dout, const float *out,
                       const float *norm, int N, int C, float eps);

    /* ---- losses (the returned loss is a HOST value; waits) ----------------- */
    // sim, p_i2t, p_t2i (B,B), img, txt (B,C); dlogit_scale (1) is backend memory
    float (*infonce_fwd)(mmp_backend *be, float *sim, float *p_i2t, float *p_t2i, const float *img,
                         const float *txt, float logit_scale, int B, int C);
    void (*infonce_bwd)(mmp_backend *be, float *dimg, float *dtxt, float *dlogit_scale,
                        const float *sim, const float *p_i2t, const float *p_t2i, const float *img,
                        const float *txt, float logit_scale, float dloss, int B, int C);
    // logits, labels, dlogits (n)
    float (*bce_fwd)(mmp_backend *be, const float *logits, const float *labels, int n);
    void (*bce_bwd)(mmp_backend *be, float *dlogits, const float *logits, const float *labels,
                    float dloss, int n);

    /* ---- optimizer ------------------------------------------------------- */
    // param, grad, m, v (n)
    void (*adamw)(mmp_backend *be, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t);
    // out[i] (HOST) = sum of x[i]^2 (n[i] floats) in double, i < count; waits once
    void (*sumsq)(mmp_backend *be, double *out, const float *const *x, const size_t *n, int count);
} mmp_backend_ops;

struct mmp_backend {
    const mmp_backend_ops *ops;
    void *ctx;   /* the implementation's device state (CUDA: mmp_cuda_ctx *), NULL on the CPU */
    mmp_err err; /* the first failed op's error, MMP_OK while none failed */
    char err_msg[512]; /* mmp_last_error() when err was recorded */
};

/* The implementations. mmp_backend_cuda_ops exists only in the CUDA module
 * (common/cuda_module.h): code outside it reaches it through
 * mmp_backend_create_cuda, which loads the module. */
extern const mmp_backend_ops mmp_backend_cpu_ops;
extern const mmp_backend_ops mmp_backend_cuda_ops;

/* Bytes of one element stored in prec: 2 for bf16/fp16, 4 for fp32. */
size_t mmp_backend_lp_bytes(mmp_precision prec);

/* The shared CPU instance (stateless, never fails, never freed). */
mmp_backend *mmp_backend_cpu(void);

/* An instance of ops on device (CPU: device ignored). *out NULL on failure. */
mmp_err mmp_backend_create(mmp_backend **out, const mmp_backend_ops *ops, int device);
/* An instance of the CUDA module's table on device (loading the module
 * first): as mmp_backend_create, or the module's load error
 * (MMP_ERR_UNSUPPORTED in a build without CUDA). */
mmp_err mmp_backend_create_cuda(mmp_backend **out, int device);
/* Waits for queued work and frees the device state; NULL-safe; never frees
 * the shared CPU instance. */
void mmp_backend_destroy(mmp_backend *be);

/* The instance's native stream (NULL on the CPU), its device memory
 * high-water mark in bytes (0 on the CPU: the process's RSS says it), and
 * staging host memory (pinned on CUDA, plain malloc on the CPU; zeroed;
 * NULL on failure). */
void *mmp_backend_stream(mmp_backend *be);
size_t mmp_backend_device_bytes(mmp_backend *be);
void *mmp_backend_host_alloc(mmp_backend *be, size_t bytes);
void mmp_backend_host_free(mmp_backend *be, void *p);
/* upload / upload_wait, or to_device and nothing where the backend has none. */
void mmp_backend_upload(mmp_backend *be, void *dst, const void *src_host, size_t bytes);
void mmp_backend_upload_wait(mmp_backend *be);
/* 1 when the instance's memory is the host's (the CPU backend). */
int mmp_backend_is_host(const mmp_backend *be);

/* The first error an op recorded (MMP_OK if none); when there is one,
 * mmp_last_error() is set back to that op's message (a CUDA fault makes
 * every later op fail too, and their messages would hide the first).
 * clear resets it. */
mmp_err mmp_backend_error(const mmp_backend *be);
void mmp_backend_clear_error(mmp_backend *be);
/* Records e as the instance's error unless one is already kept (for
 * implementations). */
void mmp_backend_fail(mmp_backend *be, mmp_err e);

#endif
