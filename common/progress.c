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

void mmp_sleep_ms(double ms)
{
    if (!(ms > 0)) {
        return;
    }
    /* The default 50 us timer slack would lengthen every simulated compute
     * by up to that much: ask for the deadline itself. */
    static int slack_set = 0;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        slack_set = 1;
    }
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long ns = (long long)t.tv_nsec + (long long)(ms * 1e6);
    t.tv_sec += (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
    }
}

void mmp_progress_init(mmp_progress *p, int total, int plain_every)
{
    p->tty = isatty(2);
    p->plain_every = plain_every > 0 ? plain_every : 1;
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
    fmt_eta(eta, sizeof eta, done > 0 ? el / done * (p->total - done) : 0);
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
