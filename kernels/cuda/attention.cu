/* Multi-head scaled dot-product attention: strided-batched cuBLAS GEMMs for
 * the two products, a warp-per-row masked softmax between them.
 *
 * As on the CPU, head h of q/k/v is the column block [h*hs, (h+1)*hs) read
 * in place with a row stride of C: no transposed copies. A GEMM per (b, h)
 * pair is one cuBLAS batch; one stride cannot step over both b and h, so
 * the smaller of the two is looped over and the larger is batched.
 * Backward needs one (B,NH,Tq,Tk) buffer, taken from the workspace. This is
 * the straightforward version (the probabilities are materialised), not a
 * fused flash-attention kernel. */
#include "kernels/cuda/internal.cuh"

/* Element strides of one operand between consecutive batches b and heads h. */
typedef struct bh_stride {
    long long b, h;
} bh_stride;

/* For every (b, h): C_bh = alpha op(A_bh) op(B_bh) + beta C_bh (row-major),
 * X_bh = X + b * sX.b + h * sX.h. prec: every operand here comes rounded to
 * it (q, k, v, dout by the caller, att and the score gradients by the
 * kernels below), so bf16/fp16 run on the tensor cores (gemm.cu). */
static mmp_err gemm_bh(mmp_cuda_ctx *ctx, int prec, int ta, int tb, int M, int N, int K,
                       float alpha, const float *A, int lda, bh_stride sa, const float *Bm, int ldb,
                       bh_stride sb, float beta, float *Cm, int ldc, bh_stride sc, int nb, int nh)
{
    if (nb <= nh) {
        for (int b = 0; b < nb; b++) {
            MMP_TRY(mmp_cuda_gemm_batched(ctx, prec, ta, tb, M, N, K, alpha, A + b * sa.b, lda,
                                          sa.h, Bm + b * sb.b, ldb, sb.h, beta, Cm + b * sc.b, ldc,
                                          sc.h, nh));
        }
    } else {
        for (int h = 0; h < nh; h++) {
            MMP_TRY(mmp_cuda_gemm_batched(ctx, prec, ta, tb, M, N, K, alpha, A + h * sa.h, lda,
                                          sa.b, Bm + h * sb.h, ldb, sb.b, beta, Cm + h * sc.h, ldc,
                                          sc.b, nb));
        }
    }
    return MMP_OK;
}

/* att rows (B*NH*Tq, Tk) in place: scores -> probabilities over the keys
 * that key_mask (B,Tk) lets through. */
static __global__ void attention_softmax_kernel(float *att, const float *key_mask, int rows,
                                                int rows_per_b, int Tk, int prec)
{
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const float *valid = key_mask ? key_mask + (size_t)(row / rows_per_b) * Tk : NULL;
    float *a = att + (size_t)row * Tk;
    warp_softmax_row(a, a, valid, Tk);
    if (prec) {
        const int lane = threadIdx.x % WARP;
        __syncwarp();
        for (int j = lane; j < Tk; j += WARP) {
            a[j] = lp_round(a[j], prec);
        }
    }
}

/* dp rows (B*NH*Tq, Tk) in place: d probabilities -> d scores, including the
 * 1/sqrt(hs) the scores were scaled by. Masked keys (a == 0) get 0. */
static __global__ void attention_softmax_bwd_kernel(float *dp, const float *att, int rows, int Tk,
                                                    float scale, int prec)
{
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP;
    const float *a = att + (size_t)row * Tk;
    float *d = dp + (size_t)row * Tk;
    const float s = warp_dot<float>(a, d, Tk);
    for (int j = lane; j < Tk; j += WARP) {
        d[j] = lp_round(a[j] * (d[j] - s) * scale, prec);
    }
}

/* Where head h of sample b starts in q/out (B,Tq,C), k/v (B,Tk,C) and
 * att (B,NH,Tq,Tk), and the 1/sqrt(hs) the scores are scaled by: what the
 * forward and the backward pass both hand to gemm_bh. */
typedef struct heads {
    int hs;
    float scale;
    long long TT;
    bh_stride s_q, s_kv, s_att;
} heads;

static heads head_layout(int Tq, int Tk, int C, int NH)
{
    heads h;
    h.hs = C / NH;
    h.scale = 1.0f / sqrtf((float)h.hs);
    h.TT = (long long)Tq * Tk;
    h.s_q = {(long long)Tq * C, h.hs};
    h.s_kv = {(long long)Tk * C, h.hs};
    h.s_att = {NH * h.TT, h.TT};
    return h;
}

