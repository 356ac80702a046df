/* metrics.jsonl: opening it for a new, resumed or restarted run. Must never
 * reorder or edit the lines it keeps. */
#include "common/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *mmp_json_escape(const char *s, char *buf, size_t n)
{
    size_t k = 0;
    for (; *s && k + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            buf[k++] = '\\';
            buf[k++] = (char)ch;
        } else if (ch < 0x20) {
            k += (size_t)snprintf(buf + k, n - k, "\\u%04x", ch);
        } else {
            buf[k++] = (char)ch;
        }
    }
    buf[k] = 0;
    return buf;
}

long mmp_metrics_line_step(const char *line)
{
    static const char key[] = "{\"step\":";
    if (strncmp(line, key, sizeof key - 1) != 0) {
        return -1;
    }
    char *end;
    long step = strtol(line + sizeof key - 1, &end, 10);
    return end == line + sizeof key - 1 || step < 0 ? -1 : step;
}

mmp_err mmp_metrics_open(const char *run_dir, int keep_steps, FILE **out)
{
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    snprintf(tmp, sizeof tmp, "%s/metrics.jsonl.tmp", run_dir);
    *out = NULL;
    FILE *in = keep_steps >= 0 ? fopen(path, "r") : NULL;
    if (!in) {
        if (keep_steps >= 0 && errno != ENOENT) {
            return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        }
        *out = fopen(path, "w");
        return *out ? MMP_OK : mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    mmp_err ret = MMP_OK;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto exit;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        long step = mmp_metrics_line_step(line);
        int whole = n >= 2 && line[n - 1] == '\n' && line[n - 2] == '}';
        if (whole && step >= 0 && step <= keep_steps) {
            fwrite(line, 1, (size_t)n, f);
        }
    }
    free(line);
    if (ferror(in) || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    if (fclose(f) != 0 && ret == MMP_OK) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    if (ret == MMP_OK && rename(tmp, path) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "rename %s: %s", tmp, strerror(errno));
    }
    if (ret != MMP_OK) {
        unlink(tmp);
        goto exit;
    }
    *out = fopen(path, "a");
    if (!*out) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
exit:
    fclose(in);
    return ret;
}
