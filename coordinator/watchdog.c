/* Stall watchdog: judge silence, name the stage at fault. Must never act on
 * the processes itself; the coordinator decides to stop or restart. */
#include "coordinator/watchdog.h"

#include <stdio.h>
#include <string.h>

char mmp_watchdog_proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        return '?';
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* "pid (comm) S ...": comm may hold spaces and parentheses. */
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] ? rp[2] : '?';
}

int mmp_watchdog_check(const mmp_watch_proc *p, int n, double now, double timeout_s,
                       const char *what, const char *limit, char *why, size_t why_n)
{
    if (timeout_s <= 0) {
        return -1;
    }
    int oldest = -1;
    for (int i = 0; i < n; i++) {
        if (p[i].alive && p[i].awaited && now - p[i].last_seen > timeout_s &&
            (oldest < 0 || p[i].last_seen < p[oldest].last_seen)) {
            oldest = i;
        }
    }
    if (oldest < 0) {
        return -1;
    }
    double quiet = now - p[oldest].last_seen;
    for (int i = 0; i < n; i++) {
        char st = p[i].alive ? mmp_watchdog_proc_state(p[i].pid) : '?';
        if (st == 'T' || st == 't') {
            int said = p[i].doing && p[i].doing[0];
            snprintf(why, why_n,
                     "stage %s (pid %d) is stopped (state %c: SIGSTOP or a debugger); no progress "
                     "for %.0f s (waiting for %s%s%s)",
                     p[i].name, p[i].pid, st, quiet, what, said ? "; it last reported: " : "",
                     said ? p[i].doing : "");
            return i;
        }
    }
    int said = p[oldest].doing && p[oldest].doing[0];
    snprintf(why, why_n,
             "stage %s (pid %d, state %c) made no progress for %.0f s (waiting for %s%s%s); "
             "%s is %.0f s",
             p[oldest].name, p[oldest].pid, mmp_watchdog_proc_state(p[oldest].pid), quiet, what,
             said ? "; it last reported: " : "", said ? p[oldest].doing : "", limit, timeout_s);
    return oldest;
}
