/* Validation recall@1 (nn/retrieval.h): equal to the algorithm it replaced
 * (an n x n sgemm and a scan of it, kept below as the reference) on random
 * embeddings and on embeddings full of exact ties, duplicates, zeros and
 * NaNs; independent of the block size; and, in a child whose address space
 * is too small for the n x n matrix, the reference fails where the blocked
 * one answers; the same bits with 1, 2 and 4 threads, progress on the
 * caller. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu.h"
#include "nn/model.h"
#include "nn/retrieval.h"
#include "tests/harness.h"

/* The pre-blocking mmp_retrieval_r1, verbatim but for the backend call
 * (the CPU backend's gemm is this cblas_sgemm). */
static mmp_err reference_r1(const float *img_emb, const float *txt_emb, int n, int E, double *i2t,
                            double *t2i)
{
    float *sim = malloc((size_t)n * (size_t)n * sizeof(float) + 1);
    if (!sim) {
        return mmp_errorf(MMP_ERR_NOMEM, "similarity matrix %d x %d", n, n);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, E, 1.0f, img_emb, E, txt_emb, E,
                0.0f, sim, n);
    int hit_i = 0, hit_t = 0;
    for (int a = 0; a < n; a++) {
        int ok_i = 1, ok_t = 1;
        float own = sim[(size_t)a * n + a];
        for (int b = 0; b < n; b++) {
            if (b == a) {
                continue;
            }
            if (sim[(size_t)a * n + b] >= own) {
                ok_i = 0;
            }
            if (sim[(size_t)b * n + a] >= own) {
                ok_t = 0;
            }
        }
        hit_i += ok_i;
        hit_t += ok_t;
    }
    free(sim);
    *i2t = n ? (double)hit_i / n : 0;
    *t2i = n ? (double)hit_t / n : 0;
    return MMP_OK;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* kind 0: uniform in [-1, 1); 1: quarters in -2..2 (exact sums: many exact
 * ties); 2: like 1 with duplicated rows, zero rows, the partner copied to
 * another candidate, a NaN or an infinity here and there. */
static void fill(float *x, int n, int E, int kind)
{
    for (size_t i = 0; i < (size_t)n * E; i++) {
        x[i] = kind == 0 ? (float)(next_u32() % 65536) / 32768.0f - 1.0f
                         : (float)((int)(next_u32() % 17) - 8) / 4.0f;
    }
    if (kind == 2) {
        for (int r = 0; r < n; r++) {
            uint32_t u = next_u32() % 16;
            float *row = x + (size_t)r * E;
            if (u == 0 && n > 1) {
                memcpy(row, x + (size_t)(next_u32() % n) * E, (size_t)E * sizeof(float));
            } else if (u == 1) {
                memset(row, 0, (size_t)E * sizeof(float));
            } else if (u == 2) {
                row[next_u32() % E] = NAN;
            } else if (u == 3) {
                row[next_u32() % E] = (next_u32() & 1) ? INFINITY : -INFINITY;
            }
        }
    }
}

static void compare(int n, int E, int kind)
{
    float *img = malloc((size_t)n * E * sizeof(float) + 1);
    float *txt = malloc((size_t)n * E * sizeof(float) + 1);
    fill(img, n, E, kind);
    fill(txt, n, E, kind);
    if (kind == 2 && n > 2) {
        /* text 1 is image 0's partner too: an exact tie for pair 0 */
        memcpy(txt + E, txt, (size_t)E * sizeof(float));
    }
    double ri = -1, rt = -1;
    CHECK_OK(reference_r1(img, txt, n, E, &ri, &rt));
    const int rows[] = {0, 1, 3, 4, 64, n};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        double i2t = -1, t2i = -1;
        CHECK_OK(mmp_retrieval_r1_blocked(img, txt, n, E, rows[k], NULL, NULL, &i2t, &t2i));
        if (i2t != ri || t2i != rt) {
            fprintf(stderr,
                    "  n %d E %d kind %d rows %d: recall %.17g/%.17g, reference %.17g/%.17g\n", n,
                    E, kind, rows[k], i2t, t2i, ri, rt);
        }
        CHECK(i2t == ri && t2i == rt);
    }
    double i2t = -1, t2i = -1;
    CHECK_OK(mmp_retrieval_r1(img, txt, n, E, &i2t, &t2i));
    CHECK(i2t == ri && t2i == rt);
    free(img);
    free(txt);
}

