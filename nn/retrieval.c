/* Retrieval metrics over ITC embeddings (validation recall@1), nn/retrieval.h.
 * A metric the host reads element by element: the embeddings are HOST memory
 * (a device stage copies its embeddings to the host first) and the
 * similarities are computed here, on the CPU, one tile at a time. This file
 * must never hold the n x n similarity matrix (100k validation pairs would be
 * 40 GB) and never let a similarity's bits depend on where its tile falls:
 * a BLAS picks kernels by the matrix's shape (OpenBLAS's small-matrix and
 * edge kernels round differently), so the dot products are its own, in the
 * one order the header states. */
#include "nn/retrieval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/parallel.h"
#include "nn/model.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

enum {
    PANEL = 16,      /* texts per packed panel: two AVX vectors */
    TILE_COLS = 256, /* texts per packed tile (16 panels) */
    GROUP = 8,       /* image rows per kernel call */
    DEFAULT_ROWS = 64,
};

/* out[r][j] (rows <= GROUP, PANEL) = sum_k img[r][k] * panel[k][j], one
 * fmaf per term in k order from 0. img (rows,E) rows E apart, panel (E,PANEL)
 * a packed panel. The reference: the vector path computes the same bits. */
static void panel_scalar(const float *img, int rows, int E, const float *panel,
                         float out[GROUP][PANEL])
{
    for (int r = 0; r < rows; r++) {
        float acc[PANEL] = {0};
        const float *a = img + (size_t)r * E;
        for (int k = 0; k < E; k++) {
            for (int j = 0; j < PANEL; j++) {
                acc[j] = fmaf(a[k], panel[(size_t)k * PANEL + j], acc[j]);
            }
        }
        for (int j = 0; j < PANEL; j++) {
            out[r][j] = acc[j];
        }
    }
}

#ifdef HAVE_AVX2_PATH
/* panel_scalar with AVX2 FMA: each lane is one (r, j) sum, fused
 * multiply-add per term in the same k order, so the bits are the same. Four
 * rows at a time, then one. */
__attribute__((target("avx2,fma"))) static void
panel_avx2(const float *img, int rows, int E, const float *panel, float out[GROUP][PANEL])
{
    for (; rows >= 4; rows -= 4, img += 4 * (size_t)E, out += 4) {
        __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
        __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
        __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
        __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
        const float *a0 = img, *a1 = img + E, *a2 = img + 2 * (size_t)E, *a3 = img + 3 * (size_t)E;
        for (int k = 0; k < E; k++) {
            const float *p = panel + (size_t)k * PANEL;
            __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
            __m256 x = _mm256_broadcast_ss(a0 + k);
            c00 = _mm256_fmadd_ps(x, b0, c00);
            c01 = _mm256_fmadd_ps(x, b1, c01);
            x = _mm256_broadcast_ss(a1 + k);
            c10 = _mm256_fmadd_ps(x, b0, c10);
            c11 = _mm256_fmadd_ps(x, b1, c11);
            x = _mm256_broadcast_ss(a2 + k);
            c20 = _mm256_fmadd_ps(x, b0, c20);
            c21 = _mm256_fmadd_ps(x, b1, c21);
            x = _mm256_broadcast_ss(a3 + k);
            c30 = _mm256_fmadd_ps(x, b0, c30);
            c31 = _mm256_fmadd_ps(x, b1, c31);
        }
        _mm256_storeu_ps(out[0], c00);
        _mm256_storeu_ps(out[0] + 8, c01);
        _mm256_storeu_ps(out[1], c10);
        _mm256_storeu_ps(out[1] + 8, c11);
        _mm256_storeu_ps(out[2], c20);
        _mm256_storeu_ps(out[2] + 8, c21);
        _mm256_storeu_ps(out[3], c30);
        _mm256_storeu_ps(out[3] + 8, c31);
    }
    for (int r = 0; r < rows; r++) {
        __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
        const float *a = img + (size_t)r * E;
        for (int k = 0; k < E; k++) {
            const float *p = panel + (size_t)k * PANEL;
            __m256 x = _mm256_broadcast_ss(a + k);
            c0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(p), c0);
            c1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(p + 8), c1);
        }
        _mm256_storeu_ps(out[r], c0);
        _mm256_storeu_ps(out[r] + 8, c1);
    }
}

