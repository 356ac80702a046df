/* The CUDA backend: kernels/cuda.h's launchers behind the table of
 * kernels/backend.h. Compiled only where the build defines MMP_HAVE_CUDA.
 *
 * The instance's ctx is an mmp_cuda_ctx (its device is made current by
 * open, and must stay current on the thread that uses the instance). Memory
 * is device memory; to_device / to_host wait for the copy, everything else
 * is queued on the context's stream. Every launcher's error is recorded in
 * the instance (the first one is kept) instead of being returned: nn/ checks
 * mmp_backend_error() once per step. Every op nn/ uses is implemented; all
 * of them are deterministic (no atomics in backward scatters, deterministic
 * cuDNN algorithms). */
#include "kernels/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cuda.h"

#define CTX(be) ((mmp_cuda_ctx *)(be)->ctx)

/* ---- the op profile (MMP_CUDA_PROFILE=1) ------------------------------------
 * Where a GPU step's time goes, op by op: with the variable set, every op
 * drains the stream before and after itself and adds the wall time between
 * (its kernels plus their launches) to its row; the table goes to stderr
 * when the instance closes. Serialises everything: for finding the biggest
 * costs, never for throughput figures. The drain after an op also pins an
 * asynchronous fault (an illegal address in its kernels) on that op. */
#define PROF_ROWS 64
typedef struct prof_row {
    const char *op;
    double ms;
    long calls;
} prof_row;
static prof_row prof[PROF_ROWS];
static int prof_on = -1;

static int prof_enabled(void)
{
    if (prof_on < 0) {
        const char *e = getenv("MMP_CUDA_PROFILE");
        prof_on = e && e[0] && strcmp(e, "0") != 0;
    }
    return prof_on;
}

static double prof_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static double prof_begin(mmp_backend *be)
{
    if (!prof_enabled()) {
        return 0;
    }
    (void)mmp_cuda_sync(CTX(be));
    return prof_now_ms();
}

static void prof_end(mmp_backend *be, const char *op, double t0)
{
    if (!prof_enabled()) {
        return;
    }
    mmp_err e = mmp_cuda_sync(CTX(be));
    if (e != MMP_OK) {
        /* a fault in the op's own kernels: otherwise it surfaces in a later op */
        mmp_backend_fail(be, mmp_error_prefix(e, "%s (its kernels)", op + 5 /* "cuda_" */));
    }
    double ms = prof_now_ms() - t0;
    for (int i = 0; i < PROF_ROWS; i++) {
        if (!prof[i].op || prof[i].op == op) {
            prof[i].op = op;
            prof[i].ms += ms;
            prof[i].calls++;
            return;
        }
    }
}

