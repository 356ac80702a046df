/* metrics.jsonl lines (common/metrics.c), what `mmpipe simulate --costs RUN`
 * and `mmpipe bench` read from a run directory that may come from anywhere:
 * one line through mmp_metrics_parse. A line it takes must write back
 * (mmp_metrics_write) as a line it takes again, and that second reading must
 * write the same bytes: the reader and the writer agree on the schema. */
#include "common/metrics.h"
#include "tests/fuzz/fuzz.h"

/* m written to a malloc'd string (*len bytes); NULL when out of memory. */
static char *written(const mmp_metrics_step *m, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) {
        return NULL;
    }
    mmp_err e = mmp_metrics_write(f, m);
    fclose(f);
    if (e != MMP_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *line = malloc(size + 1);
    mmp_metrics_step *m = malloc(sizeof *m), *again = malloc(sizeof *again);
    char *one = NULL, *two = NULL;
    if (!line || !m || !again) {
        goto out;
    }
    memcpy(line, data, size);
    line[size] = 0;
    volatile long step = mmp_metrics_line_step(line);
    (void)step;
    if (mmp_metrics_parse(line, size, m) != MMP_OK) {
        goto out;
    }
    if (m->n_stages < 0 || m->n_stages > MMP_METRICS_MAX_STAGES ||
        strnlen(m->placement, sizeof m->placement) == sizeof m->placement) {
        __builtin_trap();
    }
    size_t n1 = 0, n2 = 0;
    one = written(m, &n1);
    if (!one) {
        goto out;
    }
    if (mmp_metrics_parse(one, n1 - 1, again) != MMP_OK) {
        fprintf(stderr, "fuzz_metrics: the writer's line does not read back: %s\n%s",
                mmp_last_error(), one);
        __builtin_trap();
    }
    two = written(again, &n2);
    if (two && (n1 != n2 || memcmp(one, two, n1) != 0)) {
        fprintf(stderr, "fuzz_metrics: written twice differently:\n%s%s", one, two);
        __builtin_trap();
    }
out:
    free(two);
    free(one);
    free(again);
    free(m);
    free(line);
    return 0;
}
