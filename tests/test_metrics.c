/* common/metrics (the metrics.jsonl schema) and common/stats: a line in the
 * coordinator's exact format is read field by field; the writer's line reads
 * back the same and is byte-identical to what the coordinator writes; a
 * single-process line leaves the pipeline-only fields absent; malformed
 * lines are errors naming path:line; medians. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/stats.h"
#include "tests/harness.h"

/* One line as coordinator/run.c writes it (two processes, balance, eval). */
static const char PIPE_LINE[] =
    "{\"step\":7,\"loss\":4.15888,\"itc_loss\":3.46574,\"itm_loss\":0.693147,\"lr\":0.0001,"
    "\"grad_norm\":1.25,\"samples_per_s\":312.5,\"step_ms\":204.8,\"data_ms\":1.5,"
    "\"skipped_samples\":2,\"bubble\":0.4521,\"loss_scale\":32768,\"step_skipped\":1,"
    "\"stages\":["
    "{\"name\":\"image.0\",\"replica\":0,\"microbatches\":4,\"busy_ms\":150.2,\"idle_ms\":54.6,"
    "\"wall_ms\":204.8,\"data_wait_ms\":0.1,\"fwd_ms\":12.5,\"bwd_ms\":25.1,\"load_ms\":0.375,"
    "\"max_inflight\":3,\"peak_mem_bytes\":71000000,\"state_bytes\":1200000,\"act_slots\":3},"
    "{\"name\":\"fusion\",\"replica\":1,\"microbatches\":2,\"busy_ms\":30,\"idle_ms\":174.8,"
    "\"wall_ms\":204.8,\"data_wait_ms\":0,\"fwd_ms\":3,\"bwd_ms\":6,\"load_ms\":0,"
    "\"max_inflight\":1,\"peak_mem_bytes\":18400000}],"
    "\"balance\":{\"efficiency\":0.4400,\"placement\":\"image.0[0:3):1 image.1[3:6):1 text.0:1 "
    "fusion:2\",\"decision\":{\"action\":\"route\",\"reason\":\"x\"}},"
    "\"val_i2t_r1\":0.6560,\"val_t2i_r1\":0.6600}\n";

static void test_read_pipeline_line(void)
{
    mmp_metrics_step m;
    CHECK_OK(mmp_metrics_parse(PIPE_LINE, strlen(PIPE_LINE), &m));
    CHECK(m.step == 7 && m.skipped_samples == 2);
    CHECK(m.step_ms == 204.8 && m.samples_per_s == 312.5 && m.bubble == 0.4521);
    CHECK(m.loss_scale == 32768 && m.step_skipped == 1);
    CHECK(m.has_stages && m.n_stages == 2);
    CHECK(strcmp(m.stages[0].name, "image.0") == 0 && m.stages[0].replica == 0);
    CHECK(m.stages[0].fwd_ms == 12.5 && m.stages[0].bwd_ms == 25.1 && m.stages[0].load_ms == 0.375);
    CHECK(m.stages[0].microbatches == 4 && m.stages[0].max_inflight == 3);
    CHECK(m.stages[0].peak_mem_bytes == 71000000);
    CHECK(m.stages[0].state_bytes == 1200000 && m.stages[0].act_slots == 3);
    CHECK(isnan(m.stages[1].state_bytes) && m.stages[1].act_slots == -1); /* absent */
    CHECK(strcmp(m.stages[1].name, "fusion") == 0 && m.stages[1].replica == 1);
    CHECK(m.has_balance && m.efficiency == 0.44);
    CHECK(strcmp(m.placement, "image.0[0:3):1 image.1[3:6):1 text.0:1 fusion:2") == 0);
    CHECK(m.has_eval && m.val_i2t_r1 == 0.656 && m.val_t2i_r1 == 0.66);
}

/* The writer prints the coordinator's bytes: parse, write, compare. */
static void test_write_round_trip(void)
{
    mmp_metrics_step m, back;
    CHECK_OK(mmp_metrics_parse(PIPE_LINE, strlen(PIPE_LINE), &m));
    m.decision = "{\"action\":\"route\",\"reason\":\"x\"}";
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    CHECK(f != NULL);
    if (!f) {
        return;
    }
    CHECK_OK(mmp_metrics_write(f, &m));
    fclose(f);
    CHECK(strcmp(buf, PIPE_LINE) == 0);
    if (strcmp(buf, PIPE_LINE) != 0) {
        fprintf(stderr, "  wrote: %s  want:  %s", buf, PIPE_LINE);
    }
    CHECK_OK(mmp_metrics_parse(buf, n, &back));
    CHECK(back.n_stages == 2 && back.stages[1].bwd_ms == 6 && back.efficiency == 0.44);
    free(buf);
}

