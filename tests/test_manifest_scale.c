/* A manifest of a million lines costs the index it needs and nothing more.
 *
 * The budget: opening the dataset may grow the process's resident memory by
 * at most BYTES_PER_SAMPLE per line plus SLACK_BYTES (the tokenizer, stdio
 * and allocator overhead, independent of the manifest's length). Both the
 * current resident size (/proc/self/statm) and the peak (getrusage) are
 * checked, so a transient copy of the index during open would fail too.
 * Open time is printed, not asserted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/progress.h"
#include "data/dataset.h"
#include "tests/harness.h"

#define FIXTURES "tests/data/loader"
#define LINES 1000000
#define BYTES_PER_SAMPLE 8            /* one packed offset+length word */
#define SLACK_BYTES (2 * 1024 * 1024) /* independent of LINES */

/* A sanitizer's allocator keeps shadow memory and a quarantine of freed
 * blocks (realloc never shrinks in place there), so memory is measured and
 * printed but not judged under one. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEMORY_JUDGED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MEMORY_JUDGED 0
#endif
#endif
#ifndef MEMORY_JUDGED
#define MEMORY_JUDGED 1
#endif

static long long resident_bytes(void)
{
    long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%lld %lld", &size, &resident) != 2) {
        resident = -1;
    }
    if (f) {
        fclose(f);
    }
    return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

static long long peak_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)ru.ru_maxrss * 1024;
}

static int copy_file(const char *from, const char *to)
{
    char buf[4096];
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) {
        ok = fwrite(buf, 1, n, out) == n;
    }
    if (in) {
        fclose(in);
    }
    if (out) {
        ok &= fclose(out) == 0;
    }
    return ok;
}

/* LINES lines over three real PNGs, written through one buffer. */
static int write_big_manifest(const char *path)
{
    static const char *const images[3] = {"a.png", "b.png", "c.png"};
    static const char *const words[4] = {"red", "blue", "green", "dot"};
    FILE *f = fopen(path, "w");
    if (!f) {
        return 0;
    }
    static char buf[1 << 20];
    size_t used = 0;
    int ok = 1;
    for (int i = 0; i < LINES && ok; i++) {
        used += (size_t)snprintf(buf + used, sizeof buf - used,
                                 "{\"image\": \"%s\", \"text\": \"a %s %s number %d\"}\n",
                                 images[i % 3], words[i % 4], words[(i / 4) % 4], i);
        if (used > sizeof buf - 256) {
            ok = fwrite(buf, 1, used, f) == used;
            used = 0;
        }
    }
    ok &= fwrite(buf, 1, used, f) == used;
    ok &= fclose(f) == 0;
    return ok;
}

typedef struct progress_seen {
    int64_t counted, count_reports, line, line_reports, last_total;
    int bad; /* out of order, done over total, an unknown unit */
} progress_seen;

static void on_progress(void *ctx, const char *unit, int64_t done, int64_t total)
{
    progress_seen *s = ctx;
    if (strcmp(unit, "bytes counted") == 0) {
        s->bad |= s->line_reports > 0 || done < s->counted || done > total;
        s->counted = done;
        s->count_reports++;
    } else if (strcmp(unit, "lines") == 0) {
        s->bad |= done < s->line || done > total;
        s->line = done;
        s->last_total = total;
        s->line_reports++;
    } else {
        s->bad = 1;
    }
}

/* The open's progress (a stage reports it to the coordinator while it
 * starts): bytes while counting, up to the file's size; then lines every
 * MMP_MANIFEST_PROGRESS_LINES, ending at the count. The index is the same. */
static void check_progress(const char *manifest, const mmp_plan *plan)
{
    FILE *f = fopen(manifest, "rb");
    CHECK(f && fseek(f, 0, SEEK_END) == 0);
    long size = f ? ftell(f) : -1;
    if (f) {
        fclose(f);
    }
    progress_seen seen = {0};
    mmp_dataset *d = NULL;
    CHECK_OK(mmp_dataset_open_progress(&d, manifest, NULL, plan, on_progress, &seen));
    CHECK(d && mmp_dataset_size(d) == LINES);
    mmp_dataset_close(d);
    CHECK(!seen.bad);
    CHECK(seen.counted == size && seen.count_reports >= size / (1 << 18));
    CHECK(seen.line == LINES && seen.last_total == LINES);
    CHECK(seen.line_reports == LINES / MMP_MANIFEST_PROGRESS_LINES + 1);
}

/* One million lines: size, index bytes, resident and peak growth, last line. */
static void test_million_lines(void)
{
    const char *dir = mmp_test_tmpdir("manifest_scale");
    char manifest[1200], path[1200], from[1200];
    static const char *const files[] = {"a.png", "b.png", "c.png", "vocab.txt"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(from, sizeof from, "%s/%s", FIXTURES, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(copy_file(from, path));
    }
    snprintf(manifest, sizeof manifest, "%s/big.jsonl", dir);
    double t0 = mmp_now();
    CHECK(write_big_manifest(manifest));
    fprintf(stderr, "  wrote %d lines in %.2f s\n", LINES, mmp_now() - t0);

    mmp_plan plan;
    mmp_plan_defaults(&plan);
    for (int policy = 0; policy < 2; policy++) {
        plan.data.on_bad_sample = policy ? MMP_BAD_SKIP : MMP_BAD_FAIL;
        const long long rss0 = resident_bytes(), peak0 = peak_bytes();
        mmp_dataset *d = NULL;
        t0 = mmp_now();
        CHECK_OK(mmp_dataset_open(&d, manifest, NULL, &plan));
        const double open_s = mmp_now() - t0;
        const long long rss = resident_bytes() - rss0, peak = peak_bytes() - peak0;
        const long long budget = (long long)BYTES_PER_SAMPLE * LINES + SLACK_BYTES;
        if (!d) {
            break;
        }
        const size_t index = mmp_dataset_index_bytes(d);
        fprintf(stderr,
                "  open (%s): %.2f s; index %zu bytes (%.2f per sample); resident +%lld, "
                "peak +%lld bytes; budget %lld\n",
                policy ? "skip" : "fail", open_s, index, (double)index / LINES, rss, peak, budget);
        CHECK(mmp_dataset_size(d) == LINES);
        CHECK(index <= (size_t)BYTES_PER_SAMPLE * LINES + 1024);
        CHECK(rss0 > 0);
        if (MEMORY_JUDGED) {
            CHECK(rss <= budget);
            /* The first open's peak is the one that counts; the second open
             * reuses memory the first gave back, so its peak may not move. */
            CHECK(peak <= budget);
        } else if (policy == 0) {
            fprintf(stderr, "  (sanitizer build: memory printed, not judged)\n");
        }

        /* The index still finds every line: the last one, by number. */
        const int64_t last = LINES - 1;
        float mask[32];
        int32_t ids[32];
        CHECK_OK(mmp_dataset_load(d, &last, 1, NULL, ids, mask));
        mmp_dataset_close(d);
    }
    check_progress(manifest, &plan);
    CHECK(unlink(manifest) == 0);
}

MMP_TEST_LIST("test_manifest_scale", MMP_TEST_CASE(test_million_lines))