static int prof_cmp(const void *a, const void *b)
{
    double x = ((const prof_row *)a)->ms, y = ((const prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void prof_print(void)
{
    if (!prof_enabled() || !prof[0].op) {
        return;
    }
    int n = 0;
    double total = 0;
    while (n < PROF_ROWS && prof[n].op) {
        total += prof[n++].ms;
    }
    qsort(prof, (size_t)n, sizeof prof[0], prof_cmp);
    fprintf(stderr,
            "[cuda profile] pid %d: %.1f ms in ops\n| op | calls | ms | share "
            "|\n|---|---:|---:|---:|\n",
            (int)getpid(), total);
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "| %s | %ld | %.1f | %.1f%% |\n", prof[i].op + 5 /* "cuda_" */,
                prof[i].calls, prof[i].ms, 100 * prof[i].ms / (total > 0 ? total : 1));
    }
    memset(prof, 0, sizeof prof);
}

/* Records a launcher's error in the instance (the first one wins), its
 * message prefixed with the op ("conv2d_fwd: kernels/cuda/conv.cu:..."),
 * timing the op when profiling. */
#define REC(be, call)                                                                              \
    do {                                                                                           \
        double prof_t0_ = prof_begin(be);                                                          \
        mmp_err rec_e_ = (call);                                                                   \
        if (rec_e_ != MMP_OK) {                                                                    \
            rec_e_ = mmp_error_prefix(rec_e_, "%s", __func__ + 5 /* "cuda_" */);                   \
        }                                                                                          \
        mmp_backend_fail((be), rec_e_);                                                            \
        prof_end((be), __func__, prof_t0_);                                                        \
    } while (0)

/* ---- instance and memory -------------------------------------------------- */
static mmp_err cuda_open(void **ctx, int device)
{
    mmp_cuda_ctx *c = NULL;
    mmp_err e = mmp_cuda_ctx_create(&c, device);
    *ctx = c;
    return e;
}

static void cuda_close(void *ctx)
{
    prof_print();
    mmp_cuda_ctx_destroy(ctx);
}

/* From the context's arena (kernels/cuda.h): a stage allocates at set-up;
 * free gives nothing back before the instance closes (and never waits). */
static mmp_err cuda_alloc(mmp_backend *be, void **out, size_t bytes)
{
    size_t rounded = bytes ? (bytes + 255) / 256 * 256 : 256;
    MMP_TRY(mmp_cuda_arena_alloc(CTX(be), out, rounded));
    mmp_err e = mmp_cuda_memset(CTX(be), *out, 0, rounded);
    if (e != MMP_OK) {
        *out = NULL;
    }
    return e;
}

static void cuda_free(mmp_backend *be, void *p)
{
    (void)be;
    (void)p; /* the arena's: returned with the instance */
}

static void *cuda_stream(mmp_backend *be)
{
    return mmp_cuda_ctx_stream(CTX(be));
}

static size_t cuda_device_bytes(mmp_backend *be)
{
    return mmp_cuda_ctx_device_bytes(CTX(be));
}

static void *cuda_host_alloc(mmp_backend *be, size_t bytes)
{
    (void)be;
    return mmp_cuda_host_alloc(bytes);
}

static void cuda_host_free(mmp_backend *be, void *p)
{
    (void)be;
    mmp_cuda_host_free(p);
}

static void cuda_upload(mmp_backend *be, void *dst, const void *src, size_t bytes)
{
    REC(be, mmp_cuda_upload(CTX(be), dst, src, bytes));
}

static void cuda_upload_wait(mmp_backend *be)
{
    REC(be, mmp_cuda_upload_wait(CTX(be)));
}

static void cuda_zero(mmp_backend *be, void *dst, size_t bytes)
{
    if (bytes) {
        REC(be, mmp_cuda_memset(CTX(be), dst, 0, bytes));
    }
}

static void cuda_to_device(mmp_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes) {
        REC(be, mmp_cuda_memcpy_h2d(CTX(be), dst, src, bytes));
    }
}

static void cuda_to_host(mmp_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes) {
        REC(be, mmp_cuda_memcpy_d2h(CTX(be), dst, src, bytes));
    }
}

static void cuda_copy(mmp_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) {
        REC(be, mmp_cuda_memcpy_d2d(CTX(be), dst, src, bytes));
    }
}

static void cuda_sync(mmp_backend *be)
{
    REC(be, mmp_cuda_sync(CTX(be)));
}

/* ---- ops ------------------------------------------------------------------ */
static void cuda_round_lp(mmp_backend *be, float *dst, const float *src, size_t n,
                          mmp_precision prec)
{
    REC(be, mmp_cuda_round_lp(CTX(be), dst, src, n, (int)prec));
}

static void cuda_pack_lp(mmp_backend *be, void *dst, const float *src, size_t n, mmp_precision prec)
{
    REC(be, mmp_cuda_pack_lp(CTX(be), dst, src, n, (int)prec));
}

static void cuda_unpack_lp(mmp_backend *be, float *dst, const void *src, size_t n,
                           mmp_precision prec)
{
    REC(be, mmp_cuda_unpack_lp(CTX(be), dst, src, n, (int)prec));
}