/* The single-process trainer's record: pipeline-only fields stay absent. */
static void test_single_line(void)
{
    mmp_metrics_step m;
    mmp_metrics_step_clear(&m);
    m.step = 1;
    m.loss = m.itc_loss = m.itm_loss = m.lr = m.grad_norm = 1;
    m.samples_per_s = 229.4;
    m.step_ms = m.data_ms = 278.9;
    m.skipped_samples = 0;
    m.bubble = 0;
    m.n_stages = 1;
    snprintf(m.stages[0].name, sizeof m.stages[0].name, "single");
    m.stages[0].replica = 0;
    m.stages[0].busy_ms = 278.9;
    m.stages[0].idle_ms = 0;
    m.stages[0].peak_mem_bytes = 47700000;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    CHECK_OK(mmp_metrics_write(f, &m));
    fclose(f);
    CHECK(strstr(buf, "\"stages\":[{\"name\":\"single\",\"replica\":0,\"busy_ms\":278.9,"
                      "\"idle_ms\":0,\"peak_mem_bytes\":47700000}]}") != NULL);
    CHECK(!strstr(buf, "balance") && !strstr(buf, "val_"));
    mmp_metrics_step back;
    CHECK_OK(mmp_metrics_parse(buf, n, &back));
    CHECK(!back.has_balance && !back.has_eval && isnan(back.efficiency));
    CHECK(isnan(back.stages[0].fwd_ms) && back.stages[0].microbatches == -1);
    /* a line without the loss-scale fields (older runs) reads them as absent */
    CHECK(isnan(back.loss_scale) && back.step_skipped == -1 && !strstr(buf, "loss_scale"));
    /* and without cpu_ms (older runs): absent too */
    CHECK(isnan(back.cpu_ms) && isnan(back.stages[0].cpu_ms) && !strstr(buf, "cpu_ms"));
    free(buf);
    /* cpu_ms, the step's and a process's, written and read back */
    m.cpu_ms = 151.25;
    m.stages[0].cpu_ms = 150.5;
    buf = NULL;
    n = 0;
    f = open_memstream(&buf, &n);
    CHECK_OK(mmp_metrics_write(f, &m));
    fclose(f);
    CHECK(strstr(buf, "\"cpu_ms\":151.2,\"stages\":[") != NULL);
    CHECK(strstr(buf, "\"peak_mem_bytes\":47700000,\"cpu_ms\":150.5}") != NULL);
    CHECK_OK(mmp_metrics_parse(buf, n, &back));
    CHECK(fabs(back.cpu_ms - 151.2) < 0.06 && back.stages[0].cpu_ms == 150.5);
    free(buf);
}

static void test_errors(const char *tmp)
{
    mmp_metrics_step m;
    CHECK(mmp_metrics_parse("[1,2]", 5, &m) == MMP_ERR_DATA);
    CHECK(mmp_metrics_parse("{\"step\":1,\"step_ms\":\"x\"}", 24, &m) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "step_ms is not a number") != NULL);
    const char *bad_stage = "{\"stages\":[{\"replica\":0}]}";
    CHECK(mmp_metrics_parse(bad_stage, strlen(bad_stage), &m) == MMP_ERR_DATA);
    const char *nan_loss = "{\"step\":3,\"loss\":null,\"step_ms\":5}";
    CHECK_OK(mmp_metrics_parse(nan_loss, strlen(nan_loss), &m));
    CHECK(isnan(m.loss) && m.step_ms == 5 && !m.has_stages);
    /* what the writer puts for a number that is not finite reads back as
     * absent, in every field (fuzz_metrics: a written line did not read) */
    m.step_ms = INFINITY;
    m.samples_per_s = NAN;
    m.has_balance = 1;
    m.efficiency = 1e300; /* "%.4f" prints 305 characters (fuzz_metrics) */
    char *buf = NULL;
    size_t n = 0;
    FILE *mf = open_memstream(&buf, &n);
    CHECK(mf && mmp_metrics_write(mf, &m) == MMP_OK);
    if (mf) {
        fclose(mf);
    }
    CHECK(buf && strstr(buf, "\"step_ms\":null") != NULL);
    CHECK(buf && mmp_metrics_parse(buf, n, &m) == MMP_OK && isnan(m.step_ms) &&
          isnan(m.samples_per_s) && m.step == 3 && m.efficiency == 1e300);
    free(buf);
    const char *quoted_null = "{\"step\":3,\"step_ms\":\"null\"}"; /* a string: no number */
    CHECK(mmp_metrics_parse(quoted_null, strlen(quoted_null), &m) == MMP_ERR_DATA);
    const char *big_int = "{\"step\":1e300}"; /* an int field out of int's range */
    CHECK(mmp_metrics_parse(big_int, strlen(big_int), &m) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "step is not an integer") != NULL);

    /* A run directory: blank lines skipped, the bad line named by number. */
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s", tmp);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) {
        return;
    }
    fputs(PIPE_LINE, f);
    fputs("\n   \n{\"step\":8, oops}\n", f);
    fclose(f);
    mmp_metrics_reader r;
    int got = 0;
    CHECK_OK(mmp_metrics_open(&r, dir));
    CHECK_OK(mmp_metrics_next(&r, &m, &got));
    CHECK(got == 1 && m.step == 7);
    CHECK(mmp_metrics_next(&r, &m, &got) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "metrics.jsonl:4:") != NULL);
    mmp_metrics_close(&r);
    mmp_metrics_close(&r);
    CHECK(mmp_metrics_open(&r, "/nonexistent/metrics.jsonl") == MMP_ERR_IO);
    mmp_metrics_close(&r);
}

