/* Benchmark of the prefetching loader; prints a Markdown table, judges nothing.
 *
 * Writes --files JPEGs (default 512, --side x --side pixels, default 224,
 * libjpeg quality 90, a smooth pattern plus noise so they compress like
 * photos) with captions and a vocab to --dir, then for each worker count in
 * --workers (default 0,1,2) runs a loader over --steps steps (default 96) of
 * batch 32 (one micro-batch), images at 224 and text at 32 tokens, with a
 * consumer that only gets and releases: samples/s is what the loader alone
 * can feed. Columns:
 *   samples/s      batch * steps / wall time from create to the last release
 *   load ms/sample sum of the micro-batches' load_ms / samples (thread time)
 *   decode share   time mmp_image_read takes per file (decode to RGB8 only,
 *                  measured alone, single-threaded, page cache warm) / load
 *                  ms/sample: the rest is resize/crop, normalise, manifest
 *                  read and tokenising.
 * --png writes PNGs instead (to compare the decoders). With workers > cores
 * the threads share cores, which the table shows rather than hides. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>

#include "common/progress.h"
#include "common/rng.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/png.h"

#define BATCH 32
#define IMAGE_SIZE 224
#define TEXT_LEN 32
#define MAX_WORKER_COUNTS 8

static int write_jpeg(const char *path, const uint8_t *rgb, int w, int h, int quality)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        return 0;
    }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * (size_t)w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(f) == 0;
}

/* A picture-like image: two gradients, a disc and mild noise. */
static void make_picture(uint8_t *rgb, int side, int k, mmp_rng *r)
{
    const int cx = (int)mmp_rng_below(r, (uint64_t)side),
              cy = (int)mmp_rng_below(r, (uint64_t)side);
    const int rad = side / 6 + (int)mmp_rng_below(r, (uint64_t)side / 4 + 1);
    for (int y = 0; y < side; y++) {
        for (int x = 0; x < side; x++) {
            const int in = (x - cx) * (x - cx) + (y - cy) * (y - cy) < rad * rad;
            for (int c = 0; c < 3; c++) {
                int v = (x * (c + 1) + y * (3 - c) + k * 29) % 256;
                v = in ? 255 - v / 2 : v;
                v += (int)mmp_rng_below(r, 17) - 8;
                rgb[((size_t)y * side + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

static int write_set(const char *dir, int files, int side, int png)
{
    static const char *const words[] = {"a", "red", "blue", "green", "circle", "on", "dark", "."};
    char path[1200];
    uint8_t *rgb = malloc((size_t)side * side * 3);
    mmp_rng r;
    mmp_rng_seed(&r, 1, 0);
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    FILE *m = fopen(path, "w");
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *v = fopen(path, "w");
    int ok = rgb && m && v;
    if (v) {
        fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", v);
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
            fprintf(v, "%s\n", words[i]);
        }
    }
    for (int k = 0; ok && k < files; k++) {
        make_picture(rgb, side, k, &r);
        snprintf(path, sizeof path, "%s/%06d.%s", dir, k, png ? "png" : "jpg");
        ok = png ? mmp_png_write(path, rgb, side, side) == MMP_OK
                 : write_jpeg(path, rgb, side, side, 90);
        fprintf(m, "{\"image\": \"%06d.%s\", \"text\": \"%s %s %s %s dot number %d\"}\n", k,
                png ? "png" : "jpg", words[k % 8], words[(k / 8) % 8], words[(k / 3) % 8],
                words[(k / 5) % 8], k);
    }
    free(rgb);
    ok &= m && fclose(m) == 0;
    ok &= v && fclose(v) == 0;
    return ok;
}

/* Milliseconds mmp_image_read takes per file, single-threaded. */
static double decode_ms_per_file(const char *dir, int files, int png)
{
    char path[1200];
    double best = 1e30;
    for (int rep = 0; rep < 2; rep++) { /* the first pass warms the page cache */
        const double t0 = mmp_now();
        for (int k = 0; k < files; k++) {
            mmp_image img;
            snprintf(path, sizeof path, "%s/%06d.%s", dir, k, png ? "png" : "jpg");
            if (mmp_image_read(path, 0, &img) != MMP_OK) {
                fprintf(stderr, "bench_loader: %s\n", mmp_last_error());
                return -1;
            }
            mmp_image_fini(&img);
        }
        const double ms = (mmp_now() - t0) * 1e3 / files;
        best = ms < best ? ms : best;
    }
    return best;
}

typedef struct result {
    double samples_per_s, load_ms_per_sample;
} result;

static int run(mmp_dataset *d, const mmp_plan *plan, int steps, result *out)
{
    mmp_loader_cfg cfg = {.ds = d,
                          .plan = plan,
                          .images = 1,
                          .text = 1,
                          .first_step = 0,
                          .last_step = steps,
                          .depth = 2 * (plan->data.workers > 0 ? plan->data.workers : 1)};
    mmp_loader *l = NULL;
    const double t0 = mmp_now();
    if (mmp_loader_create(&l, &cfg) != MMP_OK) {
        fprintf(stderr, "bench_loader: %s\n", mmp_last_error());
        return 0;
    }
    double load_ms = 0;
    int64_t samples = 0;
    for (int step = 0; step < steps; step++) {
        mmp_batch *b = NULL;
        if (mmp_loader_get(l, step, 0, &b) != MMP_OK) {
            fprintf(stderr, "bench_loader: %s\n", mmp_last_error());
            mmp_loader_destroy(l);
            return 0;
        }
        load_ms += b->load_ms;
        samples += b->n;
        mmp_loader_release(l, b);
    }
    const double wall = mmp_now() - t0;
    mmp_loader_destroy(l);
    out->samples_per_s = (double)samples / wall;
    out->load_ms_per_sample = load_ms / (double)samples;
    return 1;
}

int main(int argc, char **argv)
{
    int files = 512, side = 224, steps = 96, png = 0, n_workers = 3;
    int workers[MAX_WORKER_COUNTS] = {0, 1, 2};
    const char *dir = "/tmp/mmpipe-bench-loader";
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (strcmp(argv[i], "--files") == 0 && more) {
            files = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--side") == 0 && more) {
            side = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--steps") == 0 && more) {
            steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--dir") == 0 && more) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--png") == 0) {
            png = 1;
        } else if (strcmp(argv[i], "--workers") == 0 && more) {
            n_workers = 0;
            for (char *s = argv[++i], *end; *s && n_workers < MAX_WORKER_COUNTS;
                 s = *end ? end + 1 : end) {
                workers[n_workers++] = (int)strtol(s, &end, 10);
            }
        } else {
            fprintf(stderr,
                    "usage: bench_loader [--files N] [--side N] [--steps N] [--workers 0,1,2] "
                    "[--png] [--dir DIR]\n");
            return 2;
        }
    }
    if (files < 1 || side < 16 || side > 4096 || steps < 1) {
        fprintf(stderr, "bench_loader: need --files >= 1, --side in [16, 4096], --steps >= 1\n");
        return 2;
    }
    mkdir(dir, 0755);
    double t0 = mmp_now();
    if (!write_set(dir, files, side, png)) {
        fprintf(stderr, "bench_loader: cannot write the set to %s\n", dir);
        return 1;
    }
    fprintf(stderr, "bench_loader: wrote %d %dx%d %s in %.1f s to %s\n", files, side, side,
            png ? "PNGs" : "JPEGs", mmp_now() - t0, dir);
    const double decode_ms = decode_ms_per_file(dir, files, png);
    if (decode_ms < 0) {
        return 1;
    }

    char manifest[1200];
    snprintf(manifest, sizeof manifest, "%s/train.jsonl", dir);
    mmp_plan plan;
    mmp_plan_defaults(&plan);
    plan.data.image_size = IMAGE_SIZE;
    plan.data.max_text_len = TEXT_LEN;
    plan.train.batch = BATCH;
    plan.train.microbatches = 1;
    mmp_dataset *d = NULL;
    if (mmp_dataset_open(&d, manifest, NULL, &plan) != MMP_OK) {
        fprintf(stderr, "bench_loader: %s\n", mmp_last_error());
        return 1;
    }
    printf("## loader: %d %dx%d %s -> %dx%d, batch %d, %d steps, %ld cores online\n\n", files, side,
           side, png ? "PNG" : "JPEG", IMAGE_SIZE, IMAGE_SIZE, BATCH, steps,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("| workers | samples/s | load ms/sample | decode ms/file | decode share |\n");
    printf("|--------:|----------:|---------------:|---------------:|-------------:|\n");
    /* Untimed: the first loader's buffers fault in fresh pages, later ones
     * get them back from the allocator; measure every row warm. */
    result warm;
    plan.data.workers = 0;
    if (!run(d, &plan, 4, &warm)) {
        mmp_dataset_close(d);
        return 1;
    }
    int rc = 0;
    for (int w = 0; w < n_workers; w++) {
        plan.data.workers = workers[w];
        result r;
        if (!run(d, &plan, steps, &r)) {
            rc = 1;
            break;
        }
        printf("| %7d | %9.0f | %14.3f | %14.3f | %11.0f%% |\n", workers[w], r.samples_per_s,
               r.load_ms_per_sample, decode_ms, 100.0 * decode_ms / r.load_ms_per_sample);
        fflush(stdout);
    }
    mmp_dataset_close(d);
    return rc;
}
