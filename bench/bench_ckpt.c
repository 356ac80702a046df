/* Benchmark of checkpoint files (common/ckpt.h); prints a Markdown table,
 * judges nothing.
 *
 * Writes a checkpoint of --mb MiB (default 1024) of float tensors of --tensor-mb
 * MiB each (default 64) to --dir (default /tmp) and reads it back, --reps
 * times (default 3), and beside each the plain file operation on the same
 * bytes in the same run: a write of one buffer with fwrite and the same
 * fsync, a read of the file with read(2) into one buffer. The read is from
 * the page cache (the file was just written): it measures the reader's own
 * cost, not the disk. Also the two checksums alone over the same bytes in
 * memory: byte-wise FNV-1a (format version 1) and XXH64 (version 2).
 * Medians; the ratio column is the plain operation's time over mmpipe's
 * (1.0: mmpipe costs nothing beyond the I/O). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/rng.h"
#include "common/xxh64.h"

#define MAX_REPS 15

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_ckpt [--mb N] [--tensor-mb N] [--reps N] [--dir DIR]\n");
    return 2;
}

int main(int argc, char **argv)
{
    long mb = 1024, tensor_mb = 64;
    int reps = 3;
    const char *dir = "/tmp";
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--mb") == 0) {
            mb = atol(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--tensor-mb") == 0) {
            tensor_mb = atol(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--dir") == 0) {
            dir = argv[++i];
        } else {
            return usage();
        }
    }
    if (mb < 1 || tensor_mb < 1 || tensor_mb > mb || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_ckpt: --mb >= --tensor-mb >= 1, --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    const int n_tensors = (int)(mb / tensor_mb);
    const int64_t numel = tensor_mb << 18; /* floats in tensor_mb MiB */
    const size_t bytes = (size_t)n_tensors * (size_t)numel * sizeof(float);
    float *data = malloc(bytes);
    if (!data) {
        fprintf(stderr, "bench_ckpt: %zu bytes: out of memory\n", bytes);
        return 1;
    }
    mmp_rng r;
    mmp_rng_seed(&r, 1, 0);
    for (size_t i = 0; i < bytes / sizeof(float); i++) {
        data[i] = mmp_rng_uniform(&r);
    }
    char sub[1024], path[1100], raw[1100];
    snprintf(sub, sizeof sub, "%s/bench_ckpt.%d", dir, (int)getpid());
    if (mmp_mkdirs(sub) != MMP_OK) {
        fprintf(stderr, "bench_ckpt: %s\n", mmp_last_error());
        free(data);
        return 1;
    }
    snprintf(path, sizeof path, "%s/x.ckpt", sub);
    snprintf(raw, sizeof raw, "%s/raw.bin", sub);
    double t_w[MAX_REPS] = {0}, t_r[MAX_REPS] = {0}, t_rw[MAX_REPS] = {0}, t_rr[MAX_REPS] = {0},
           t_fnv[MAX_REPS] = {0}, t_xxh[MAX_REPS] = {0};
    int failed = 0;
    volatile uint64_t sink = 0;
    for (int k = 0; k < reps && !failed; k++) {
        double t0 = now();
        mmp_ckpt_writer w;
        failed |= mmp_ckpt_writer_open(&w, path) != MMP_OK;
        for (int i = 0; i < n_tensors && !failed; i++) {
            char name[32];
            snprintf(name, sizeof name, "t%d", i);
            failed |=
                mmp_ckpt_write(&w, name, MMP_F32, 1, &numel, data + (size_t)i * numel) != MMP_OK;
        }
        failed |= failed ? 1 : mmp_ckpt_writer_close(&w) != MMP_OK;
        t_w[k] = now() - t0;

        t0 = now();
        FILE *f = fopen(raw, "wb");
        failed |=
            !f || fwrite(data, 1, bytes, f) != bytes || fflush(f) != 0 || fsync(fileno(f)) != 0;
        if (f) {
            fclose(f);
        }
        t_rw[k] = now() - t0;

        t0 = now();
        mmp_ckpt c;
        failed |= mmp_ckpt_read_dir(&c, sub) != MMP_OK || c.count != n_tensors;
        mmp_ckpt_fini(&c);
        t_r[k] = now() - t0;

        t0 = now();
        int fd = open(raw, O_RDONLY);
        char *back = malloc(bytes);
        size_t got = 0;
        while (fd >= 0 && back && got < bytes) {
            ssize_t n = read(fd, back + got, bytes - got);
            if (n <= 0) {
                break;
            }
            got += (size_t)n;
        }
        failed |= got != bytes;
        if (fd >= 0) {
            close(fd);
        }
        free(back);
        t_rr[k] = now() - t0;

        t0 = now();
        sink += mmp_fnv1a(MMP_FNV1A_INIT, data, bytes);
        t_fnv[k] = now() - t0;
        t0 = now();
        sink += mmp_xxh64(data, bytes);
        t_xxh[k] = now() - t0;
        unlink(raw);
    }
    unlink(path);
    rmdir(sub);
    free(data);
    if (failed) {
        fprintf(stderr, "bench_ckpt: a write or read failed: %s\n", mmp_last_error());
        return 1;
    }
    double gib = (double)bytes / (1 << 30);
    double w = median(t_w, reps), rw = median(t_rw, reps), rd = median(t_r, reps),
           rr = median(t_rr, reps), fnv = median(t_fnv, reps), xxh = median(t_xxh, reps);
    printf("checkpoint of %.2f GiB (%d tensors of %ld MiB) in %s, median of %d\n\n", gib, n_tensors,
           tensor_mb, dir, reps);
    printf("| operation | mmpipe s | GiB/s | plain s | plain / mmpipe |\n");
    printf("|---|---|---|---|---|\n");
    printf("| write (fsync'd) | %.3f | %.2f | %.3f | %.2f |\n", w, gib / w, rw, rw / w);
    printf("| read (page cache) | %.3f | %.2f | %.3f | %.2f |\n", rd, gib / rd, rr, rr / rd);
    printf("| checksum: FNV-1a (v1) vs XXH64 (v2) | %.3f | %.2f | %.3f | %.2f |\n", xxh, gib / xxh,
           fnv, fnv / xxh);
    return sink == 42 ? 3 : 0;
}