/* The similarities' bits: each is the header's order, s = fma(img[k],
 * txt[k], s) for k from 0 (computed here one by one), whatever the block
 * size and kernel. Where OpenBLAS's n x n sgemm (the old code's matrix)
 * gives other bits, that is counted and printed, not judged: its order
 * depends on its version and CPU (it splits long sums, E > 448 on this
 * machine's AVX-512 kernels). */
static void check_similarities(int n, int E)
{
    float *img = malloc((size_t)n * E * sizeof(float));
    float *txt = malloc((size_t)n * E * sizeof(float));
    float *sim = malloc((size_t)n * n * sizeof(float));
    float *ref = malloc((size_t)n * n * sizeof(float));
    fill(img, n, E, 0);
    fill(txt, n, E, 0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, E, 1.0f, img, E, txt, E, 0.0f, ref,
                n);
    const int rows[] = {1, 5, 64};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        CHECK_OK(mmp_retrieval_similarities(img, txt, n, E, rows[r], sim));
        size_t wrong = 0, blas = 0;
        for (int a = 0; a < n; a++) {
            for (int b = 0; b < n; b++) {
                float s = 0;
                for (int k = 0; k < E; k++) {
                    s = fmaf(img[(size_t)a * E + k], txt[(size_t)b * E + k], s);
                }
                float x = sim[(size_t)a * n + b];
                wrong += memcmp(&x, &s, sizeof x) != 0;
                blas += memcmp(&x, &ref[(size_t)a * n + b], sizeof x) != 0;
            }
        }
        if (wrong || (blas && r == 0)) {
            fprintf(stderr,
                    "  n %d E %d rows %d: %zu similarities off the fma order, %zu differ "
                    "from sgemm's\n",
                    n, E, rows[r], wrong, blas);
        }
        CHECK(wrong == 0);
    }
    free(img);
    free(txt);
    free(sim);
    free(ref);
}

/* Every kernel this CPU has (scalar fmaf, AVX2, AVX-512), each against the
 * reference. */
static void test_equal_to_reference(void)
{
    /* 259 crosses a 256-text tile; 517 two (Release only: under the
     * sanitizers it alone took 30 s of this test's 41) */
#ifdef MMP_TEST_UNDER_ASAN
    const int ns[] = {1, 2, 3, 17, 64, 100, 259};
#else
    const int ns[] = {1, 2, 3, 17, 64, 100, 259, 517};
#endif
    const int Es[] = {1, 3, 16, 64, 100, 256};
    const char *isas[] = {"scalar", "avx2", "avx512"};
    for (size_t s = 0; s < 3; s++) {
        if (!mmp_retrieval_force_isa(isas[s])) {
            fprintf(stderr, "  (%s: not on this CPU)\n", isas[s]);
            continue;
        }
        int failed = mmp_test_failures;
        check_similarities(100, 64);
        check_similarities(37, 256);
        check_similarities(70, 500);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            for (size_t j = 0; j < sizeof Es / sizeof Es[0]; j++) {
                for (int kind = 0; kind < 3; kind++) {
                    compare(ns[i], Es[j], kind);
                }
            }
        }
        if (mmp_test_failures > failed) {
            fprintf(stderr, "  ... with the %s kernel\n", isas[s]);
        }
    }
    CHECK(mmp_retrieval_force_isa(NULL));
}

