/* GEMM and linear layers on the CPU: every matrix product in the CPU kernels
 * goes through mmp_cpu_gemm, so the OpenBLAS thread count is set in one place.
 * OpenBLAS's count, and the kernels' own pool for their other loops
 * (kernels/cpu/parallel.h), are 1 unless the caller asked for more. */
#include "kernels/cpu.h"

#include <cblas.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/parallel.h"

/* 0 until the thread count was chosen, either by mmp_cpu_set_threads or by
 * the first GEMM (which then pins OpenBLAS to 1 thread: its own default is
 * every core, which fights with the pipeline's other stages). */
static atomic_int threads_chosen;

void mmp_cpu_set_threads(int n)
{
    openblas_set_num_threads(n > 0 ? n : 1);
    mmp_cpu_pool_resize(n);
    atomic_store(&threads_chosen, 1);
}

void mmp_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    // C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, all row-major
    if (M <= 0 || N <= 0) {
        return;
    }
    if (!atomic_load(&threads_chosen)) {
        mmp_cpu_set_threads(1);
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void mmp_cpu_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C,
                        int OC)
{
    // out (N,OC), inp (N,C), w (OC,C), b (OC) or NULL
    float beta = 0.0f;
    if (b) {
        for (int n = 0; n < N; n++) {
            memcpy(out + (size_t)n * OC, b, sizeof(float) * (size_t)OC);
        }
        beta = 1.0f;
    }
    mmp_cpu_gemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void mmp_cpu_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int N, int C, int OC)
{
    // dinp (N,C), dw (OC,C), db (OC), dout (N,OC), inp (N,C), w (OC,C)
    if (dinp) {
        mmp_cpu_gemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    }
    if (dw) {
        mmp_cpu_gemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    }
    if (db) {
        /* db[o] += ((0 + dout[0][o]) + dout[1][o]) + ...: one float sum per o
         * in row order, kept for DB_CHUNK columns at once so that dout is
         * read along its rows (a column walk strides OC floats per add) */
        enum { DB_CHUNK = 256 };
        for (int o0 = 0; o0 < OC; o0 += DB_CHUNK) {
            int w = OC - o0 < DB_CHUNK ? OC - o0 : DB_CHUNK;
            float sum[DB_CHUNK];
            for (int o = 0; o < w; o++) {
                sum[o] = 0.0f;
            }
            for (int n = 0; n < N; n++) {
                const float *row = dout + (size_t)n * OC + o0;
                for (int o = 0; o < w; o++) {
                    sum[o] += row[o];
                }
            }
            for (int o = 0; o < w; o++) {
                db[o0 + o] += sum[o];
            }
        }
    }
}