static void test_median(void)
{
    double odd[] = {5, 1, 3}, even[] = {4, 1, 3, 2};
    CHECK(mmp_median(odd, 3) == 3);
    CHECK(mmp_median(even, 4) == 2.5);
    CHECK(isnan(mmp_median(odd, 0)));
    double v[] = {1, 2, 6};
    CHECK(mmp_mean(v, 3) == 3 && isnan(mmp_mean(v, 0)));
}

static const char *tmp;

static void test_errors_case(void)
{
    test_errors(tmp);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* A write the file system refuses part way (RLIMIT_FSIZE here, as a full
 * disk) is cut back off: the file keeps whole lines, and the next write
 * goes after them. */
static void test_write_cut_short(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/cut.jsonl", tmp);
    mmp_metrics_step m;
    CHECK_OK(mmp_metrics_parse(PIPE_LINE, strlen(PIPE_LINE), &m));
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) {
        return;
    }
    CHECK_OK(mmp_metrics_write(f, &m));
    const long whole = file_size(path);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = (rlim_t)whole + 100; /* room for 100 bytes of the next line */
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    mmp_err e = mmp_metrics_write(f, &m);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, was);
    CHECK(e == MMP_ERR_IO && strstr(mmp_last_error(), "this step's line left out"));
    CHECK(file_size(path) == whole);
    CHECK_OK(mmp_metrics_write(f, &m));
    fclose(f);
    CHECK(file_size(path) == 2 * whole);
}

/* The run checks each step that its metrics.jsonl is still the file it
 * writes: removed (the run directory deleted) or replaced is an error. */
static void test_same_file(void)
{
    char dir[1024], path[1100], moved[1100];
    snprintf(dir, sizeof dir, "%s/samefile", tmp);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(moved, sizeof moved, "%s/old.jsonl", dir);
    FILE *f = fopen(path, "a");
    CHECK(f != NULL);
    if (!f) {
        return;
    }
    CHECK_OK(mmp_metrics_same_file(f, dir));
    CHECK(rename(path, moved) == 0);
    CHECK(mmp_metrics_same_file(f, dir) == MMP_ERR_IO && strstr(mmp_last_error(), "(gone)"));
    FILE *other = fopen(path, "w");
    CHECK(other != NULL);
    if (other) {
        fclose(other);
    }
    CHECK(mmp_metrics_same_file(f, dir) == MMP_ERR_IO && strstr(mmp_last_error(), "(replaced)"));
    fclose(f);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_read_pipeline_line),
    MMP_TEST_CASE(test_write_round_trip),
    MMP_TEST_CASE(test_single_line),
    {"test_errors", test_errors_case},
    MMP_TEST_CASE(test_median),
    MMP_TEST_CASE(test_write_cut_short),
    MMP_TEST_CASE(test_same_file),
};

int main(int argc, char **argv)
{
    tmp = mmp_test_tmpdir("test_metrics");
    return MMP_TEST_MAIN("test_metrics", cases, argc, argv);
}
