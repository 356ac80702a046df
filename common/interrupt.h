/* Stopping a training run by signal: the first SIGINT, SIGTERM or SIGHUP (a
 * closed terminal or ssh session; dying of it lost every step since the
 * last checkpoint) asks the run to stop at the next step boundary (after
 * checkpointing the step in flight); a second one asks it to stop at once.
 * The first signal again within MMP_INTERRUPT_REPEAT_MS of it is the same
 * request delivered twice, not a second one: GNU timeout, and scripts like
 * it, signal the process and then its whole process group, and nobody
 * presses Ctrl-C twice within a fifth of a second.
 *
 * The handler only records; the trainer polls. One process-wide state (a
 * signal is process-wide): the coordinator and the single-process trainer
 * each install it once per run. Never used by stage processes (they stop
 * when the coordinator tells them, or when it dies). */
#ifndef MMP_COMMON_INTERRUPT_H
#define MMP_COMMON_INTERRUPT_H

#define MMP_INTERRUPT_REPEAT_MS 200

/* Installs the SIGINT/SIGTERM/SIGHUP handler (SIGHUP not where it is
 * ignored: nohup) and clears any earlier record;
 * ignores SIGPIPE (a log pipe closed by the same Ctrl-C must not end the run
 * before its checkpoint; the processes it starts inherit that).
 * die_on_second: a second signal ends the process at once with the signal's
 * default action (for a process with nothing to clean up); otherwise it is
 * only recorded and the caller stops at once when it sees
 * mmp_interrupt_count() >= 2 (the coordinator, which must stop its stages
 * and remove their shared memory first). */
void mmp_interrupt_install(int die_on_second);

/* The first signal received (SIGINT, SIGTERM or SIGHUP), 0 when none. */
int mmp_interrupt_signal(void);

/* How many signals arrived since install (saturates at 2). */
int mmp_interrupt_count(void);

/* The exit status a run stopped by the first signal reports: 128 + signal
 * (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP); 0 when none arrived. */
int mmp_interrupt_status(void);

#endif
