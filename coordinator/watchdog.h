/* The coordinator's stall watchdog: which stage to blame when the job makes
 * no progress.
 *
 * A stage reports progress by talking: heartbeats after its instructions
 * (at most one a second), gradient norms, step results, checkpoint acks.
 * When one the coordinator is waiting on has said nothing for timeout_s,
 * the job is stalled. Every stage then goes quiet together (each waits on
 * its peers' data), so silence alone does not say who is at fault: a stage
 * process that is stopped (SIGSTOP, a debugger: state T/t in /proc) is named
 * first; otherwise the awaited stage silent the longest. Reads /proc only
 * (stages are local processes); never signals or waits on anything. */
#ifndef MMP_COORDINATOR_WATCHDOG_H
#define MMP_COORDINATOR_WATCHDOG_H

#include <stddef.h>

typedef struct mmp_watch_proc {
    const char *name; /* "text.0/0" */
    int pid;
    int alive;         /* not reaped yet */
    int awaited;       /* the coordinator waits for something from it */
    double last_seen;  /* mmp_now() of its last message */
    const char *doing; /* what it last reported doing (start-up), or NULL / "" */
} mmp_watch_proc;

/* Checks n processes at time now (mmp_now()). Returns -1 while no awaited,
 * alive process has been silent for more than timeout_s (or timeout_s <= 0:
 * the watchdog is off); else the index of the process to blame, with a
 * sentence naming it, its pid, its state, how long the job has made no
 * progress and what the blamed process last reported doing in why (what:
 * what the coordinator is waiting for; limit: the setting timeout_s comes
 * from, "train.stall_timeout"). */
int mmp_watchdog_check(const mmp_watch_proc *p, int n, double now, double timeout_s,
                       const char *what, const char *limit, char *why, size_t why_n);

/* The scheduler state letter of a local process ('R', 'S', 'D', 'T', 't',
 * 'Z', ...) from /proc/<pid>/stat; '?' when it cannot be read. */
char mmp_watchdog_proc_state(int pid);

#endif
