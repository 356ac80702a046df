/* The CPU backend: the reference kernels of kernels/cpu.h behind the table of
 * kernels/backend.h, unchanged (the same calls nn/ made by name before), so
 * every result is bitwise what the reference computes. Memory is 64-byte
 * aligned host memory and copies are memcpy: on the CPU, "device" memory is
 * host memory and a copy to the host is a plain read. Never fails except in
 * alloc; never records an error. */
#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"

/* ---- memory -------------------------------------------------------------- */
static mmp_err cpu_alloc(mmp_backend *be, void **out, size_t bytes)
{
    (void)be;
    size_t rounded = (bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out) {
        return mmp_errorf(MMP_ERR_NOMEM, "out of host memory for %zu bytes (%.1f GiB)", bytes,
                          (double)bytes / (1u << 30));
    }
    memset(*out, 0, rounded ? rounded : 64);
    return MMP_OK;
}

static void cpu_free(mmp_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_zero(mmp_backend *be, void *dst, size_t bytes)
{
    (void)be;
    if (bytes) {
        memset(dst, 0, bytes);
    }
}

static void cpu_copy(mmp_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (dst != src && bytes) {
        memcpy(dst, src, bytes);
    }
}

static void cpu_sync(mmp_backend *be)
{
    (void)be;
}

/* ---- ops: one line each onto the reference kernel --------------------------- */
static void cpu_round_lp(mmp_backend *be, float *dst, const float *src, size_t n,
                         mmp_precision prec)
{
    (void)be;
    mmp_cpu_round_lp(dst, src, n, (int)prec);
}

static void cpu_pack_lp(mmp_backend *be, void *dst, const float *src, size_t n, mmp_precision prec)
{
    (void)be;
    mmp_cpu_pack_lp(dst, src, n, (int)prec);
}

static void cpu_unpack_lp(mmp_backend *be, float *dst, const void *src, size_t n,
                          mmp_precision prec)
{
    (void)be;
    mmp_cpu_unpack_lp(dst, src, n, (int)prec);
}

static void cpu_gemm(mmp_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc)
{
    (void)be;
    mmp_cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_linear_fwd(mmp_backend *be, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int OC)
{
    (void)be;
    mmp_cpu_linear_fwd(out, inp, w, b, N, C, OC);
}

static void cpu_linear_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC)
{
    (void)be;
    mmp_cpu_linear_bwd(dinp, dw, db, dout, inp, w, N, C, OC);
}

static void cpu_conv2d_fwd(mmp_backend *be, float *out, const float *inp, const float *w,
                           const float *b, const mmp_conv_shape *s, float *scratch)
{
    (void)be;
    mmp_cpu_conv2d_fwd(out, inp, w, b, s, scratch);
}

static void cpu_conv2d_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const mmp_conv_shape *s,
                           float *scratch)
{
    (void)be;
    mmp_cpu_conv2d_bwd(dinp, dw, db, dout, inp, w, s, scratch);
}

static void cpu_bn_train(mmp_backend *be, float *out, float *mean, float *rstd, float *rm,
                         float *rv, const float *inp, const float *gamma, const float *beta, int N,
                         int C, int HW, float eps, float momentum)
{
    (void)be;
    mmp_cpu_batchnorm_fwd_train(out, mean, rstd, rm, rv, inp, gamma, beta, N, C, HW, eps, momentum);
}

static void cpu_bn_infer(mmp_backend *be, float *out, const float *inp, const float *gamma,
                         const float *beta, const float *rm, const float *rv, int N, int C, int HW,
                         float eps)
{
    (void)be;
    mmp_cpu_batchnorm_fwd_infer(out, inp, gamma, beta, rm, rv, N, C, HW, eps);
}

