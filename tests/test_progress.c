/* common/progress: the progress line's eta is this launch's pace over the
 * steps left, so a resumed run (its first steps done by an earlier launch)
 * does not promise to end in a fraction of the time left. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/progress.h"
#include "tests/harness.h"

typedef struct update_args {
    mmp_progress *p;
    int done;
} update_args;

static void update(void *arg)
{
    update_args *u = arg;
    mmp_progress_update(u->p, u->done, "loss 1.0");
}

/* The line update(done) prints. */
static void line_of(mmp_progress *p, int done, char *out, size_t n)
{
    update_args u = {p, done};
    char *got = mmp_test_stderr_of("test_progress", update, &u);
    snprintf(out, n, "%s", got ? got : "");
    free(got);
}

static void test_eta_after_resume(void)
{
    mmp_progress p;
    char line[512];
    /* resumed at step 80 of 200: 20 steps in 20.5 s, 100 left: 102.5 s and
     * what the call itself takes, "1m4Xs" (the whole run's pace would say
     * 20.5 s) */
    mmp_progress_init(&p, 80, 200, 1);
    p.tty = 0;
    p.t0 = mmp_now() - 20.5;
    line_of(&p, 100, line, sizeof line);
    const char *eta = strstr(line, "step 100/200  loss 1.0  eta 1m4");
    if (!eta) {
        fprintf(stderr, "  got: %s", line);
    }
    CHECK(eta != NULL);
    /* from the start: 100 steps in 20.5 s, 100 left: 20.5 s, "0m2Xs" */
    mmp_progress_init(&p, 0, 200, 1);
    p.tty = 0;
    p.t0 = mmp_now() - 20.5;
    line_of(&p, 100, line, sizeof line);
    CHECK(strstr(line, "eta 0m2") != NULL);
    /* no step of this launch yet: no eta to give */
    mmp_progress_init(&p, 100, 200, 1);
    p.tty = 0;
    line_of(&p, 100, line, sizeof line);
    CHECK(strstr(line, "eta 0m00s") != NULL);
}

static const mmp_test_case CASES[] = {
    MMP_TEST_CASE(test_eta_after_resume),
};

int main(int argc, char **argv)
{
    return MMP_TEST_MAIN("test_progress", CASES, argc, argv);
}
