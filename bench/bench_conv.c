/* Benchmark of the CPU conv2d kernels on the demo image branch's shapes
 * (configs/demo.yaml: 32x32 images, channels 16/32/64/128, micro-batch 16);
 * prints a Markdown table, judges nothing.
 *
 * For each shape: median microseconds of --reps calls (default 50) of the
 * forward and of the backward (input and weight gradients), one thread
 * unless --threads, and an FNV-1a hash of the outputs' bits, so two builds
 * can be compared for speed and for identical results in one look. --only
 * ROW runs row ROW (from 0) alone, for a profiler. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu.h"

typedef struct {
    const char *name;
    int C, H, OC, k, stride;
} conv_case;

static const conv_case cases[] = {
    {"stem 3->16 3x3/1 32x32", 3, 32, 16, 3, 1}, {"b1 16->16 3x3/1 32x32", 16, 32, 16, 3, 1},
    {"b2 16->32 3x3/2 32x32", 16, 32, 32, 3, 2}, {"b2 32->32 3x3/1 16x16", 32, 16, 32, 3, 1},
    {"b2 down 16->32 1x1/2", 16, 32, 32, 1, 2},  {"b3 32->64 3x3/2 16x16", 32, 16, 64, 3, 2},
    {"b3 64->64 3x3/1 8x8", 64, 8, 64, 3, 1},    {"b3 down 32->64 1x1/2", 32, 16, 64, 1, 2},
    {"b4 64->128 3x3/2 8x8", 64, 8, 128, 3, 2},  {"b4 128->128 3x3/1 4x4", 128, 4, 128, 3, 1},
    {"b4 down 64->128 1x1/2", 64, 8, 128, 1, 2},
};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t fnv(uint64_t h, const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

static void fill(float *p, size_t n, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((*state >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
}

int main(int argc, char **argv)
{
    int reps = 50, threads = 1, N = 16, only = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            N = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_conv [--reps N] [--threads N] [--batch N] [--only ROW]\n"
                   "median us of the demo's conv2d forward and backward per shape, and a\n"
                   "hash of their outputs' bits (compare two builds)\n");
            return 0;
        } else {
            fprintf(stderr,
                    "usage: bench_conv [--reps N] [--threads N] [--batch N] [--only ROW]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 1 || N < 1) {
        fprintf(stderr, "bench_conv: --reps, --threads and --batch must be >= 1\n");
        return 2;
    }
    mmp_cpu_set_threads(threads);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t) {
        return 1;
    }
    printf("| conv (batch %d, %d thread%s) | fwd us | bwd us | bits |\n|---|--:|--:|---|\n", N,
           threads, threads == 1 ? "" : "s");
    double tot_f = 0, tot_b = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const conv_case *k = &cases[c];
        if (only >= 0 && (size_t)only != c) {
            continue;
        }
        mmp_conv_shape s;
        mmp_conv_shape_set(&s, N, k->C, k->H, k->H, k->OC, k->k, k->k, k->stride, k->k / 2);
        size_t nin = (size_t)N * k->C * k->H * k->H, nout = (size_t)N * k->OC * s.OH * s.OW;
        size_t nw = (size_t)k->OC * k->C * k->k * k->k;
        float *x = malloc(sizeof(float) * nin), *dx = malloc(sizeof(float) * nin);
        float *y = malloc(sizeof(float) * nout), *dy = malloc(sizeof(float) * nout);
        float *w = malloc(sizeof(float) * nw), *dw = malloc(sizeof(float) * nw);
        float *scratch = malloc(sizeof(float) * (mmp_cpu_conv2d_scratch_floats(&s) + 1));
        if (!x || !dx || !y || !dy || !w || !dw || !scratch) {
            void *all[] = {x, dx, y, dy, w, dw, scratch, t};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
                free(all[i]);
            }
            fprintf(stderr, "bench_conv: out of memory for %s\n", k->name);
            return 1;
        }
        uint64_t st = 1 + c;
        fill(x, nin, &st);
        fill(w, nw, &st);
        fill(dy, nout, &st);
        for (int r = 0; r < reps; r++) {
            double t0 = now_us();
            mmp_cpu_conv2d_fwd(y, x, w, NULL, &s, scratch);
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        double tf = t[reps / 2];
        for (int r = 0; r < reps; r++) {
            memset(dx, 0, sizeof(float) * nin);
            memset(dw, 0, sizeof(float) * nw);
            double t0 = now_us();
            mmp_cpu_conv2d_bwd(dx, dw, NULL, dy, x, w, &s, scratch);
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        double tb = t[reps / 2];
        uint64_t h = fnv(fnv(fnv(1469598103934665603ull, y, nout), dx, nin), dw, nw);
        printf("| %s | %.1f | %.1f | %016llx |\n", k->name, tf, tb, (unsigned long long)h);
        tot_f += tf;
        tot_b += tb;
        free(x);
        free(dx);
        free(y);
        free(dy);
        free(w);
        free(dw);
        free(scratch);
    }
    printf("| total | %.1f | %.1f | |\n", tot_f, tot_b);
    free(t);
    return 0;
}
