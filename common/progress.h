/* The live progress line of long work (training, bench grids).
 *
 * On a terminal it rewrites one line in place; otherwise it prints a plain
 * line at most every `plain_every` updates (and the last one), so logs stay
 * readable. Writes to stderr; never to stdout, which belongs to results. */
#ifndef MMP_COMMON_PROGRESS_H
#define MMP_COMMON_PROGRESS_H

typedef struct mmp_progress {
    int tty;
    int plain_every;
    int first, total; /* steps done when this launch began, and in all */
    double t0;
    int last_len;
} mmp_progress;

/* first: the steps already done when the work starts (a resumed run's
 * checkpoint): the eta is this launch's pace over the steps left. */
void mmp_progress_init(mmp_progress *p, int first, int total, int plain_every);
/* done of total finished; text is appended after "step done/total". */
void mmp_progress_update(mmp_progress *p, int done, const char *text);
/* Ends the live line (a newline on a terminal). */
void mmp_progress_end(mmp_progress *p);

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double mmp_now(void);

/* Sleeps ms milliseconds to an absolute CLOCK_MONOTONIC deadline (signals do
 * not shorten it; no busy wait). Simulated compute waits with it. */
void mmp_sleep_ms(double ms);

/* Simulated compute's clock (compute: simulated). A sleep wakes late by the
 * timer's and the scheduler's latency (tens of us per call on a loaded host,
 * so a stage of 192 two-millisecond computes per step ran 2-4% slow); the
 * lateness is carried and taken off the next simulated compute's sleep, so a
 * stage's simulated busy time sums to the cost model's. Only lateness up to
 * MMP_SIM_CARRY_MAX_MS is carried: a longer preemption is load, and stays. */
#define MMP_SIM_CARRY_MAX_MS 1.0
typedef struct mmp_sim_clock {
    double late_ms; /* owed to the next sleep, 0 .. MMP_SIM_CARRY_MAX_MS */
} mmp_sim_clock;
/* Sleeps ms of simulated compute less what c carries (no sleep when that is
 * more; the rest stays carried), and carries this wake-up's lateness. */
void mmp_sim_sleep(mmp_sim_clock *c, double ms);

#endif