/* panel_scalar with AVX-512: one 16-lane accumulator per row, eight rows at
 * once; the same fused multiply-add per term in the same order. */
__attribute__((target("avx512f"))) static void
panel_avx512(const float *img, int rows, int E, const float *panel, float out[GROUP][PANEL])
{
    if (rows == GROUP) {
        __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(),
               c3 = _mm512_setzero_ps(), c4 = _mm512_setzero_ps(), c5 = _mm512_setzero_ps(),
               c6 = _mm512_setzero_ps(), c7 = _mm512_setzero_ps();
        const size_t e = (size_t)E;
        for (int k = 0; k < E; k++) {
            __m512 b = _mm512_loadu_ps(panel + (size_t)k * PANEL);
            c0 = _mm512_fmadd_ps(_mm512_set1_ps(img[k]), b, c0);
            c1 = _mm512_fmadd_ps(_mm512_set1_ps(img[e + k]), b, c1);
            c2 = _mm512_fmadd_ps(_mm512_set1_ps(img[2 * e + k]), b, c2);
            c3 = _mm512_fmadd_ps(_mm512_set1_ps(img[3 * e + k]), b, c3);
            c4 = _mm512_fmadd_ps(_mm512_set1_ps(img[4 * e + k]), b, c4);
            c5 = _mm512_fmadd_ps(_mm512_set1_ps(img[5 * e + k]), b, c5);
            c6 = _mm512_fmadd_ps(_mm512_set1_ps(img[6 * e + k]), b, c6);
            c7 = _mm512_fmadd_ps(_mm512_set1_ps(img[7 * e + k]), b, c7);
        }
        _mm512_storeu_ps(out[0], c0);
        _mm512_storeu_ps(out[1], c1);
        _mm512_storeu_ps(out[2], c2);
        _mm512_storeu_ps(out[3], c3);
        _mm512_storeu_ps(out[4], c4);
        _mm512_storeu_ps(out[5], c5);
        _mm512_storeu_ps(out[6], c6);
        _mm512_storeu_ps(out[7], c7);
        return;
    }
    for (int r = 0; r < rows; r++) {
        __m512 c = _mm512_setzero_ps();
        const float *a = img + (size_t)r * E;
        for (int k = 0; k < E; k++) {
            c = _mm512_fmadd_ps(_mm512_set1_ps(a[k]), _mm512_loadu_ps(panel + (size_t)k * PANEL),
                                c);
        }
        _mm512_storeu_ps(out[r], c);
    }
}
#endif

typedef void (*panel_fn)(const float *img, int rows, int E, const float *panel,
                         float out[GROUP][PANEL]);

/* The kernel for this CPU, or the one a test forced (mmp_retrieval_force_isa). */
static panel_fn forced;

static panel_fn isa_panel(const char *isa)
{
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!isa) {
        return avx512 ? panel_avx512 : avx2 ? panel_avx2 : panel_scalar;
    }
    if (strcmp(isa, "avx512") == 0) {
        return avx512 ? panel_avx512 : NULL;
    }
    if (strcmp(isa, "avx2") == 0) {
        return avx2 ? panel_avx2 : NULL;
    }
#endif
    return !isa || strcmp(isa, "scalar") == 0 ? panel_scalar : NULL;
}

int mmp_retrieval_force_isa(const char *isa)
{
    panel_fn f = isa ? isa_panel(isa) : NULL;
    if (isa && !f) {
        return 0;
    }
    forced = f;
    return 1;
}

static panel_fn pick_panel(void)
{
    return forced ? forced : isa_panel(NULL);
}

/* best = the larger of best and x, NaN x never taken; a NaN best means none
 * yet. Exact (no rounding), so "some x >= own" is "best >= own". */
static inline void keep_max(float *best, float x)
{
    if (x == x && !(x <= *best)) {
        *best = x;
    }
}

/* One block of image rows [a0, a1) against every text, split across the
 * kernels' pool (kernels/cpu/parallel.h) by texts: part p of parts takes
 * panels [p*panels/parts, (p+1)*panels/parts), packs them a tile at a time
 * into its own pack buffer and compares every row of the block with them.
 * Splitting by texts keeps the packing work what one thread does (each text
 * packed once per block) and needs no per-part array of n: col_best, diag
 * and all are per text, so each part writes its own texts' entries, in the
 * same row order as one thread; row_best is per image row, so each part
 * keeps its maxima over its texts in part_best (parts, a1 - a0) and the
 * caller merges them in part order (merge_rows). */
