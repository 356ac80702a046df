/* The balancer's measured efficiency (coordinator/balancer.h): busy over
 * slots x step time, and where a CPU plan has more processes than cores,
 * each process counted for at most the CPU time it got, so two processes
 * sharing a core cannot both count the core's time. */
#include "coordinator/balancer.h"

#include <math.h>
#include <string.h>

#include "common/pin.h"

#include "tests/harness.h"

/* The demo's shape on the given cores (train.pin: a list of that many), 1/1/1. */
static void make(mmp_plan *p, mmp_sched *s, int cores)
{
    mmp_plan_defaults(p);
    p->train.pin.mode = MMP_PIN_LIST;
    p->train.pin.n_cores = cores;
    for (int k = 0; k < cores; k++) {
        p->train.pin.cores[k] = k;
    }
    CHECK_OK(mmp_sched_compile(s, p));
}

static void test_shared_cores(void)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_balancer b;
    make(&p, &s, 2);
    mmp_balancer_reset(&b, &p, &s, "{}");
    CHECK(b.cores == 2 && b.slots == 2 && s.n_stages == 3);
    /* 3 processes on 2 cores, a 100 ms step: image computes 90 ms of wall
     * time but got 60 ms of CPU (text held its core 30 ms of that) */
    mmp_bal_proc pr[3] = {{.busy_ms = 90, .cpu_ms = 60},
                          {.busy_ms = 70, .cpu_ms = 70},
                          {.busy_ms = 60, .cpu_ms = 65}};
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (60 + 70 + 60) / 200.0) < 1e-12);
    CHECK(b.efficiency <= 1);
    /* wall-time busy alone would say 1.1 */
    CHECK((90 + 70 + 60) / 200.0 > 1);
    /* a stage that reports no CPU time (0) counts its wall time */
    pr[0].cpu_ms = 0;
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (90 + 70 + 60) / 200.0) < 1e-12);
    mmp_sched_fini(&s);
}

static void test_core_each(void)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_balancer b;
    make(&p, &s, 4); /* a core for each process: wall time is the measure */
    mmp_balancer_reset(&b, &p, &s, "{}");
    CHECK(b.cores == 4 && b.slots == 4);
    mmp_bal_proc pr[3] = {{.busy_ms = 90, .cpu_ms = 60},
                          {.busy_ms = 70, .cpu_ms = 70},
                          {.busy_ms = 60, .cpu_ms = 65}};
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (90 + 70 + 60) / 400.0) < 1e-12);
    mmp_sched_fini(&s);
}

MMP_TEST_LIST("test_balancer", MMP_TEST_CASE(test_shared_cores), MMP_TEST_CASE(test_core_each))