/* All similarities equal (every pair ties with every other): no hit at
 * all; orthogonal partners (identity embeddings): every pair a hit. */
static void test_tie_rule(void)
{
    enum { N = 40, E = 40 };
    static float img[N * E], txt[N * E];
    for (int i = 0; i < N * E; i++) {
        img[i] = txt[i] = 0.5f;
    }
    double i2t = -1, t2i = -1;
    CHECK_OK(mmp_retrieval_r1(img, txt, N, E, &i2t, &t2i));
    CHECK(i2t == 0 && t2i == 0);
    memset(img, 0, sizeof img);
    memset(txt, 0, sizeof txt);
    for (int i = 0; i < N; i++) {
        img[i * E + i] = txt[i * E + i] = 1;
    }
    CHECK_OK(mmp_retrieval_r1(img, txt, N, E, &i2t, &t2i));
    CHECK(i2t == 1 && t2i == 1);
    /* pair 7's text copied onto text 8: image 7 and image 8 tie on text 8 */
    for (int k = 0; k < E; k++) {
        txt[8 * E + k] = txt[7 * E + k];
    }
    CHECK_OK(mmp_retrieval_r1(img, txt, N, E, &i2t, &t2i));
    CHECK(i2t == (double)(N - 2) / N && t2i == (double)(N - 1) / N);
}

static void count_progress(void *ctx, int64_t done, int64_t n)
{
    int64_t *last = ctx;
    if (done > last[0] && done <= n) {
        last[0] = done;
        last[1]++;
    } else {
        last[1] = -1000000; /* out of order or past the end */
    }
}

static void test_progress(void)
{
    enum { N = 100, E = 8 };
    static float img[N * E], txt[N * E];
    fill(img, N, E, 0);
    fill(txt, N, E, 0);
    int64_t seen[2] = {0, 0};
    double i2t, t2i;
    CHECK_OK(mmp_retrieval_r1_blocked(img, txt, N, E, 30, count_progress, seen, &i2t, &t2i));
    CHECK(seen[0] == N && seen[1] == 4); /* rows 30, 60, 90, 100 */
}

/* progress must come on the thread that called (it talks to the
 * coordinator): ctx[0] counts calls, ctx[1] calls from another thread */
static pthread_t caller;
static void progress_thread(void *ctx, int64_t done, int64_t n)
{
    int *seen = ctx;
    (void)done, (void)n;
    seen[0]++;
    seen[1] += !pthread_equal(pthread_self(), caller);
}

/* With 1, 2 and 4 threads (the kernels' pool splits each block of image
 * rows by texts, parts not on tile boundaries): the same recall and every
 * similarity the same bits. Sizes big enough for several parts per block;
 * ties, duplicates, NaNs and infinities (fill kind 2), and texts from 128
 * on all NaN, so that the parts holding only those find no comparable text
 * for any image (their partial maxima NaN, which the merge must not take). */
