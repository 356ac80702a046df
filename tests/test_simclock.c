/* common/progress.h's simulated-compute clock: a sleep's wake-up lateness is
 * carried (up to MMP_SIM_CARRY_MAX_MS) and taken off the next sleep, so a run
 * of simulated computes lasts what the cost model says, not that plus every
 * wake-up's latency. What is checked never depends on the machine's speed:
 * the carry's arithmetic, and lower bounds (a deadline is never missed early). */
#include <math.h>

#include "common/progress.h"
#include "tests/harness.h"

static void test_carry_pays_for_short_computes(void)
{
    mmp_sim_clock c = {.late_ms = 0.5};
    mmp_sim_sleep(&c, 0.2); /* paid for by the carry: no sleep */
    CHECK(fabs(c.late_ms - 0.3) < 1e-12);
    mmp_sim_sleep(&c, 0.3);
    CHECK(fabs(c.late_ms) < 1e-12);
    c.late_ms = 0.25;
    mmp_sim_sleep(&c, 0); /* nothing to compute: the carry stays */
    mmp_sim_sleep(&c, -1);
    mmp_sim_sleep(&c, NAN);
    CHECK(c.late_ms == 0.25);
}

static void test_sleep_takes_the_carry_off(void)
{
    mmp_sim_clock c = {.late_ms = 0.4};
    double t0 = mmp_now();
    mmp_sim_sleep(&c, 2.0);
    double ms = (mmp_now() - t0) * 1e3;
    CHECK(ms >= 1.6 - 1e-3); /* its deadline, 2 ms less the 0.4 carried */
    CHECK(c.late_ms >= 0 && c.late_ms <= MMP_SIM_CARRY_MAX_MS);
}

/* Twenty 1 ms computes last at least 20 ms less what was carried in, and
 * what was late at the end is carried out, within the bound. */
static void test_a_run_lasts_the_model(void)
{
    mmp_sim_clock c = {0};
    double t0 = mmp_now();
    for (int i = 0; i < 20; i++) {
        mmp_sim_sleep(&c, 1.0);
        CHECK(c.late_ms >= 0 && c.late_ms <= MMP_SIM_CARRY_MAX_MS);
    }
    double ms = (mmp_now() - t0) * 1e3;
    CHECK(ms >= 20.0 - 1e-3);
}

MMP_TEST_LIST("test_simclock", MMP_TEST_CASE(test_carry_pays_for_short_computes),
              MMP_TEST_CASE(test_sleep_takes_the_carry_off),
              MMP_TEST_CASE(test_a_run_lasts_the_model))