typedef struct {
    const float *img, *txt;
    int n, E, a0, a1, parts, panels;
    panel_fn kernel;
    float *diag, *col_best, *all;
    float *part_best; /* (parts, rows) */
    float *packs;     /* (parts, TILE_COLS * E) */
    int rows;
} block_job;

static void block_part(const block_job *j, int part)
{
    const int n = j->n, E = j->E, a0 = j->a0, a1 = j->a1;
    const size_t nn = (size_t)n;
    float *pack = j->packs + (size_t)part * TILE_COLS * (size_t)(E > 0 ? E : 1);
    float *best = j->part_best + (size_t)part * (size_t)j->rows;
    for (int r = 0; r < a1 - a0; r++) {
        best[r] = NAN;
    }
    int p_lo = (int)((int64_t)j->panels * part / j->parts);
    int p_hi = (int)((int64_t)j->panels * (part + 1) / j->parts);
    for (int t0 = p_lo; t0 < p_hi; t0 += TILE_COLS / PANEL) {
        int panels = p_hi - t0 < TILE_COLS / PANEL ? p_hi - t0 : TILE_COLS / PANEL;
        int b0 = t0 * PANEL;
        int bw = n - b0 < panels * PANEL ? n - b0 : panels * PANEL;
        /* pack[p][k][j] = txt[b0 + p*PANEL + j][k], zeros past the last text */
        for (int p = 0; p < panels; p++) {
            float *dst = pack + (size_t)p * E * PANEL;
            for (int jj = 0; jj < PANEL; jj++) {
                int b = b0 + p * PANEL + jj;
                const float *src = b < n ? j->txt + (size_t)b * E : NULL;
                for (int k = 0; k < E; k++) {
                    dst[(size_t)k * PANEL + jj] = src ? src[k] : 0.0f;
                }
            }
        }
        for (int g = a0; g < a1; g += GROUP) {
            int gr = a1 - g < GROUP ? a1 - g : GROUP;
            for (int p = 0; p < panels; p++) {
                float out[GROUP][PANEL];
                j->kernel(j->img + (size_t)g * E, gr, E, pack + (size_t)p * E * PANEL, out);
                int pw = bw - p * PANEL < PANEL ? bw - p * PANEL : PANEL;
                for (int r = 0; r < gr; r++) {
                    int a = g + r;
                    for (int jj = 0; jj < pw; jj++) {
                        int b = b0 + p * PANEL + jj;
                        float x = out[r][jj];
                        if (j->all) {
                            j->all[(size_t)a * nn + b] = x;
                        }
                        if (a == b) {
                            j->diag[a] = x;
                        } else {
                            keep_max(&best[a - a0], x);
                            keep_max(&j->col_best[b], x);
                        }
                    }
                }
            }
        }
    }
}

/* mmp_cpu_range_fn over parts: a pool that runs fewer ranges than parts
 * (busy, or a fork child) hands one thread several, each with its own
 * scratch, so the bits never depend on how many ran. */
static void block_range(void *ctx, size_t lo, size_t hi)
{
    for (size_t p = lo; p < hi; p++) {
        block_part(ctx, (int)p);
    }
}

/* row_best[a] over the block's parts in part order, i.e. in text order as
 * one thread scans them: keep_max keeps the first of equal maxima (+0 and
 * -0 among them) and never takes a part's NaN (none of its texts
 * comparable), so the result has one thread's bits. */
static void merge_rows(const block_job *j, float *row_best)
{
    for (int p = 0; p < j->parts; p++) {
        const float *best = j->part_best + (size_t)p * (size_t)j->rows;
        for (int a = j->a0; a < j->a1; a++) {
            keep_max(&row_best[a], best[a - j->a0]);
        }
    }
}

/* Fused multiply-adds a part should have at least, per block: far above
 * what waking a worker costs. */
#define PART_MIN_FMAS (1 << 20)

/* mmp_retrieval_r1_blocked, also writing every similarity to all (n,n)
 * when all is not NULL (mmp_retrieval_similarities). Blocks run one after
 * another on the calling thread (which alone calls progress), each split
 * across the kernels' pool (block_part). */