static void test_threads(void)
{
    static const struct {
        int n, E, rows, kind, nan_from;
    } cases[] = {
        {259, 256, 0, 0, -1},  {259, 256, 0, 2, -1},   {259, 256, 0, 1, 128}, {700, 100, 64, 2, -1},
        {700, 100, 64, 1, -1}, {700, 100, 64, 2, 128}, {517, 64, 37, 2, -1},  {64, 16, 0, 2, -1},
    };
    caller = pthread_self();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c].n, E = cases[c].E;
        float *img = malloc((size_t)n * E * sizeof(float));
        float *txt = malloc((size_t)n * E * sizeof(float));
        float *sim1 = malloc((size_t)n * n * sizeof(float));
        float *sim = malloc((size_t)n * n * sizeof(float));
        fill(img, n, E, cases[c].kind);
        fill(txt, n, E, cases[c].kind);
        memcpy(txt + E, txt, (size_t)E * sizeof(float)); /* an exact tie for pair 0 */
        for (int b = cases[c].nan_from; b >= 0 && b < n; b++) {
            txt[(size_t)b * E + (size_t)b % E] = NAN;
        }
        double r1[2] = {-1, -1};
        const int threads[] = {1, 2, 4};
        for (size_t t = 0; t < 3; t++) {
            mmp_cpu_set_threads(threads[t]);
            double r[2] = {-1, -1};
            int seen[2] = {0, 0};
            CHECK_OK(mmp_retrieval_r1_blocked(img, txt, n, E, cases[c].rows, progress_thread, seen,
                                              &r[0], &r[1]));
            CHECK_OK(
                mmp_retrieval_similarities(img, txt, n, E, cases[c].rows, t == 0 ? sim1 : sim));
            int rows = cases[c].rows > 0 ? cases[c].rows : 64;
            CHECK(seen[0] == (n + rows - 1) / rows && seen[1] == 0);
            if (t == 0) {
                memcpy(r1, r, sizeof r);
                continue;
            }
            size_t diff = 0;
            for (size_t i = 0; i < (size_t)n * n; i++) {
                diff += memcmp(&sim[i], &sim1[i], sizeof(float)) != 0;
            }
            if (memcmp(r, r1, sizeof r) != 0 || diff) {
                fprintf(stderr,
                        "  n %d E %d rows %d kind %d nan_from %d, %d threads: recall "
                        "%.17g/%.17g, 1 thread %.17g/%.17g; %zu similarities differ\n",
                        n, E, cases[c].rows, cases[c].kind, cases[c].nan_from, threads[t], r[0],
                        r[1], r1[0], r1[1], diff);
            }
            CHECK(memcmp(r, r1, sizeof r) == 0 && diff == 0);
        }
        mmp_cpu_set_threads(1);
        free(img);
        free(txt);
        free(sim1);
        free(sim);
    }
}

/* n pairs whose n x n matrix (n*n*4 bytes) is over the address space a
 * child is left: the reference cannot allocate it, the blocked one answers
 * (and equals the reference's answer computed without the limit). */
static void test_memory_limit(void)
{
#ifdef MMP_TEST_UNDER_ASAN
    fprintf(stderr, "  (memory limit part skipped: RLIMIT_AS and ASan's shadow do not mix)\n");
#else
    enum { N = 12000, E = 8 }; /* the matrix: 576 MB; the embeddings: 768 KB */
    float *img = malloc((size_t)N * E * sizeof(float));
    float *txt = malloc((size_t)N * E * sizeof(float));
    fill(img, N, E, 0);
    fill(txt, N, E, 0);
    /* the answer, computed first without a limit */
    double ri = -1, rt = -1;
    CHECK_OK(reference_r1(img, txt, N, E, &ri, &rt));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* what the child maps now, plus 256 MB: less than half the matrix */
        if (mmp_test_limit_address_space((size_t)256 << 20) != 0) {
            _exit(11);
        }
        int problems = 0;
        double i2t = -1, t2i = -1;
        if (reference_r1(img, txt, N, E, &i2t, &t2i) != MMP_ERR_NOMEM) {
            PROBLEM(problems, "the reference found %zu bytes under the limit",
                    (size_t)N * N * sizeof(float));
        }
        mmp_err e = mmp_retrieval_r1(img, txt, N, E, &i2t, &t2i);
        if (e != MMP_OK) {
            PROBLEM(problems, "under the limit: %s", mmp_last_error());
        } else if (i2t != ri || t2i != rt) {
            PROBLEM(problems, "under the limit: recall %g/%g, reference %g/%g", i2t, t2i, ri, rt);
        }
        _exit(problems ? 1 : 0);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(img);
    free(txt);
#endif
}

int main(void)
{
    test_equal_to_reference();
    test_tie_rule();
    test_progress();
    test_threads();
    test_memory_limit();
    return mmp_test_finish("test_retrieval");
}
