/* Multi-head scaled dot-product attention: batched cuBLAS GEMMs for the
 * two products, a warp-per-row masked softmax between them.
 *
 * As on the CPU, head h of q/k/v is the column block [h*hs, (h+1)*hs) read
 * in place with a row stride of C: no transposed copies. A GEMM per (b, h)
 * pair is one cuBLAS batch. In fp32 one stride cannot step over both b and
 * h, so the smaller of the two is looped over and the larger is batched
 * (strided). At bf16/fp16 each operand is packed to 16 bits once, whole,
 * and every (b, h) product of the call is one cublasGemmBatchedEx over
 * pointers a small kernel writes on the device (where every pointer falls
 * on 16 bytes, bh_ptrs_aligned; else the loop): four launches a product,
 * not three per b (a pack of each operand and a GEMM) as the loop would
 * take; at BERT-base's 12 heads and a micro-batch of 8 that is 4 launches
 * instead of 24 for products of 2 MFLOP each, which the launches, not the
 * tensor cores, would pace.
 * Backward needs one (B,NH,Tq,Tk) buffer, taken from the workspace. This is
 * the straightforward version (the probabilities are materialised), not a
 * fused flash-attention kernel. */
#include "kernels/cuda/internal.cuh"

#include <stdint.h>

/* Element strides of one operand between consecutive batches b and heads h. */
typedef struct bh_stride {
    long long b, h;
} bh_stride;

/* Element e of a matrix of rows of ld floats, in its copy packed with rows
 * of pld 16-bit values. */
static __device__ inline long long packed_at(long long e, int ld, int pld)
{
    return e / ld * pld + e % ld;
}

/* The pointers of a batched GEMM's (b, h) products, b major: A_bh and B_bh
 * inside their packed copies (rows of pa_ld / pb_ld, from rows of lda /
 * ldb), C_bh in place. */
static __global__ void bh_ptrs_kernel(const void **pa, const void **pb, void **pc,
                                      const unsigned short *A, int lda, int pa_ld, bh_stride sa,
                                      const unsigned short *B, int ldb, int pb_ld, bh_stride sb,
                                      float *C, bh_stride sc, int nb, int nh)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nb * nh) {
        return;
    }
    const long long b = i / nh, h = i % nh;
    pa[i] = A + packed_at(b * sa.b + h * sa.h, lda, pa_ld);
    pb[i] = B + packed_at(b * sb.b + h * sb.h, ldb, pb_ld);
    pc[i] = C + b * sc.b + h * sc.h;
}

/* Whether each (b, h) operand of a matrix of rows of ld floats, at b * s.b +
 * h * s.h, starts on a whole row of its packed copy or 8 values (16 bytes)
 * into one, inside the row: s.b a number of rows, and s.h whole rows or a
 * column step of 8s that nh steps keep within the row. */
static int packed_aligned(int ld, bh_stride s, int nh)
{
    if (ld <= 0) {
        return 0;
    }
    const long long col = s.h % ld;
    return s.b % ld == 0 && col % 8 == 0 && (col == 0 || (long long)nh * s.h <= ld);
}

/* Whether gemm_bh_lp's pointers and rows all fall on 16 bytes: the packed
 * operands' (packed_aligned; their rows are padded to 8 values) and C's
 * (its base, both strides and its rows in 4-float steps).
 * cuBLAS cannot see pointers that live on the device, so they must be
 * what its tensor-core kernels assume of them; otherwise the loop. */
static int bh_ptrs_aligned(int lda, bh_stride sa, int ldb, bh_stride sb, const float *C, int ldc,
                           bh_stride sc, int nh)
{
    return packed_aligned(lda, sa, nh) && packed_aligned(ldb, sb, nh) && (uintptr_t)C % 16 == 0 &&
           ldc % 4 == 0 && sc.b % 4 == 0 && sc.h % 4 == 0;
}

/* gemm_bh at prec 1/2 (top comment): A as nb * (sa.b / lda) rows of lda
 * floats (likewise B), each packed whole into the lp workspace, then one
 * cublasGemmBatchedEx over the nb * nh products, 16-bit operands, fp32
 * accumulation and C (gemm.cu's row-major-as-transposed convention). */