static void cuda_gemm(mmp_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc)
{
    REC(be, mmp_cuda_gemm(CTX(be), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}

static void cuda_linear_fwd(mmp_backend *be, float *out, const float *inp, const float *w,
                            const float *b, int N, int C, int OC)
{
    REC(be, mmp_cuda_linear_fwd(CTX(be), out, inp, w, b, N, C, OC));
}

static void cuda_linear_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    REC(be, mmp_cuda_linear_bwd(CTX(be), dinp, dw, db, dout, inp, w, N, C, OC));
}

static void cuda_linear_fwd_lp(mmp_backend *be, float *out, const float *inp, const float *w,
                               const float *b, int N, int C, int OC, mmp_precision prec)
{
    REC(be, mmp_cuda_linear_fwd_lp(CTX(be), out, inp, w, b, N, C, OC, (int)prec));
}

static void cuda_linear_bwd_lp(mmp_backend *be, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w, int N, int C,
                               int OC, mmp_precision prec)
{
    REC(be, mmp_cuda_linear_bwd_lp(CTX(be), dinp, dw, db, dout, inp, w, N, C, OC, (int)prec));
}

static size_t cuda_conv2d_scratch_floats(const mmp_conv_shape *s)
{
    (void)s;
    return 0; /* cuDNN's workspace is the context's */
}

static void cuda_conv2d_fwd(mmp_backend *be, float *out, const float *inp, const float *w,
                            const float *b, const mmp_conv_shape *s, float *scratch)
{
    (void)scratch;
    REC(be, mmp_cuda_conv2d_fwd(CTX(be), out, inp, w, b, s));
}

static void cuda_conv2d_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const mmp_conv_shape *s,
                            float *scratch)
{
    (void)scratch;
    REC(be, mmp_cuda_conv2d_bwd(CTX(be), dinp, dw, db, dout, inp, w, s));
}

static void cuda_conv2d_fwd_lp(mmp_backend *be, float *out, const float *inp, const float *w,
                               const float *b, const mmp_conv_shape *s, mmp_precision prec)
{
    REC(be, mmp_cuda_conv2d_fwd_lp(CTX(be), out, inp, w, b, s, (int)prec));
}

static void cuda_conv2d_bwd_lp(mmp_backend *be, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const mmp_conv_shape *s, mmp_precision prec)
{
    REC(be, mmp_cuda_conv2d_bwd_lp(CTX(be), dinp, dw, db, dout, inp, w, s, (int)prec));
}

static void cuda_bn_train(mmp_backend *be, float *out, float *mean, float *rstd, float *rm,
                          float *rv, const float *inp, const float *gamma, const float *beta, int N,
                          int C, int HW, float eps, float momentum)
{
    REC(be, mmp_cuda_batchnorm_fwd_train(CTX(be), out, mean, rstd, rm, rv, inp, gamma, beta, N, C,
                                         HW, eps, momentum));
}

static void cuda_bn_infer(mmp_backend *be, float *out, const float *inp, const float *gamma,
                          const float *beta, const float *rm, const float *rv, int N, int C, int HW,
                          float eps)
{
    REC(be, mmp_cuda_batchnorm_fwd_infer(CTX(be), out, inp, gamma, beta, rm, rv, N, C, HW, eps));
}

static void cuda_bn_bwd(mmp_backend *be, float *dinp, float *dgamma, float *dbeta,
                        const float *dout, const float *inp, const float *mean, const float *rstd,
                        const float *gamma, int N, int C, int HW)
{
    REC(be, mmp_cuda_batchnorm_bwd(CTX(be), dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C,
                                   HW));
}

/* The _set ops on the device: zero, then the accumulating kernel (the same
 * bits by definition; a fused kernel would save the memset). A NULL dinp is
 * skipped, as on the CPU: no memset of address 0 (an error recorded). dinp
 * must not alias dout here (the CPU allows it; nn/ never does it). */