mmp_err mmp_cuda_attention_fwd(mmp_cuda_ctx *ctx, float *out, float *att, const float *q,
                               const float *k, const float *v, const float *key_mask, int B, int Tq,
                               int Tk, int C, int NH, int prec)
{
    // out (B,Tq,C), att (B,NH,Tq,Tk), q (B,Tq,C), k (B,Tk,C), v (B,Tk,C), key_mask (B,Tk) or NULL
    ARG_CHECK(B > 0 && Tq > 0 && Tk > 0 && C > 0 && NH > 0 && C % NH == 0);
    const heads h = head_layout(Tq, Tk, C, NH);
    // att_bh (Tq,Tk) = scale * q_bh (Tq,hs) @ k_bh^T (hs,Tk)
    MMP_TRY(gemm_bh(ctx, prec, 0, 1, Tq, Tk, h.hs, h.scale, q, C, h.s_q, k, C, h.s_kv, 0.0f, att,
                    Tk, h.s_att, B, NH));
    const int rows = B * NH * Tq;
    attention_softmax_kernel<<<row_blocks(rows), BLOCK, 0, ctx->stream>>>(att, key_mask, rows,
                                                                          NH * Tq, Tk, prec);
    LAUNCH_CHECK();
    // out_bh (Tq,hs) = att_bh (Tq,Tk) @ v_bh (Tk,hs)
    return gemm_bh(ctx, prec, 0, 0, Tq, h.hs, Tk, 1.0f, att, Tk, h.s_att, v, C, h.s_kv, 0.0f, out,
                   C, h.s_q, B, NH);
}

mmp_err mmp_cuda_attention_bwd(mmp_cuda_ctx *ctx, float *dq, float *dk, float *dv,
                               const float *dout, const float *att, const float *q, const float *k,
                               const float *v, int B, int Tq, int Tk, int C, int NH, int prec)
{
    // dq (B,Tq,C), dk (B,Tk,C), dv (B,Tk,C), dout (B,Tq,C), att (B,NH,Tq,Tk),
    // q (B,Tq,C), k (B,Tk,C), v (B,Tk,C)
    ARG_CHECK(B > 0 && Tq > 0 && Tk > 0 && C > 0 && NH > 0 && C % NH == 0);
    const heads h = head_layout(Tq, Tk, C, NH);
    if (dv) {
        // dv_bh (Tk,hs) += att_bh^T (Tk,Tq) @ dout_bh (Tq,hs)
        MMP_TRY(gemm_bh(ctx, prec, 1, 0, Tk, h.hs, Tq, 1.0f, att, Tk, h.s_att, dout, C, h.s_q, 1.0f,
                        dv, C, h.s_kv, B, NH));
    }
    if (!dq && !dk) {
        return MMP_OK;
    }
    void *ws;
    MMP_TRY(mmp_cuda_ws_get(ctx, sizeof(float) * (size_t)B * NH * h.TT, &ws));
    float *dp = (float *)ws;
    // dp_bh (Tq,Tk) = dout_bh (Tq,hs) @ v_bh^T (hs,Tk), then d scores in place
    MMP_TRY(gemm_bh(ctx, prec, 0, 1, Tq, Tk, h.hs, 1.0f, dout, C, h.s_q, v, C, h.s_kv, 0.0f, dp, Tk,
                    h.s_att, B, NH));
    const int rows = B * NH * Tq;
    attention_softmax_bwd_kernel<<<row_blocks(rows), BLOCK, 0, ctx->stream>>>(dp, att, rows, Tk,
                                                                              h.scale, prec);
    LAUNCH_CHECK();
    if (dq) {
        // dq_bh (Tq,hs) += dscores_bh (Tq,Tk) @ k_bh (Tk,hs)
        MMP_TRY(gemm_bh(ctx, prec, 0, 0, Tq, h.hs, Tk, 1.0f, dp, Tk, h.s_att, k, C, h.s_kv, 1.0f,
                        dq, C, h.s_q, B, NH));
    }
    if (dk) {
        // dk_bh (Tk,hs) += dscores_bh^T (Tk,Tq) @ q_bh (Tq,hs)
        MMP_TRY(gemm_bh(ctx, prec, 1, 0, Tk, h.hs, Tq, 1.0f, dp, Tk, h.s_att, q, C, h.s_q, 1.0f, dk,
                        C, h.s_kv, B, NH));
    }
    return MMP_OK;
}