static mmp_err gemm_bh_lp(mmp_cuda_ctx *ctx, int prec, int ta, int tb, int M, int N, int K,
                          float alpha, const float *A, int lda, bh_stride sa, const float *Bm,
                          int ldb, bh_stride sb, float beta, float *Cm, int ldc, bh_stride sc,
                          int nb, int nh)
{
    ARG_CHECK(nb > 0 && nh > 0 && lda > 0 && ldb > 0); /* and bh_ptrs_aligned */
    const int a_rows = (int)(nb * (sa.b / lda)), b_rows = (int)(nb * (sb.b / ldb));
    const int n = nb * nh;
    const size_t a_bytes = lp_packed_bytes(a_rows, lda, 1),
                 b_bytes = lp_packed_bytes(b_rows, ldb, 1);
    void *ws;
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, a_bytes + b_bytes + 3 * sizeof(void *) * (size_t)n, &ws));
    char *at = (char *)ws;
    mmp_cuda_packed pa, pb;
    MMP_TRY(mmp_cuda_pack_rows(ctx, prec, at, A, a_rows, lda, lda, 0, 1, &pa));
    MMP_TRY(mmp_cuda_pack_rows(ctx, prec, at + a_bytes, Bm, b_rows, ldb, ldb, 0, 1, &pb));
    void **ptrs = (void **)(at + a_bytes + b_bytes);
    bh_ptrs_kernel<<<(n + BLOCK - 1) / BLOCK, BLOCK, 0, ctx->stream>>>(
        (const void **)ptrs, (const void **)ptrs + n, ptrs + 2 * n, (const unsigned short *)pa.p,
        lda, pa.ld, sa, (const unsigned short *)pb.p, ldb, pb.ld, sb, Cm, sc, nb, nh);
    LAUNCH_CHECK();
    const cudaDataType t = prec == 1 ? CUDA_R_16BF : CUDA_R_16F;
    CU_TRY(cublasGemmBatchedEx(
        ctx->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
        &alpha, (const void *const *)(ptrs + n), t, pb.ld, (const void *const *)ptrs, t, pa.ld,
        &beta, ptrs + 2 * n, CUDA_R_32F, ldc, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MMP_OK;
}

/* For every (b, h): C_bh = alpha op(A_bh) op(B_bh) + beta C_bh (row-major),
 * X_bh = X + b * sX.b + h * sX.h. prec: every operand here comes rounded to
 * it (q, k, v, dout by the caller, att and the score gradients by the
 * kernels below), so bf16/fp16 run on the tensor cores (gemm_bh_lp). */
static mmp_err gemm_bh(mmp_cuda_ctx *ctx, int prec, int ta, int tb, int M, int N, int K,
                       float alpha, const float *A, int lda, bh_stride sa, const float *Bm, int ldb,
                       bh_stride sb, float beta, float *Cm, int ldc, bh_stride sc, int nb, int nh)
{
    if (prec != 0 && bh_ptrs_aligned(lda, sa, ldb, sb, Cm, ldc, sc, nh)) {
        return gemm_bh_lp(ctx, prec, ta, tb, M, N, K, alpha, A, lda, sa, Bm, ldb, sb, beta, Cm, ldc,
                          sc, nb, nh);
    }
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
 * 1/sqrt(hs) the scores were scaled by. Masked keys (a == 0) get exactly 0
 * and stay out of the sum, as on the CPU: an inf in their d (an fp16
 * overflow) must not turn the row into NaN. */
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
    float part = 0.0f;
    for (int j = lane; j < Tk; j += WARP) {
        if (a[j] != 0.0f) {
            part += a[j] * d[j];
        }
    }
    const float s = warp_reduce(part, sum_op());
    for (int j = lane; j < Tk; j += WARP) {
        d[j] = a[j] != 0.0f ? lp_round(a[j] * (d[j] - s) * scale, prec) : 0.0f;
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
