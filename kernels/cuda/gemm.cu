/* GEMM and linear layers through cuBLAS, plus the bias kernels linear needs.
 *
 * Matrices are row-major like the CPU reference; cuBLAS is column-major, and
 * a row-major (M,N) matrix is its column-major transpose, so C = op(A) op(B)
 * is computed as C^T = op(B)^T op(A)^T with the operands swapped. fp32
 * (prec 0) is cublasSgemm and never enables TF32 (see mmp_cuda_ctx_create).
 *
 * bf16/fp16 (prec 1/2): with train.precision bf16/fp16 the operands of every
 * product are rounded to that precision (nn/lowp.h), so storing them as true
 * 16-bit values is exact. They are packed (rounded on the way by lp_pack:
 * the rounding of a rounded value is that value)
 * into the context's lp workspace (mmp_cuda_lp_ws_get), dense, with a
 * leading dimension rounded up to 8 elements (16 bytes) and 256-byte aligned
 * bases: the alignment cuBLAS's tensor-core kernels want, whatever K is (K
 * is passed as it is; the zero padding columns are never read). Then
 * cublasGemmEx / cublasGemmStridedBatchedEx with CUDA_R_16BF / CUDA_R_16F
 * operands, CUBLAS_COMPUTE_32F (fp32 accumulation, never a 16-bit compute
 * type) and fp32 C: every product of two 16-bit values is exact in fp32, so
 * the result is the Sgemm path's on the rounded values up to the order (and
 * the tensor cores' rounding) of the fp32 sums. Deterministic: cuBLAS gives
 * the same bits for the same call on the same GPU model and SM count while
 * it runs on one stream with a workspace of its own (set once per context,
 * mmp_cuda_ctx_create); CUBLAS_GEMM_DEFAULT picks by shape only. */
#include "kernels/cuda/internal.cuh"

static cublasOperation_t op(int trans)
{
    return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* dst (batch, rows, lp_ld(cols)) of 16-bit values = src (batch at stride, rows
 * at ld, cols) rounded to prec (1 bf16, 2 fp16); padding columns 0. */
static __global__ void pack_kernel(unsigned short *dst, const float *src, int rows, int cols,
                                   int ld, long long stride, int ldd, size_t total, int prec)
{
    const size_t per = (size_t)rows * ldd;
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        const size_t b = i / per, rc = i % per;
        const int r = (int)(rc / ldd), c = (int)(rc % ldd);
        const float x = c < cols ? src[b * stride + (size_t)r * ld + c] : 0.0f;
        dst[i] = lp_pack(x, prec);
    }
}

typedef mmp_cuda_packed packed;

mmp_err mmp_cuda_pack_rows(mmp_cuda_ctx *ctx, int prec, void *dst, const float *src, int rows,
                           int cols, int ld, long long stride, int batch, packed *out)
{
    const int ldd = lp_ld(cols);
    const size_t total = (size_t)batch * rows * ldd;
    out->p = dst;
    out->ld = ldd;
    out->stride = (long long)rows * ldd;
    MMP_TRY(launch_grid(ctx, pack_kernel, total, (unsigned short *)dst, src, rows, cols, ld, stride,
                        ldd, total, prec));
    return MMP_OK;
}

