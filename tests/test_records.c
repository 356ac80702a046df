/* The run directory's records across resumes and restarts: metrics.jsonl
 * continues from a checkpoint's step (later and partial lines dropped,
 * earlier lines kept byte for byte), trace.json keeps every launch segment
 * when parts are merged again, restarts ride on the next kept step line
 * (handed on when a rewind drops that line), and only the newest
 * train.ckpt_keep step directories stay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/json.h"
#include "common/metrics.h"
#include "common/trace.h"
#include "coordinator/restart.h"
#include "tests/harness.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return NULL;
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
        n++;
    }
    return n;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A fresh directory for one case, below this test's tmpdir. */
static void case_dir(const char *name, char *buf, size_t n)
{
    static int made;
    if (!made) { /* made through the harness, so that a passing run removes it too */
        mmp_test_tmpdir("test_records");
        made = 1;
    }
    char sub[256];
    snprintf(sub, sizeof sub, "test_records/%s", name);
    snprintf(buf, n, "%s", mmp_test_tmpdir(sub));
}

typedef struct continue_args {
    const char *dir;
    int keep;
} continue_args;

static void continue_run(void *arg)
{
    continue_args *c = arg;
    FILE *f = NULL;
    CHECK_OK(mmp_metrics_continue(c->dir, c->keep, &f));
    if (f) {
        fclose(f);
    }
}

