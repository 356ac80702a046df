/* The stage processes of a launch: started with posix_spawn in their own
 * process group (the job token in their environment, never in argv),
 * reaped, and stopped with nothing left behind (processes, shared memory).
 * Never judges an end: coord_settle does. */
#include <spawn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/progress.h"
#include "coordinator/coord.h"
#include "common/interrupt.h"
#include "transport/channel.h"

extern char **environ;

mmp_err coord_spawn_all(coord *c)
{
    char exe[1024];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        return mmp_errorf(MMP_ERR_IO, "cannot find my own executable: %s", strerror(errno));
    }
    exe[len] = 0;
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    /* Own process group: a terminal's Ctrl-C reaches the coordinator only,
     * which then stops the stages in order. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    /* The token travels in the stages' environment, never in argv (ps shows
     * argv to every user; /proc/PID/environ only to the owner). */
    size_t n_env = 0;
    while (environ[n_env]) {
        n_env++;
    }
    char **envp = calloc(n_env + 2, sizeof *envp);
    if (!envp) {
        posix_spawnattr_destroy(&attr);
        return mmp_errorf(MMP_ERR_NOMEM, "stage environment");
    }
    char token_env[sizeof MMP_CTL_TOKEN_ENV + sizeof c->token + 1];
    snprintf(token_env, sizeof token_env, "%s=%s", MMP_CTL_TOKEN_ENV, c->token);
    size_t k = 0;
    for (size_t e = 0; e < n_env; e++) {
        if (strncmp(environ[e], MMP_CTL_TOKEN_ENV "=", sizeof MMP_CTL_TOKEN_ENV) != 0) {
            envp[k++] = environ[e];
        }
    }
    envp[k++] = token_env;
    for (int i = 0; i < c->n; i++) {
        proc *p = &c->procs[i];
        char stage[64], replica[16];
        snprintf(stage, sizeof stage, "%s", c->sched.stages[i].name);
        snprintf(replica, sizeof replica, "%d", c->sched.stages[i].replica);
        char *argv[] = {exe,   "stage",     "--connect", c->endpoint, "--stage",
                        stage, "--replica", replica,     NULL};
        int rc = posix_spawn(&p->pid, exe, NULL, &attr, argv, envp);
        if (rc != 0) {
            posix_spawnattr_destroy(&attr);
            free(envp);
            return mmp_errorf(MMP_ERR_IO, "spawn %s: %s", p->name, strerror(rc));
        }
        p->alive = 1;
        p->last_seen = mmp_now();
        MMP_INFO("started %s (pid %d)", p->name, (int)p->pid);
    }
    posix_spawnattr_destroy(&attr);
    free(envp);
    return MMP_OK;
}

const char *coord_describe_exit(int status, char *buf, size_t n)
{
    if (WIFSIGNALED(status)) {
        snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    } else {
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    }
    return buf;
}

/* Reaps children that ended (no judgement: see settle). Returns how many. */
int coord_reap(coord *c)
{
    int n_new = 0;
    for (int i = 0; i < c->n; i++) {
        proc *p = &c->procs[i];
        int status;
        if (p->alive && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->alive = 0;
            p->exit_status = status;
            p->reported = 0;
            c->killed |= WIFSIGNALED(status); /* stop_all's own kills are not reaped here */
            n_new++;
        }
    }
    return n_new;
}

void coord_stop_all(coord *c, int graceful)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Abort ab = MMPIPE__ABORT__INIT;
    Mmpipe__Shutdown sd = MMPIPE__SHUTDOWN__INIT;
    if (graceful) {
        env.body_case = MMPIPE__ENVELOPE__BODY_SHUTDOWN;
        env.shutdown = &sd;
    } else {
        ab.reason = c->failure[0] ? c->failure : "stopped";
        env.body_case = MMPIPE__ENVELOPE__BODY_ABORT;
        env.abort = &ab;
    }
    for (int i = 0; c->ctl && i < c->n; i++) {
        if (c->procs[i].alive && c->procs[i].have_hello) {
            mmp_ctl_send(c->ctl, c->procs[i].name, &env);
        }
    }
    /* A stage blocked on a data channel cannot read the control message:
     * give everyone a moment, then make sure. */
    double t0 = mmp_now(), grace = graceful ? 5.0 : 1.0;
    for (;;) {
        if (mmp_interrupt_count() >= 2) {
            grace = 0; /* a second signal: at once */
        }
        coord_reap(c);
        int left = 0;
        for (int i = 0; i < c->n; i++) {
            left += c->procs[i].alive;
        }
        if (!left) {
            break;
        }
        if (mmp_now() - t0 > grace) {
            for (int i = 0; i < c->n; i++) {
                if (c->procs[i].alive) {
                    kill(c->procs[i].pid, SIGKILL);
                    waitpid(c->procs[i].pid, &c->procs[i].exit_status, 0);
                    c->procs[i].alive = 0;
                }
            }
            break;
        }
        usleep(20000);
    }
    mmp_shm_unlink_prefix(c->shm_prefix);
}
