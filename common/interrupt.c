/* SIGINT/SIGTERM/SIGHUP: first asks for a stop at a step boundary, second for a stop
 * at once. Must never do more in the handler than async-signal-safe stores,
 * signal() and raise(). */
#include "common/interrupt.h"

#include <signal.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t first_sig = 0;
static volatile sig_atomic_t count = 0;
static volatile sig_atomic_t die_second = 0;
static struct timespec first_at; /* written by the handler before count = 1 */

/* ms since the first signal (clock_gettime is async-signal-safe) */
static long since_first_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)(now.tv_sec - first_at.tv_sec) * 1000 + (now.tv_nsec - first_at.tv_nsec) / 1000000;
}

static void on_signal(int sig)
{
    if (count == 0) {
        clock_gettime(CLOCK_MONOTONIC, &first_at);
        first_sig = sig;
        count = 1;
        return;
    }
    if (count == 1 && sig == first_sig && since_first_ms() < MMP_INTERRUPT_REPEAT_MS) {
        return; /* the first one again: sent to this process and to its group */
    }
    count = 2;
    if (die_second) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

void mmp_interrupt_install(int die_on_second)
{
    first_sig = 0;
    count = 0;
    die_second = die_on_second;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* The terminal or ssh session went away; unless started under nohup,
     * whose ignored SIGHUP asks to outlive it. */
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) {
        sigaction(SIGHUP, &sa, NULL);
    }
    /* `mmpipe launch ... 2>&1 | tee log`: Ctrl-C ends tee at once, and the
     * next log line would end this process before its checkpoint. A write
     * to a closed pipe fails instead (stage processes inherit this). */
    signal(SIGPIPE, SIG_IGN);
}

int mmp_interrupt_signal(void)
{
    return first_sig;
}

int mmp_interrupt_count(void)
{
    return count;
}

int mmp_interrupt_status(void)
{
    return first_sig ? 128 + first_sig : 0;
}