static void cuda_bn_bwd_set(mmp_backend *be, float *dinp, float *dgamma, float *dbeta,
                            const float *dout, const float *inp, const float *mean,
                            const float *rstd, const float *gamma, int N, int C, int HW)
{
    if (dinp) {
        cuda_zero(be, dinp, (size_t)N * C * HW * sizeof(float));
    }
    cuda_bn_bwd(be, dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
}

static void cuda_relu_fwd(mmp_backend *be, float *out, const float *inp, size_t n)
{
    REC(be, mmp_cuda_relu_fwd(CTX(be), out, inp, n));
}

static void cuda_relu_bwd(mmp_backend *be, float *dinp, const float *dout, const float *out,
                          size_t n)
{
    REC(be, mmp_cuda_relu_bwd(CTX(be), dinp, dout, out, n));
}

static void cuda_relu_bwd_set(mmp_backend *be, float *dinp, const float *dout, const float *out,
                              size_t n)
{
    cuda_zero(be, dinp, n * sizeof(float));
    cuda_relu_bwd(be, dinp, dout, out, n);
}

static void cuda_gelu_fwd(mmp_backend *be, float *out, const float *inp, size_t n)
{
    REC(be, mmp_cuda_gelu_fwd(CTX(be), out, inp, n));
}

static void cuda_gelu_bwd(mmp_backend *be, float *dinp, const float *dout, const float *inp,
                          size_t n)
{
    REC(be, mmp_cuda_gelu_bwd(CTX(be), dinp, dout, inp, n));
}

static void cuda_add(mmp_backend *be, float *out, const float *a, const float *b, size_t n)
{
    REC(be, mmp_cuda_add(CTX(be), out, a, b, n));
}

static void cuda_scale(mmp_backend *be, float *x, float s, size_t n)
{
    REC(be, mmp_cuda_scale(CTX(be), x, s, n));
}

static void cuda_transpose(mmp_backend *be, float *out, const float *inp, int B, int R, int C,
                           int accumulate)
{
    REC(be, mmp_cuda_transpose(CTX(be), out, inp, B, R, C, accumulate));
}

static void cuda_acc_f64(mmp_backend *be, double *acc, const float *x, size_t n)
{
    REC(be, mmp_cuda_acc_f64(CTX(be), acc, x, n));
}

static void cuda_round_f64(mmp_backend *be, float *x, const double *acc, size_t n)
{
    REC(be, mmp_cuda_round_f64(CTX(be), x, acc, n));
}

static void cuda_maxpool_fwd(mmp_backend *be, float *out, int32_t *argmax, const float *inp, int N,
                             int C, int H, int W, int k, int stride, int pad, int OH, int OW)
{
    REC(be, mmp_cuda_maxpool2d_fwd(CTX(be), out, argmax, inp, N, C, H, W, k, stride, pad, OH, OW));
}

static void cuda_maxpool_bwd(mmp_backend *be, float *dinp, const float *dout, const int32_t *argmax,
                             int N, int C, int H, int W, int k, int stride, int pad, int OH, int OW)
{
    REC(be,
        mmp_cuda_maxpool2d_bwd(CTX(be), dinp, dout, argmax, N, C, H, W, k, stride, pad, OH, OW));
}

static void cuda_ln_fwd(mmp_backend *be, float *out, float *mean, float *rstd, const float *inp,
                        const float *w, const float *b, int N, int C, float eps)
{
    REC(be, mmp_cuda_layernorm_fwd(CTX(be), out, mean, rstd, inp, w, b, N, C, eps));
}

static void cuda_ln_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int N, int C)
{
    REC(be, mmp_cuda_layernorm_bwd(CTX(be), dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}

static void cuda_emb_fwd(mmp_backend *be, float *out, const int32_t *ids, const float *wte,
                         const float *wpe, int B, int T, int C)
{
    REC(be, mmp_cuda_embedding_fwd(CTX(be), out, ids, wte, wpe, B, T, C));
}

static void cuda_emb_bwd(mmp_backend *be, float *dwte, float *dwpe, const float *dout,
                         const int32_t *ids, int B, int T, int C)
{
    REC(be, mmp_cuda_embedding_bwd(CTX(be), dwte, dwpe, dout, ids, B, T, C));
}

static void cuda_attn_fwd(mmp_backend *be, float *out, float *att, const float *q, const float *k,
                          const float *v, const float *key_mask, int B, int Tq, int Tk, int C,
                          int NH, mmp_precision prec)
{
    REC(be,
        mmp_cuda_attention_fwd(CTX(be), out, att, q, k, v, key_mask, B, Tq, Tk, C, NH, (int)prec));
}

static void cuda_attn_bwd(mmp_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *att, const float *q, const float *k, const float *v, int B,
                          int Tq, int Tk, int C, int NH, mmp_precision prec)
{
    REC(be, mmp_cuda_attention_bwd(CTX(be), dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH,
                                   (int)prec));
}

static void cuda_l2_fwd(mmp_backend *be, float *out, float *norm, const float *inp, int N, int C,
                        float eps)
{
    REC(be, mmp_cuda_l2norm_fwd(CTX(be), out, norm, inp, N, C, eps));
}

static void cuda_l2_bwd(mmp_backend *be, float *dinp, const float *dout, const float *out,
                        const float *norm, int N, int C, float eps)
{
    REC(be, mmp_cuda_l2norm_bwd(CTX(be), dinp, dout, out, norm, N, C, eps));
}

static float cuda_infonce_fwd(mmp_backend *be, float *sim, float *p_i2t, float *p_t2i,
                              const float *img, const float *txt, float logit_scale, int B, int C)
{
    float loss = NAN;
    REC(be, mmp_cuda_infonce_fwd(CTX(be), &loss, sim, p_i2t, p_t2i, img, txt, logit_scale, B, C));
    return loss;
}

static void cuda_infonce_bwd(mmp_backend *be, float *dimg, float *dtxt, float *dlogit_scale,
                             const float *sim, const float *p_i2t, const float *p_t2i,
                             const float *img, const float *txt, float logit_scale, float dloss,
                             int B, int C)
{
    REC(be, mmp_cuda_infonce_bwd(CTX(be), dimg, dtxt, dlogit_scale, sim, p_i2t, p_t2i, img, txt,
                                 logit_scale, dloss, B, C));
}

static float cuda_bce_fwd(mmp_backend *be, const float *logits, const float *labels, int n)
{
    float loss = NAN;
    REC(be, mmp_cuda_bce_fwd(CTX(be), &loss, logits, labels, n));
    return loss;
}

static void cuda_bce_bwd(mmp_backend *be, float *dlogits, const float *logits, const float *labels,
                         float dloss, int n)
{
    REC(be, mmp_cuda_bce_bwd(CTX(be), dlogits, logits, labels, dloss, n));
}

static void cuda_adamw(mmp_backend *be, float *param, const float *grad, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                       int t)
{
    REC(be, mmp_cuda_adamw(CTX(be), param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t));
}

static void cuda_sumsq(mmp_backend *be, double *out, const float *const *x, const size_t *n,
                       int count)
{
    for (int i = 0; i < count; i++) {
        out[i] = NAN; /* what a failed op leaves */
    }
    REC(be, mmp_cuda_sumsq_many(CTX(be), out, x, n, count));
}

const mmp_backend_ops mmp_backend_cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .stream = cuda_stream,
    .device_bytes = cuda_device_bytes,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .upload_wait = cuda_upload_wait,
    .round_lp = cuda_round_lp,
    .pack_lp = cuda_pack_lp,
    .unpack_lp = cuda_unpack_lp,
    .gemm = cuda_gemm,
    .linear_fwd = cuda_linear_fwd,
    .linear_bwd = cuda_linear_bwd,
    .linear_fwd_lp = cuda_linear_fwd_lp,
    .linear_bwd_lp = cuda_linear_bwd_lp,
    .conv2d_scratch_floats = cuda_conv2d_scratch_floats,
    .conv2d_fwd_lp = cuda_conv2d_fwd_lp,
    .conv2d_bwd_lp = cuda_conv2d_bwd_lp,
    .conv2d_fwd = cuda_conv2d_fwd,
    .conv2d_bwd = cuda_conv2d_bwd,
    .batchnorm_fwd_train = cuda_bn_train,
    .batchnorm_fwd_infer = cuda_bn_infer,
    .batchnorm_bwd = cuda_bn_bwd,
    .batchnorm_bwd_set = cuda_bn_bwd_set,
    .relu_fwd = cuda_relu_fwd,
    .relu_bwd = cuda_relu_bwd,
    .relu_bwd_set = cuda_relu_bwd_set,
    .gelu_fwd = cuda_gelu_fwd,
    .gelu_bwd = cuda_gelu_bwd,
    .add = cuda_add,
    .scale = cuda_scale,
    .transpose = cuda_transpose,
    .acc_f64 = cuda_acc_f64,
    .round_f64 = cuda_round_f64,
    .maxpool2d_fwd = cuda_maxpool_fwd,
    .maxpool2d_bwd = cuda_maxpool_bwd,
    .layernorm_fwd = cuda_ln_fwd,
    .layernorm_bwd = cuda_ln_bwd,
    .embedding_fwd = cuda_emb_fwd,
    .embedding_bwd = cuda_emb_bwd,
    .attention_fwd = cuda_attn_fwd,
    .attention_bwd = cuda_attn_bwd,
    .l2norm_fwd = cuda_l2_fwd,
    .l2norm_bwd = cuda_l2_bwd,
    .infonce_fwd = cuda_infonce_fwd,
    .infonce_bwd = cuda_infonce_bwd,
    .bce_fwd = cuda_bce_fwd,
    .bce_bwd = cuda_bce_bwd,
    .adamw = cuda_adamw,
    .sumsq = cuda_sumsq,
};
