/* A checkpoint step directory's own text files: the input is its files.txt
 * (common/ckpt.c: each *.ckpt, its bytes and checksum, checked against the files the
 * directory holds) when its first byte is odd ('#', 'i'), else its fingerprint.txt
 * (common/fingerprint.c: key=value lines, compared with a plan's). The
 * directory holds two small .ckpt files and the plan is a minimal one, made
 * once; the first byte itself is part of the file. */
#include <sys/stat.h>

#include "common/ckpt.h"
#include "common/config.h"
#include "common/fingerprint.h"
#include "tests/fuzz/fuzz.h"

static char dir[600];
static mmp_plan plan;
static int ready;

static int write_all(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        return 0;
    }
    int ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

static void cleanup(void)
{
    static const char *const names[] = {"image.ckpt", "train.ckpt", "plan.yaml", MMP_CKPT_FILE_LIST,
                                        MMP_FINGERPRINT_FILE};
    char path[700];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static int setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fuzz_stepdir.%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    if (mkdir(dir, 0700) != 0) {
        return 0;
    }
    atexit(cleanup);
    char path[700];
    static const uint8_t ten[10], twenty[20];
    snprintf(path, sizeof path, "%s/image.ckpt", dir);
    int ok = write_all(path, ten, sizeof ten);
    snprintf(path, sizeof path, "%s/train.ckpt", dir);
    ok = ok && write_all(path, twenty, sizeof twenty);
    snprintf(path, sizeof path, "%s/plan.yaml", dir);
    static const char yaml[] = "data: { manifest: t.jsonl }\n";
    ok = ok && write_all(path, (const uint8_t *)yaml, sizeof yaml - 1);
    return ok && mmp_plan_load(&plan, path, NULL, 0) == MMP_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (!ready) {
        ready = setup() ? 1 : -1;
    }
    if (ready < 0 || size == 0) {
        return 0;
    }
    char path[700];
    int files = (data[0] & 1) == 1;
    snprintf(path, sizeof path, "%s/%s", dir, files ? MMP_CKPT_FILE_LIST : MMP_FINGERPRINT_FILE);
    if (!write_all(path, data, size)) {
        return 0;
    }
    int seen = 0;
    mmp_err e = files ? mmp_ckpt_check_files(dir, &seen) : mmp_fingerprint_check(dir, &plan, &seen);
    if (e == MMP_OK && !seen) {
        __builtin_trap(); /* the file is there: it must have been read */
    }
    unlink(path);
    return 0;
}