static mmp_err r1_core(const float *img_emb, const float *txt_emb, int n, int E, int rows,
                       mmp_retrieval_progress progress, void *ctx, double *i2t, double *t2i,
                       float *all)
{
    *i2t = *t2i = 0;
    if (n <= 0) {
        return MMP_OK;
    }
    if (rows <= 0) {
        rows = DEFAULT_ROWS;
    }
    if (rows > n) {
        rows = n;
    }
    size_t nn = (size_t)n;
    int panels = (n + PANEL - 1) / PANEL;
    int threads = mmp_cpu_pool_threads();
    int max_parts = threads < panels ? threads : panels;
    size_t pack_floats = (size_t)TILE_COLS * (size_t)(E > 0 ? E : 1);
    /* diag[a] = sim(a, a); row_best[a] = max over b != a of sim(a, b) (image
     * a's best other text); col_best[b] = max over a != b of sim(a, b). */
    float *diag = malloc(nn * sizeof(float));
    float *row_best = malloc(nn * sizeof(float));
    float *col_best = malloc(nn * sizeof(float));
    float *packs = malloc((size_t)max_parts * pack_floats * sizeof(float));
    float *part_best = malloc((size_t)max_parts * (size_t)rows * sizeof(float));
    if (!diag || !row_best || !col_best || !packs || !part_best) {
        free(diag);
        free(row_best);
        free(col_best);
        free(packs);
        free(part_best);
        return mmp_errorf(MMP_ERR_NOMEM,
                          "retrieval over %d pairs: %zu bytes of best scores and %zu of tiles and "
                          "partial maxima for %d threads",
                          n, 3 * nn * sizeof(float),
                          (size_t)max_parts * (pack_floats + (size_t)rows) * sizeof(float),
                          max_parts);
    }
    for (size_t i = 0; i < nn; i++) {
        diag[i] = row_best[i] = col_best[i] = NAN;
    }
    block_job job = {.img = img_emb,
                     .txt = txt_emb,
                     .n = n,
                     .E = E,
                     .panels = panels,
                     .kernel = pick_panel(),
                     .diag = diag,
                     .col_best = col_best,
                     .all = all,
                     .part_best = part_best,
                     .packs = packs,
                     .rows = rows};
    for (int a0 = 0; a0 < n; a0 += rows) {
        int a1 = n - a0 < rows ? n : a0 + rows;
        /* panels per part: at least PART_MIN_FMAS of work each */
        int64_t per_panel = (int64_t)(a1 - a0) * PANEL * (E > 0 ? E : 1);
        int64_t grain = (PART_MIN_FMAS + per_panel - 1) / per_panel;
        int64_t parts = panels / grain;
        job.a0 = a0;
        job.a1 = a1;
        job.parts = parts < 1 ? 1 : parts > max_parts ? max_parts : (int)parts;
        mmp_cpu_parallel_for((size_t)job.parts, 1, block_range, &job);
        merge_rows(&job, row_best);
        if (progress) {
            progress(ctx, a1, n);
        }
    }
    /* a hit: no other candidate at least as similar as its own partner
     * (NaN best: none comparable; NaN own: never beaten) */
    int64_t hit_i = 0, hit_t = 0;
    for (size_t a = 0; a < nn; a++) {
        hit_i += !(row_best[a] >= diag[a]);
        hit_t += !(col_best[a] >= diag[a]);
    }
    free(diag);
    free(row_best);
    free(col_best);
    free(packs);
    free(part_best);
    *i2t = (double)hit_i / n;
    *t2i = (double)hit_t / n;
    return MMP_OK;
}

mmp_err mmp_retrieval_r1_blocked(const float *img_emb, const float *txt_emb, int n, int E, int rows,
                                 mmp_retrieval_progress progress, void *ctx, double *i2t,
                                 double *t2i)
{
    return r1_core(img_emb, txt_emb, n, E, rows, progress, ctx, i2t, t2i, NULL);
}

mmp_err mmp_retrieval_similarities(const float *img_emb, const float *txt_emb, int n, int E,
                                   int rows, float *sim)
{
    double i2t, t2i;
    return r1_core(img_emb, txt_emb, n, E, rows, NULL, NULL, &i2t, &t2i, sim);
}

mmp_err mmp_retrieval_r1(const float *img_emb, const float *txt_emb, int n, int E, double *i2t,
                         double *t2i)
{
    return mmp_retrieval_r1_blocked(img_emb, txt_emb, n, E, 0, NULL, NULL, i2t, t2i);
}
