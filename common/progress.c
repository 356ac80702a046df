#include "common/progress.h"

#include <errno.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

double mmp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sleeps to the CLOCK_MONOTONIC time t (ns since its zero). */
static void sleep_until_ns(long long t_ns)
{
    /* The default 50 us timer slack would lengthen every simulated compute
     * by up to that much: ask for the deadline itself. */
    static int slack_set = 0;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        slack_set = 1;
    }
    struct timespec t = {.tv_sec = (time_t)(t_ns / 1000000000LL),
                         .tv_nsec = (long)(t_ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
    }
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + (long long)t.tv_nsec;
}

void mmp_sleep_ms(double ms)
{
    if (!(ms > 0)) {
        return;
    }
    sleep_until_ns(now_ns() + (long long)(ms * 1e6));
}

void mmp_sim_sleep(mmp_sim_clock *c, double ms)
{
    if (!(ms > 0)) {
        return;
    }
    double owed = c->late_ms > 0 ? c->late_ms : 0;
    if (owed >= ms) {
        c->late_ms = owed - ms; /* this compute is paid for by earlier lateness */
        return;
    }
    long long due = now_ns() + (long long)((ms - owed) * 1e6);
    sleep_until_ns(due);
    double late = (double)(now_ns() - due) * 1e-6;
    c->late_ms = late < 0 ? 0 : late > MMP_SIM_CARRY_MAX_MS ? MMP_SIM_CARRY_MAX_MS : late;
}

void mmp_progress_init(mmp_progress *p, int first, int total, int plain_every)
{
    p->tty = isatty(2);
    p->plain_every = plain_every > 0 ? plain_every : 1;
    p->first = first > 0 ? first : 0;
    p->total = total;
    p->t0 = mmp_now();
    p->last_len = 0;
}

static void fmt_eta(char *buf, size_t n, double s)
{
    int t = (int)(s + 0.5);
    if (t >= 3600) {
        snprintf(buf, n, "%dh%02dm", t / 3600, t / 60 % 60);
    } else {
        snprintf(buf, n, "%dm%02ds", t / 60, t % 60);
    }
}

void mmp_progress_update(mmp_progress *p, int done, const char *text)
{
    if (!p->tty && done % p->plain_every != 0 && done != p->total && done != 1) {
        return;
    }
    double el = mmp_now() - p->t0;
    char eta[32];
    int here = done - p->first; /* the steps this launch did */
    fmt_eta(eta, sizeof eta, here > 0 ? el / here * (p->total - done) : 0);
    char line[512];
    int len = snprintf(line, sizeof line, "step %d/%d  %s  eta %s", done, p->total, text, eta);
    if (p->tty) {
        int pad = p->last_len > len ? p->last_len - len : 0;
        fprintf(stderr, "\r%s%*s", line, pad, "");
        p->last_len = len;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

void mmp_progress_end(mmp_progress *p)
{
    if (p->tty && p->last_len) {
        fprintf(stderr, "\n");
    }
    p->last_len = 0;
}