static void test_metrics(void)
{
    char dir[1100];
    case_dir("metrics", dir, sizeof dir);
    char path[1400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    CHECK(mmp_metrics_line_step("{\"step\":12,\"loss\":1}") == 12);
    CHECK(mmp_metrics_line_step("{\"loss\":1,\"step\":12}") == -1);
    CHECK(mmp_metrics_line_step("garbage") == -1);

    /* A crashed run: steps 1..5 and a line cut short by the kill. */
    write_file(path, "{\"step\":1,\"a\":1}\n{\"step\":2,\"a\":2}\n{\"step\":3,\"a\":3}\n"
                     "{\"step\":4,\"a\":4}\n{\"step\":5,\"a\":5}\n{\"step\":6,\"a\"");
    FILE *f = NULL;
    CHECK_OK(mmp_metrics_continue(dir, 3, &f));
    CHECK(f != NULL);
    if (f) {
        fputs("{\"step\":4,\"a\":40}\n", f);
        fclose(f);
    }
    const char *s = slurp(path);
    CHECK(s && strcmp(s, "{\"step\":1,\"a\":1}\n{\"step\":2,\"a\":2}\n{\"step\":3,\"a\":3}\n"
                         "{\"step\":4,\"a\":40}\n") == 0);

    /* A line that is no step's record (another writer's, a mangled one):
     * left out, but said, naming the first. The crash's cut-off last line
     * above is expected, and said nothing. */
    write_file(path,
               "{\"step\":1,\"a\":1}\nsome note\n{\"step\":2,\"a\":2\n{\"step\":3,\"a\":3}\n");
    continue_args ca = {dir, 3};
    char *said = mmp_test_stderr_of("test_records_said", continue_run, &ca);
    CHECK(said && strstr(said, "metrics.jsonl: 2 lines that are no step's record (line 2 first) "
                               "left out as the run continues from step 3"));
    free(said);
    s = slurp(path);
    CHECK(s && strcmp(s, "{\"step\":1,\"a\":1}\n{\"step\":3,\"a\":3}\n") == 0);
    said = mmp_test_stderr_of("test_records_said", continue_run, &ca);
    CHECK(said && !strstr(said, "left out"));
    free(said);

    /* A new run starts empty; a resume of a run without metrics creates it. */
    CHECK_OK(mmp_metrics_continue(dir, -1, &f));
    if (f) {
        fclose(f);
    }
    s = slurp(path);
    CHECK(s && s[0] == 0);
    remove(path);
    CHECK_OK(mmp_metrics_continue(dir, 7, &f));
    if (f) {
        fclose(f);
    }
    CHECK(slurp(path) != NULL);

    char esc[64];
    CHECK(strcmp(mmp_json_escape("a\"b\\c\n", esc, sizeof esc), "a\\\"b\\\\c\\u000a") == 0);
}

static void test_trace(void)
{
    char dir[1100];
    case_dir("trace", dir, sizeof dir);
    char path[1400];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    for (int seg = 0; seg < 2; seg++) {
        mmp_trace t;
        char tag[32];
        snprintf(tag, sizeof tag, "stage.p%d", 100 + seg);
        CHECK_OK(mmp_trace_open(&t, dir, tag, 1, "image.0/0"));
        mmp_trace_span(&t, "F", "compute", 0, 1000.0 * (seg + 1), 5, seg ? 11 : 1, 0);
        mmp_trace_instant(&t, "launch", 10, seg ? "launch 1 from step 10" : "launch 1 from step 0");
        mmp_trace_close(&t);
        CHECK_OK(mmp_trace_merge(dir));
    }
    const char *s = slurp(path);
    CHECK(s != NULL);
    if (!s) {
        return;
    }
    CHECK(count(s, "\"traceEvents\"") == 1);
    CHECK(count(s, "\"args\":{\"step\":1,") == 1);
    CHECK(count(s, "\"args\":{\"step\":11,") == 1);
    CHECK(count(s, "launch 1 from step 0") == 1);
    CHECK(count(s, "launch 1 from step 10") == 1);
    /* one event per line, comma-separated, closed once */
    CHECK(strncmp(s, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", 39) == 0);
    CHECK(count(s, "]}") == 1 && strcmp(s + strlen(s) - 3, "]}\n") == 0);
    CHECK(count(s, "},\n{") == count(s, "\n{") - 1);
}

/* A merge that cannot write trace.json (a full disk: its temporary file is
 * /dev/full here) fails, and leaves trace.json and the parts as they were
 * for a later merge; none of the parts' events is lost. */
static void test_trace_full_disk(void)
{
    struct stat sb;
    if (stat("/dev/full", &sb) != 0) {
        printf("skip: no /dev/full\n");
        return;
    }
    char dir[1100], path[1400], tmp[1400], part[1400];
    case_dir("trace_full", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(tmp, sizeof tmp, "%s/trace.json.tmp", dir);
    snprintf(part, sizeof part, "%s/trace.stage.p7.part", dir);
    write_file(path, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
                     "{\"name\":\"old\",\"ph\":\"i\",\"pid\":0,\"tid\":0,\"ts\":1}\n]}\n");
    static char before[1 << 16];
    snprintf(before, sizeof before, "%s", slurp(path));
    mmp_trace t;
    CHECK_OK(mmp_trace_open(&t, dir, "stage.p7", 1, "image.0/0"));
    for (int i = 0; i < 300; i++) { /* several stdio buffers, under slurp's 64 KiB */
        mmp_trace_span(&t, "F", "compute", 0, 1000.0 + i, 5, i, 0);
    }
    mmp_trace_close(&t);
    CHECK(symlink("/dev/full", tmp) == 0);
    CHECK(mmp_trace_merge(dir) == MMP_ERR_IO);
    CHECK(strstr(mmp_last_error(), "trace.json.tmp") != NULL);
    const char *s = slurp(path);
    CHECK(s && strcmp(s, before) == 0);
    CHECK(stat(part, &sb) == 0 && sb.st_size > 30000);
    CHECK(lstat(tmp, &sb) != 0);
    /* the disk has room again: the next merge takes every event */
    CHECK_OK(mmp_trace_merge(dir));
    s = slurp(path);
    CHECK(s && count(s, "\"name\":\"old\"") == 1 && count(s, "\"args\":{\"step\":299,") == 1);
    CHECK(stat(part, &sb) != 0);
}

static void test_restarts(void)
{
    char dir[1100];
    case_dir("restarts", dir, sizeof dir);
    char ck[1200], resume_dir[1200];
    mmp_ckpt_step_dir(ck, sizeof ck, dir, 6);
    CHECK_OK(mmp_mkdirs(ck));
    static mmp_plan plan;
    mmp_plan_defaults(&plan);
    CHECK_OK(mmp_ckpt_write_meta(ck, 6, &plan));
    CHECK_OK(mmp_ckpt_mark_latest(dir, 6));

    static mmp_restarts r;
    memset(&r, 0, sizeof r);
    FILE *f = NULL;
    CHECK_OK(mmp_metrics_continue(dir, -1, &f));
    for (int step = 1; step <= 7 && f; step++) {
        fprintf(f, "{\"step\":%d}\n", step);
    }
    int from = -1;
    CHECK_OK(mmp_restart_rewind(&r, dir, 7, "stage text.0/0 died: \"killed\"", &from, resume_dir,
                                sizeof resume_dir, &f));
    CHECK(from == 6 && strcmp(resume_dir, ck) == 0 && r.n == 1);
    /* step 7 is trained again and carries the restart */
    fputs("{\"step\":7", f);
    mmp_restart_write_field(&r, f, 7);
    fputs("}\n", f);
    fputs("{\"step\":8", f);
    mmp_restart_write_field(&r, f, 8); /* nothing: already carried */
    fputs("}\n", f);
    /* a second fault before a new checkpoint drops line 7: both ride on it again */
    CHECK_OK(mmp_restart_rewind(&r, dir, 8, "watchdog: stage fusion/0 stalled", &from, resume_dir,
                                sizeof resume_dir, &f));
    fputs("{\"step\":7", f);
    mmp_restart_write_field(&r, f, 7);
    fputs("}\n", f);
    fclose(f);
    char path[1400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    const char *s = slurp(path);
    CHECK(s && count(s, "{\"step\":7") == 1 && count(s, "{\"step\":8") == 0);
    CHECK(s && strstr(s, "{\"step\":7,\"restarts\":[{\"n\":1,\"after_step\":7,\"from_step\":6,"
                         "\"cause\":\"stage text.0/0 died: \\\"killed\\\"\"},{\"n\":2,") != NULL);

    /* restarts no later line carries (one during the final evaluation) join
     * the last line: as its field, or into the field it has; the lines
     * before stay, and it still parses */
    CHECK_OK(mmp_metrics_continue(dir, 7, &f));
    CHECK_OK(mmp_metrics_add_restarts(f, "[{\"n\":3,\"after_step\":7,\"from_step\":7}]"));
    CHECK_OK(mmp_metrics_add_restarts(f, "[{\"n\":4,\"after_step\":7,\"from_step\":7}]"));
    CHECK(mmp_metrics_add_restarts(f, "{\"n\":5}") == MMP_ERR_INVALID); /* not an array */
    fclose(f);
    s = slurp(path);
    CHECK(s && count(s, "\n") == 7 && count(s, "\"restarts\"") == 1);
    CHECK(s && strstr(s, ",{\"n\":3,\"after_step\":7,\"from_step\":7},{\"n\":4,\"after_step\":7,"
                         "\"from_step\":7}]}\n") != NULL);
    CHECK_OK(mmp_metrics_continue(dir, 6, &f)); /* line 7 dropped: 6 has no restarts */
    CHECK_OK(mmp_metrics_add_restarts(f, "[{\"n\":9}]"));
    off_t at = 0;
    CHECK_OK(mmp_metrics_eval_pending(f, 6, &at)); /* (parses the last line) */
    CHECK(at > 0);
    fclose(f);
    s = slurp(path);
    CHECK(s && count(s, "\n") == 6 && strstr(s, "{\"step\":6,\"restarts\":[{\"n\":9}]}\n") != NULL);

    /* no checkpoint yet: from the start */
    char fresh[1400];
    snprintf(fresh, sizeof fresh, "%s/fresh", dir);
    CHECK_OK(mmp_mkdirs(fresh));
    memset(&r, 0, sizeof r);
    f = NULL;
    CHECK_OK(mmp_restart_rewind(&r, fresh, 3, "x", &from, resume_dir, sizeof resume_dir, &f));
    CHECK(from == 0 && resume_dir[0] == 0);
    if (f) {
        fclose(f);
    }
}

static void test_prune(void)
{
    char dir[1100];
    case_dir("prune", dir, sizeof dir);
    int steps[] = {5, 10, 15, 20, 25};
    char d[1200], f[1400];
    for (int i = 0; i < 5; i++) {
        mmp_ckpt_step_dir(d, sizeof d, dir, steps[i]);
        CHECK_OK(mmp_mkdirs(d));
        snprintf(f, sizeof f, "%s/image.ckpt", d);
        write_file(f, "x");
    }
    /* latest is 20; 25 is a write cut short: left alone */
    CHECK_OK(mmp_ckpt_prune(dir, 20, 2));
    for (int i = 0; i < 5; i++) {
        mmp_ckpt_step_dir(d, sizeof d, dir, steps[i]);
        struct stat sb;
        int kept = stat(d, &sb) == 0;
        CHECK(kept == (steps[i] >= 15));
    }
    CHECK_OK(mmp_ckpt_prune(dir, 20, 0)); /* keep all */
    mmp_ckpt_step_dir(d, sizeof d, dir, 15);
    struct stat sb;
    CHECK(stat(d, &sb) == 0);
    /* no step directory at all (steps stays NULL: UBSan's nonnull-attribute
     * caught qsort(NULL, 0, ...) here in the sanitizer build) */
    char empty[1100];
    case_dir("prune_empty", empty, sizeof empty);
    snprintf(d, sizeof d, "%s/ckpt", empty);
    CHECK_OK(mmp_mkdirs(d));
    CHECK_OK(mmp_ckpt_prune(empty, 20, 2));
}

MMP_TEST_LIST("test_records", MMP_TEST_CASE(test_metrics), MMP_TEST_CASE(test_trace),
              MMP_TEST_CASE(test_trace_full_disk), MMP_TEST_CASE(test_restarts),
              MMP_TEST_CASE(test_prune))