static void cpu_bn_bwd(mmp_backend *be, float *dinp, float *dgamma, float *dbeta, const float *dout,
                       const float *inp, const float *mean, const float *rstd, const float *gamma,
                       int N, int C, int HW)
{
    (void)be;
    mmp_cpu_batchnorm_bwd(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
}

static void cpu_bn_bwd_set(mmp_backend *be, float *dinp, float *dgamma, float *dbeta,
                           const float *dout, const float *inp, const float *mean,
                           const float *rstd, const float *gamma, int N, int C, int HW)
{
    (void)be;
    mmp_cpu_batchnorm_bwd_set(dinp, dgamma, dbeta, dout, inp, mean, rstd, gamma, N, C, HW);
}

static void cpu_relu_fwd(mmp_backend *be, float *out, const float *inp, size_t n)
{
    (void)be;
    mmp_cpu_relu_fwd(out, inp, n);
}

static void cpu_relu_bwd(mmp_backend *be, float *dinp, const float *dout, const float *out,
                         size_t n)
{
    (void)be;
    mmp_cpu_relu_bwd(dinp, dout, out, n);
}

static void cpu_relu_bwd_set(mmp_backend *be, float *dinp, const float *dout, const float *out,
                             size_t n)
{
    (void)be;
    mmp_cpu_relu_bwd_set(dinp, dout, out, n);
}

static void cpu_gelu_fwd(mmp_backend *be, float *out, const float *inp, size_t n)
{
    (void)be;
    mmp_cpu_gelu_fwd(out, inp, n);
}

static void cpu_gelu_bwd(mmp_backend *be, float *dinp, const float *dout, const float *inp,
                         size_t n)
{
    (void)be;
    mmp_cpu_gelu_bwd(dinp, dout, inp, n);
}

static void cpu_add(mmp_backend *be, float *out, const float *a, const float *b, size_t n)
{
    (void)be;
    mmp_cpu_add(out, a, b, n);
}

static void cpu_scale(mmp_backend *be, float *x, float s, size_t n)
{
    (void)be;
    mmp_cpu_scale(x, s, n);
}

static void cpu_transpose(mmp_backend *be, float *out, const float *inp, int B, int R, int C,
                          int accumulate)
{
    (void)be;
    mmp_cpu_transpose(out, inp, B, R, C, accumulate);
}

static void cpu_acc_f64(mmp_backend *be, double *acc, const float *x, size_t n)
{
    (void)be;
    mmp_cpu_acc_f64(acc, x, n);
}

static void cpu_round_f64(mmp_backend *be, float *x, const double *acc, size_t n)
{
    (void)be;
    mmp_cpu_round_f64(x, acc, n);
}

static void cpu_maxpool_fwd(mmp_backend *be, float *out, int32_t *argmax, const float *inp, int N,
                            int C, int H, int W, int k, int stride, int pad, int OH, int OW)
{
    (void)be;
    mmp_cpu_maxpool2d_fwd(out, argmax, inp, N, C, H, W, k, stride, pad, OH, OW);
}

static void cpu_maxpool_bwd(mmp_backend *be, float *dinp, const float *dout, const int32_t *argmax,
                            int N, int C, int H, int W, int k, int stride, int pad, int OH, int OW)
{
    (void)be;
    (void)k;
    (void)stride;
    (void)pad; /* the saved argmax says where each output came from */
    mmp_cpu_maxpool2d_bwd(dinp, dout, argmax, N, C, H, W, OH, OW);
}

static void cpu_ln_fwd(mmp_backend *be, float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C, float eps)
{
    (void)be;
    mmp_cpu_layernorm_fwd(out, mean, rstd, inp, w, b, N, C, eps);
}

static void cpu_ln_bwd(mmp_backend *be, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, const float *mean, const float *rstd,
                       int N, int C)
{
    (void)be;
    mmp_cpu_layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void cpu_emb_fwd(mmp_backend *be, float *out, const int32_t *ids, const float *wte,
                        const float *wpe, int B, int T, int C)
{
    (void)be;
    mmp_cpu_embedding_fwd(out, ids, wte, wpe, B, T, C);
}

static void cpu_emb_bwd(mmp_backend *be, float *dwte, float *dwpe, const float *dout,
                        const int32_t *ids, int B, int T, int C)
{
    (void)be;
    mmp_cpu_embedding_bwd(dwte, dwpe, dout, ids, B, T, C);
}

static void cpu_attn_fwd(mmp_backend *be, float *out, float *att, const float *q, const float *k,
                         const float *v, const float *key_mask, int B, int Tq, int Tk, int C,
                         int NH, mmp_precision prec)
{
    (void)be;
    mmp_cpu_attention_fwd(out, att, q, k, v, key_mask, B, Tq, Tk, C, NH, (int)prec);
}

static void cpu_attn_bwd(mmp_backend *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *att, const float *q, const float *k, const float *v, int B,
                         int Tq, int Tk, int C, int NH, mmp_precision prec)
{
    (void)be;
    mmp_cpu_attention_bwd(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH, (int)prec);
}

static void cpu_l2_fwd(mmp_backend *be, float *out, float *norm, const float *inp, int N, int C,
                       float eps)
{
    (void)be;
    mmp_cpu_l2norm_fwd(out, norm, inp, N, C, eps);
}

static void cpu_l2_bwd(mmp_backend *be, float *dinp, const float *dout, const float *out,
                       const float *norm, int N, int C, float eps)
{
    (void)be;
    mmp_cpu_l2norm_bwd(dinp, dout, out, norm, N, C, eps);
}

static float cpu_infonce_fwd(mmp_backend *be, float *sim, float *p_i2t, float *p_t2i,
                             const float *img, const float *txt, float logit_scale, int B, int C)
{
    (void)be;
    return mmp_cpu_infonce_fwd(sim, p_i2t, p_t2i, img, txt, logit_scale, B, C);
}

static void cpu_infonce_bwd(mmp_backend *be, float *dimg, float *dtxt, float *dlogit_scale,
                            const float *sim, const float *p_i2t, const float *p_t2i,
                            const float *img, const float *txt, float logit_scale, float dloss,
                            int B, int C)
{
    (void)be;
    mmp_cpu_infonce_bwd(dimg, dtxt, dlogit_scale, sim, p_i2t, p_t2i, img, txt, logit_scale, dloss,
                        B, C);
}

static float cpu_bce_fwd(mmp_backend *be, const float *logits, const float *labels, int n)
{
    (void)be;
    return mmp_cpu_bce_fwd(logits, labels, n);
}

static void cpu_bce_bwd(mmp_backend *be, float *dlogits, const float *logits, const float *labels,
                        float dloss, int n)
{
    (void)be;
    mmp_cpu_bce_bwd(dlogits, logits, labels, dloss, n);
}

static void cpu_adamw(mmp_backend *be, float *param, const float *grad, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                      int t)
{
    (void)be;
    mmp_cpu_adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
}

static void cpu_sumsq(mmp_backend *be, double *out, const float *const *x, const size_t *n,
                      int count)
{
    (void)be;
    for (int i = 0; i < count; i++) {
        out[i] = mmp_cpu_sumsq(x[i], n[i]);
    }
}

const mmp_backend_ops mmp_backend_cpu_ops = {
    .name = "cpu",
    .open = NULL,
    .close = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .round_lp = cpu_round_lp,
    .pack_lp = cpu_pack_lp,
    .unpack_lp = cpu_unpack_lp,
    .gemm = cpu_gemm,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd = cpu_linear_bwd,
    .conv2d_scratch_floats = mmp_cpu_conv2d_scratch_floats,
    .conv2d_fwd = cpu_conv2d_fwd,
    .conv2d_bwd = cpu_conv2d_bwd,
    .batchnorm_fwd_train = cpu_bn_train,
    .batchnorm_fwd_infer = cpu_bn_infer,
    .batchnorm_bwd = cpu_bn_bwd,
    .batchnorm_bwd_set = cpu_bn_bwd_set,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .relu_bwd_set = cpu_relu_bwd_set,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .add = cpu_add,
    .scale = cpu_scale,
    .transpose = cpu_transpose,
    .acc_f64 = cpu_acc_f64,
    .round_f64 = cpu_round_f64,
    .maxpool2d_fwd = cpu_maxpool_fwd,
    .maxpool2d_bwd = cpu_maxpool_bwd,
    .layernorm_fwd = cpu_ln_fwd,
    .layernorm_bwd = cpu_ln_bwd,
    .embedding_fwd = cpu_emb_fwd,
    .embedding_bwd = cpu_emb_bwd,
    .attention_fwd = cpu_attn_fwd,
    .attention_bwd = cpu_attn_bwd,
    .l2norm_fwd = cpu_l2_fwd,
    .l2norm_bwd = cpu_l2_bwd,
    .infonce_fwd = cpu_infonce_fwd,
    .infonce_bwd = cpu_infonce_bwd,
    .bce_fwd = cpu_bce_fwd,
    .bce_bwd = cpu_bce_bwd,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
};
