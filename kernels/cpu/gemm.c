/* GEMM and linear layers on the CPU: every matrix product in the CPU kernels
 * goes through mmp_cpu_gemm, so how a product is computed is decided in one
 * place.
 *
 * A product's bits must not depend on the thread count (train.threads: a
 * run with 2 threads equals one with 1, and the single process, bitwise).
 * OpenBLAS's own threading does not give that: it cuts the product among
 * its threads by the thread count, and an element near a cut can come from
 * another micro-kernel (seen: OpenBLAS 0.3.21's Haswell kernels on an AMD
 * EPYC, conv2d forward and weight gradient, 1 vs 3 threads). So OpenBLAS
 * always runs one thread, and mmp_cpu_gemm cuts a product itself into
 * blocks of rows of C (or columns, when C is wider than tall) that depend
 * on the shape only; each block is one single-threaded OpenBLAS
 * call, and the blocks run across the kernels' pool (kernels/cpu/parallel.h).
 * Every block is computed the same way whichever thread runs it. */
#include "kernels/cpu.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/parallel.h"

/* How a product is cut: into at most GEMM_MAX_BLOCKS blocks of at least
 * GEMM_MIN_BLOCK rows (or columns), each a multiple of 16 (the kernels'
 * widest register tile). Few blocks keep the calls' overhead and the
 * repacking of the other operand per call small (at one thread the demo's
 * convolutions take the time they took as one call each, bench_conv);
 * 16 give a large product a block for every thread of a 16-core host.
 * Changing either changes the bits of every product. */
enum { GEMM_MAX_BLOCKS = 16, GEMM_MIN_BLOCK = 256 };

/* Products smaller than this (multiply-adds; about 0.1 ms on one core) run
 * their blocks on the calling thread: handing them to the pool costs more
 * than it saves. Where the blocks run never changes their bits. (The demo,
 * single process, alternating with the build before, 2026-11-28: 1 thread
 * 94.7 vs 94.2 ms a step, 2 threads 76.7 vs 84.3 ms.) */
#define GEMM_PARALLEL_MACS (1024.0 * 1024.0)

/* 0 until OpenBLAS was pinned to one thread (its own default is every core,
 * which fights with the pipeline's other stages). */
static atomic_int blas_pinned;

static void pin_blas(void)
{
    if (!atomic_load(&blas_pinned)) {
        openblas_set_num_threads(1);
        atomic_store(&blas_pinned, 1);
    }
}

void mmp_cpu_set_threads(int n)
{
    pin_blas();
    mmp_cpu_pool_resize(n);
}

const char *mmp_cpu_blas_kernels(void)
{
    static char name[160];
    if (!name[0]) {
        const char *config = openblas_get_config(), *core = openblas_get_corename();
        snprintf(name, sizeof name, "%s / %s", config ? config : "OpenBLAS",
                 core ? core : "unknown");
    }
    return name;
}

typedef struct gemm_job {
    int trans_a, trans_b, M, N, K, by_rows;
    int block; /* rows (or columns) of each block but the last */
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
} gemm_job;

static void gemm_range(void *ctx, size_t lo, size_t hi)
{
    const gemm_job *j = ctx;
    for (size_t b = lo; b < hi; b++) {
        int first = (int)b * j->block;
        int M = j->M, N = j->N;
        const float *A = j->A, *B = j->B;
        float *C = j->C;
        if (j->by_rows) { /* rows [first, first + M) of C and op(A) */
            M = M - first < j->block ? M - first : j->block;
            A += j->trans_a ? (size_t)first : (size_t)first * j->lda;
            C += (size_t)first * j->ldc;
        } else { /* columns [first, first + N) of C and op(B) */
            N = N - first < j->block ? N - first : j->block;
            B += j->trans_b ? (size_t)first * j->ldb : (size_t)first;
            C += first;
        }
        cblas_sgemm(CblasRowMajor, j->trans_a ? CblasTrans : CblasNoTrans,
                    j->trans_b ? CblasTrans : CblasNoTrans, M, N, j->K, j->alpha, A, j->lda, B,
                    j->ldb, j->beta, C, j->ldc);
    }
}

void mmp_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    // C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, all row-major
    if (M <= 0 || N <= 0) {
        return;
    }
    pin_blas();
    gemm_job j = {.trans_a = trans_a,
                  .trans_b = trans_b,
                  .M = M,
                  .N = N,
                  .K = K,
                  .by_rows = M >= N,
                  .alpha = alpha,
                  .beta = beta,
                  .A = A,
                  .B = B,
                  .C = C,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc};
    int cut = j.by_rows ? M : N;
    int want = (cut + GEMM_MIN_BLOCK - 1) / GEMM_MIN_BLOCK;
    want = want < GEMM_MAX_BLOCKS ? want : GEMM_MAX_BLOCKS;
    j.block = (cut + want - 1) / want;
    j.block = (j.block + 15) / 16 * 16;
    size_t blocks = (size_t)(cut + j.block - 1) / (size_t)j.block;
    if (blocks == 1 || (double)M * N * K < GEMM_PARALLEL_MACS) {
        gemm_range(&j, 0, blocks); /* the same blocks, on this thread */
        return;
    }
    mmp_cpu_parallel_for(blocks, 1, gemm_range, &j);
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
