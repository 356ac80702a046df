/* GEMM and linear layers through cuBLAS, plus the bias kernels linear needs.
 *
 * Matrices are row-major like the CPU reference; cuBLAS is column-major, and
 * a row-major (M,N) matrix is its column-major transpose, so C = op(A) op(B)
 * is computed as C^T = op(B)^T op(A)^T with the operands swapped. Never
 * enables TF32 (see mmp_cuda_ctx_create). */
#include "kernels/cuda/internal.cuh"

static cublasOperation_t op(int trans)
{
    return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

mmp_err mmp_cuda_gemm_batched(mmp_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                              float alpha, const float *A, int lda, long long stride_a,
                              const float *B, int ldb, long long stride_b, float beta, float *C,
                              int ldc, long long stride_c, int batch)
{
    ARG_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    if (M == 0 || N == 0 || batch == 0) {
        return MMP_OK;
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
    return mmp_cuda_gemm_batched(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta,
                                 C, ldc, 0, 1);
}

/* out (N,OC) = b broadcast over rows. */
static __global__ void bias_fill_kernel(float *out, const float *b, size_t total, int OC)
{
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        out[i] = b[i % OC];
    }
}

/* db (OC) += column sums of dout (N,OC). A block owns 32 columns; its 8 rows
 * of threads stride over N and are summed in a fixed order. */
#define COLSUM_ROWS 8
static __global__ void colsum_add_kernel(float *db, const float *dout, int N, int OC)
{
    __shared__ float part[COLSUM_ROWS][WARP + 1];
    const int col = blockIdx.x * WARP + threadIdx.x;
    float sum = 0.0f;
    if (col < OC) {
        for (int n = threadIdx.y; n < N; n += COLSUM_ROWS) {
            sum += dout[(size_t)n * OC + col];
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

mmp_err mmp_cuda_linear_fwd(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
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
    return mmp_cuda_gemm(ctx, 0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
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
    if (db && OC > 0) {
        dim3 block(WARP, COLSUM_ROWS);
        colsum_add_kernel<<<(OC + WARP - 1) / WARP, block, 0, ctx->stream>>>(db, dout, N, OC);
        LAUNCH_CHECK();
    }
    return MMP_OK;
}
