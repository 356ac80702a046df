/* Checkpoint fingerprints: which plan keys bind a checkpoint, written and
 * checked as key=value text. Never writes during a check. */
#include "common/fingerprint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

/* Exact keys, or prefixes ending in '.' (a section: keys added to it later
 * are bound too). See the header for why each is in and others are not. */
static const char *const BOUND[] = {
    "model.",    "data.manifest", "data.vocab",   "data.image_size", "data.max_text_len",
    "data.mean", "data.std",      "data.augment", "job.seed",        "train.batch",
};

int mmp_fingerprint_has(const char *key)
{
    for (size_t i = 0; i < sizeof BOUND / sizeof BOUND[0]; i++) {
        size_t n = strlen(BOUND[i]);
        if (BOUND[i][n - 1] == '.' ? strncmp(key, BOUND[i], n) == 0 : strcmp(key, BOUND[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

mmp_err mmp_fingerprint_text(const mmp_plan *p, char *buf, size_t n)
{
    size_t len = 0;
    char value[MMP_PATH_MAX + 64];
    buf[0] = 0;
    for (int i = 0; i < mmp_plan_key_count(); i++) {
        const char *key = mmp_plan_key_name(i);
        if (!mmp_fingerprint_has(key)) {
            continue;
        }
        MMP_TRY(mmp_plan_key_text(p, i, value, sizeof value));
        int w = snprintf(buf + len, n - len, "%s=%s\n", key, value);
        if (w < 0 || (size_t)w >= n - len) {
            return mmp_errorf(MMP_ERR_INVALID, "checkpoint fingerprint longer than %zu bytes", n);
        }
        len += (size_t)w;
    }
    return MMP_OK;
}

mmp_err mmp_fingerprint_write(const char *step_dir, const mmp_plan *p)
{
    char text[16384], path[1200];
    MMP_TRY(mmp_fingerprint_text(p, text, sizeof text));
    snprintf(path, sizeof path, "%s/%s", step_dir, MMP_FINGERPRINT_FILE);
    mmp_atomic_file a;
    MMP_TRY(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE)); /* part of the checkpoint */
    fputs(text, a.f);
    return mmp_atomic_commit(&a);
}

/* The value of key in "key=value\n" text, into out; 0 when absent. */
static int lookup(const char *text, const char *key, char *out, size_t n)
{
    size_t kl = strlen(key);
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t ll = end ? (size_t)(end - line) : strlen(line);
        if (ll > kl && strncmp(line, key, kl) == 0 && line[kl] == '=') {
            snprintf(out, n, "%.*s", (int)(ll - kl - 1), line + kl + 1);
            return 1;
        }
        line += ll + (end ? 1 : 0);
    }
    return 0;
}

mmp_err mmp_fingerprint_check(const char *step_dir, const mmp_plan *p, int *checked)
{
    char path[1200];
    *checked = 0;
    snprintf(path, sizeof path, "%s/%s", step_dir, MMP_FINGERPRINT_FILE);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) {
            return MMP_OK;
        }
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    static char stored[16384];
    size_t len = fread(stored, 1, sizeof stored - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        return mmp_errorf(MMP_ERR_IO, "%s: read failed", path);
    }
    stored[len] = 0;
    char value[MMP_PATH_MAX + 64], old[MMP_PATH_MAX + 64];
    int found = 0;
    for (int i = 0; i < mmp_plan_key_count(); i++) {
        const char *key = mmp_plan_key_name(i);
        if (!mmp_fingerprint_has(key) || !lookup(stored, key, old, sizeof old)) {
            continue; /* a key newer than the checkpoint is not checked */
        }
        found++;
        MMP_TRY(mmp_plan_key_text(p, i, value, sizeof value));
        if (strcmp(old, value) != 0) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "%s: the checkpoint in %s was trained with %s=%s; this plan has "
                              "%s=%s (a resume cannot change the model or the data order: set it "
                              "back, or start a new run)",
                              key, step_dir, key, old, key, value);
        }
    }
    if (found == 0) {
        /* every checkpoint's fingerprint holds model and data keys: none
         * at all is a damaged file, which must not pass as "checked" */
        return mmp_errorf(MMP_ERR_DATA,
                          "%s: holds none of the fingerprinted plan keys (damaged?): the "
                          "checkpoint's plan cannot be checked; remove the file to resume "
                          "without the check",
                          path);
    }
    *checked = 1;
    return MMP_OK;
}
