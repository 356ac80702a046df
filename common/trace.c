#include "common/trace.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"

double mmp_trace_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

mmp_err mmp_trace_open(mmp_trace *t, const char *run_dir, const char *file_tag, int pid,
                       const char *name)
{
    t->f = NULL;
    t->pid = pid;
    if (!run_dir) {
        return MMP_OK;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/trace.%s.part", run_dir, file_tag);
    t->f = fopen(path, "w");
    if (!t->f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    fprintf(
        t->f,
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}}\n"
        "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_"
        "index\":%d}}\n",
        pid, name, pid, pid);
    return MMP_OK;
}

void mmp_trace_close(mmp_trace *t)
{
    if (t && t->f) {
        fclose(t->f);
        t->f = NULL;
    }
}

void mmp_trace_span(mmp_trace *t, const char *name, const char *cat, int tid, double ts_us,
                    double dur_us, int step, int mb)
{
    if (!t->f) {
        return;
    }
    fprintf(t->f,
            "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"step\":%d,\"mb\":%d}}\n",
            name, cat, t->pid, tid, ts_us, dur_us, step, mb);
}

void mmp_trace_flow(mmp_trace *t, char phase, uint64_t id, int tid, double ts_us)
{
    if (!t->f) {
        return;
    }
    /* "bp":"e" binds the finish to the enclosing slice at that time. */
    fprintf(t->f,
            "{\"name\":\"mb\",\"cat\":\"flow\",\"ph\":\"%c\",\"id\":%llu,\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f%s}\n",
            phase, (unsigned long long)id, t->pid, tid, ts_us, phase == 'f' ? ",\"bp\":\"e\"" : "");
}

void mmp_trace_instant(mmp_trace *t, const char *name, double ts_us, const char *note)
{
    if (!t->f) {
        return;
    }
    fprintf(t->f,
            "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"g\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,"
            "\"args\":{\"note\":\"%s\"}}\n",
            name, t->pid, ts_us, note ? note : "");
    fflush(t->f); /* rare and telling: kept even if the process is killed next */
}

static int is_part(const char *n)
{
    size_t len = strlen(n);
    return strncmp(n, "trace.", 6) == 0 && len > 11 && strcmp(n + len - 5, ".part") == 0;
}

mmp_err mmp_trace_merge(const char *run_dir)
{
    char out_path[1200];
    snprintf(out_path, sizeof out_path, "%s/trace.json", run_dir);
    DIR *d = opendir(run_dir);
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", run_dir, strerror(errno));
    }
    /* Not durable (no fsync): trace.json is a diagnostic nothing resumes
     * from, merged as a launch ends, and a power cut that loses it loses no
     * training; an fsync of a file of many MB would slow every exit. */
    mmp_atomic_file a;
    mmp_err ret = mmp_atomic_open(&a, out_path, 0);
    if (ret != MMP_OK) {
        closedir(d);
        return ret;
    }
    FILE *out = a.f;
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out);
    int first = 1;
    struct dirent *de;
    char *line = NULL;
    size_t cap = 0;
    /* A resumed run appends its segment: the events of the launches before
     * it (this file's own format: one event per line) come first. */
    FILE *old = fopen(out_path, "r");
    if (old) {
        ssize_t n;
        while ((n = getline(&line, &cap, old)) > 0) {
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ',')) {
                line[--n] = 0;
            }
            if (n >= 2 && line[0] == '{' && line[n - 1] == '}' &&
                strncmp(line, "{\"displayTimeUnit\"", 18) != 0) {
                fprintf(out, "%s%s", first ? "" : ",\n", line);
                first = 0;
            }
        }
        fclose(old);
    }
    while ((de = readdir(d)) != NULL) {
        if (!is_part(de->d_name)) {
            continue;
        }
        char part[1400];
        snprintf(part, sizeof part, "%s/%s", run_dir, de->d_name);
        FILE *f = fopen(part, "r");
        if (!f) {
            continue;
        }
        ssize_t n;
        while ((n = getline(&line, &cap, f)) > 0) {
            /* A writer killed mid-line leaves a partial event: keep only whole ones. */
            if (n < 3 || line[0] != '{' || line[n - 1] != '\n' || line[n - 2] != '}') {
                continue;
            }
            line[n - 1] = 0;
            fprintf(out, "%s%s", first ? "" : ",\n", line);
            first = 0;
        }
        fclose(f);
    }
    free(line);
    fputs("\n]}\n", out);
    /* A cut-short trace.json (a full disk) never replaces the whole one, and
     * the parts go only once the merged file is in place. */
    if ((ret = mmp_atomic_commit(&a)) != MMP_OK) {
        closedir(d);
        return mmp_error_prefix(ret, "trace parts kept, not merged");
    }
    rewinddir(d);
    while ((de = readdir(d)) != NULL) {
        if (is_part(de->d_name)) {
            char part[1400];
            snprintf(part, sizeof part, "%s/%s", run_dir, de->d_name);
            unlink(part);
        }
    }
    closedir(d);
    return MMP_OK;
}