mmp_err mmp_cuda_gemm_packed(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N,
                             int K, float alpha, packed A, packed B, float beta, float *C, int ldc,
                             long long stride_c, int batch)
{
    const cudaDataType t = prec == 1 ? CUDA_R_16BF : CUDA_R_16F;
    if (batch == 1) {
        CU_TRY(cublasGemmEx(ctx->cublas, op(trans_b), op(trans_a), N, M, K, &alpha, B.p, t, B.ld,
                            A.p, t, A.ld, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    } else {
        CU_TRY(cublasGemmStridedBatchedEx(ctx->cublas, op(trans_b), op(trans_a), N, M, K, &alpha,
                                          B.p, t, B.ld, B.stride, A.p, t, A.ld, A.stride, &beta, C,
                                          CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_gemm_batched(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N,
                              int K, float alpha, const float *A, int lda, long long stride_a,
                              const float *B, int ldb, long long stride_b, float beta, float *C,
                              int ldc, long long stride_c, int batch)
{
    ARG_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0 && prec >= 0 && prec <= 2);
    if (M == 0 || N == 0 || batch == 0) {
        return MMP_OK;
    }
    if (prec != 0 && K > 0) {
        /* op(A) (M,K) is stored (K,M) when transposed; op(B) (K,N) likewise */
        const int ar = trans_a ? K : M, ac = trans_a ? M : K;
        const int br = trans_b ? N : K, bc = trans_b ? K : N;
        const size_t a_bytes = lp_packed_bytes(ar, ac, batch);
        void *ws;
        MMP_TRY(mmp_cuda_lp_ws_get(ctx, a_bytes + lp_packed_bytes(br, bc, batch), &ws));
        packed pa, pb;
        MMP_TRY(mmp_cuda_pack_rows(ctx, prec, ws, A, ar, ac, lda, stride_a, batch, &pa));
        MMP_TRY(mmp_cuda_pack_rows(ctx, prec, (char *)ws + a_bytes, B, br, bc, ldb, stride_b, batch,
                                   &pb));
        return mmp_cuda_gemm_packed(ctx, prec, trans_a, trans_b, M, N, K, alpha, pa, pb, beta, C,
                                    ldc, stride_c, batch);
    }
    if (batch == 1) {
        CU_TRY(cublasSgemm(ctx->cublas, op(trans_b), op(trans_a), N, M, K, &alpha, B, ldb, A, lda,
                           &beta, C, ldc));
    } else {
        CU_TRY(cublasSgemmStridedBatched(ctx->cublas, op(trans_b), op(trans_a), N, M, K, &alpha, B,
                                         ldb, stride_b, A, lda, stride_a, &beta, C, ldc, stride_c,
                                         batch));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_gemm(mmp_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc)
{
    return mmp_cuda_gemm_batched(ctx, 0, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0,
                                 beta, C, ldc, 0, 1);
}

mmp_err mmp_cuda_gemm_lp(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                         float *C, int ldc)
{
    return mmp_cuda_gemm_batched(ctx, prec, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0,
                                 beta, C, ldc, 0, 1);
}

/* out (N,OC) = b broadcast over rows. */
static __global__ void bias_fill_kernel(float *out, const float *b, size_t total, int OC)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        out[i] = b[i % OC];
    }
}

/* Rows of an (N, OC) matrix as fp32 values: fp32 storage, or 16-bit storage
 * widened (prec 1 bf16, 2 fp16). */
struct f32_rows {
    const float *p;
    int ld;
    __device__ float operator()(int n, int col) const
    {
        return p[(size_t)n * ld + col];
    }
};
struct lp_rows {
    const unsigned short *p;
    int ld, prec;
    __device__ float operator()(int n, int col) const
    {
        const unsigned short x = p[(size_t)n * ld + col];
        return lp_unpack(x, prec);
    }
};

/* db (OC) += column sums of dout (N,OC). A block owns 32 columns; its 8 rows
 * of threads stride over N and are summed in a fixed order (the same for
 * either storage, so 16-bit storage sums exactly what fp32 storage of the
 * rounded values sums). */
#define COLSUM_ROWS 8
template <typename Rows>
static __global__ void colsum_add_kernel(float *db, Rows dout, int N, int OC)
{
    __shared__ float part[COLSUM_ROWS][WARP + 1];
    const int col = blockIdx.x * WARP + threadIdx.x;
    float sum = 0.0f;
    if (col < OC) {
        for (int n = threadIdx.y; n < N; n += COLSUM_ROWS) {
            sum += dout(n, col);
        }
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < OC) {
        for (int r = 1; r < COLSUM_ROWS; r++) {
            sum += part[r][threadIdx.x];
        }
        db[col] += sum;
    }
}

template <typename Rows>
static mmp_err colsum_add(mmp_cuda_ctx *ctx, float *db, Rows dout, int N, int OC)
{
    if (OC > 0) {
        dim3 block(WARP, COLSUM_ROWS);
        colsum_add_kernel<<<(OC + WARP - 1) / WARP, block, 0, ctx->stream>>>(db, dout, N, OC);
        LAUNCH_CHECK();
    }
    return MMP_OK;
}

static mmp_err linear_fwd(mmp_cuda_ctx *ctx, int prec, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int OC)
{
    // out (N,OC), inp (N,C), w (OC,C), b (OC) or NULL
    ARG_CHECK(N >= 0 && C >= 0 && OC >= 0);
    if (N == 0 || OC == 0) {
        return MMP_OK;
    }
    float beta = 0.0f;
    if (b) {
        size_t total = (size_t)N * OC;
        bias_fill_kernel<<<grid_for(total, BLOCK), BLOCK, 0, ctx->stream>>>(out, b, total, OC);
        LAUNCH_CHECK();
        beta = 1.0f;
    }
    return mmp_cuda_gemm_batched(ctx, prec, 0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, beta, out, OC,
                                 0, 1);
}

mmp_err mmp_cuda_linear_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                            const float *b, int N, int C, int OC)
{
    return linear_fwd(ctx, 0, out, inp, w, b, N, C, OC);
}

mmp_err mmp_cuda_linear_fwd_lp(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                               const float *b, int N, int C, int OC, int prec)
{
    ARG_CHECK(prec >= 0 && prec <= 2);
    return linear_fwd(ctx, prec, out, inp, w, b, N, C, OC);
}

mmp_err mmp_cuda_linear_bwd(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    // dinp (N,C), dw (OC,C), db (OC), dout (N,OC), inp (N,C), w (OC,C)
    ARG_CHECK(N >= 0 && C >= 0 && OC >= 0);
    if (dinp) {
        MMP_TRY(mmp_cuda_gemm(ctx, 0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C));
    }
    if (dw) {
        MMP_TRY(mmp_cuda_gemm(ctx, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C));
    }
    if (db) {
        MMP_TRY(colsum_add(ctx, db, f32_rows{dout, OC}, N, OC));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_linear_bwd_lp(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w, int N, int C,
                               int OC, int prec)
{
    // dinp (N,C), dw (OC,C), db (OC), dout (N,OC), inp (N,C), w (OC,C); inp, w, dout rounded
    // to prec here (each packed once, dout shared by all three)
    ARG_CHECK(N >= 0 && C >= 0 && OC >= 0 && prec >= 0 && prec <= 2);
    if (prec == 0 || N == 0 || OC == 0) {
        /* fp32, or nothing to round: an empty dout adds nothing anywhere */
        return mmp_cuda_linear_bwd(ctx, dinp, dw, db, dout, inp, w, N, C, OC);
    }
    const size_t d_bytes = lp_packed_bytes(N, OC, 1);
    const size_t w_bytes = dinp && C > 0 ? lp_packed_bytes(OC, C, 1) : 0;
    const size_t i_bytes = dw && C > 0 ? lp_packed_bytes(N, C, 1) : 0;
    void *ws;
    MMP_TRY(mmp_cuda_lp_ws_get(ctx, d_bytes + w_bytes + i_bytes, &ws));
    char *at = (char *)ws;
    packed pd, pw, pi;
    MMP_TRY(mmp_cuda_pack_rows(ctx, prec, at, dout, N, OC, OC, 0, 1, &pd));
    if (w_bytes) {
        MMP_TRY(mmp_cuda_pack_rows(ctx, prec, at + d_bytes, w, OC, C, C, 0, 1, &pw));
        // dinp (N,C) += dout (N,OC) @ w (OC,C)
        MMP_TRY(mmp_cuda_gemm_packed(ctx, prec, 0, 0, N, C, OC, 1.0f, pd, pw, 1.0f, dinp, C, 0, 1));
    }
    if (i_bytes) {
        MMP_TRY(mmp_cuda_pack_rows(ctx, prec, at + d_bytes + w_bytes, inp, N, C, C, 0, 1, &pi));
        // dw (OC,C) += dout^T (OC,N) @ inp (N,C)
        MMP_TRY(mmp_cuda_gemm_packed(ctx, prec, 1, 0, OC, C, N, 1.0f, pd, pi, 1.0f, dw, C, 0, 1));
    }
    if (db) {
        MMP_TRY(colsum_add(ctx, db, lp_rows{(const unsigned short *)pd.p, pd.ld, prec}, N, OC));
    }
    return MMP_OK;
}
