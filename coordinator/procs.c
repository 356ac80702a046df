/* The stage processes of a launch: started with posix_spawn in their own
 * process group, here or through ssh / srun (coordinator/launcher.h; the job
 * token in their environment or, over tcp, on their stdin, never in argv),
 * reaped, and stopped with nothing left behind (processes, shared memory).
 * Never judges an end: coord_settle does. */
#include <spawn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/pin.h"
#include "common/progress.h"
#include "coordinator/coord.h"
#include "coordinator/launcher.h"
#include "common/interrupt.h"
#include "transport/channel.h"

extern char **environ;

static void close_pipe(proc *p)
{
    if (p->pipe_w1 > 0) {
        close(p->pipe_w1 - 1);
        p->pipe_w1 = 0;
    }
}

/* Over tcp: a pipe on the stage's stdin carrying the secrets line (a pipe
 * holds 64 KiB: the write never blocks); the write end stays with us. */
/* *read_end: the pipe end the child gets as stdin; ours to close after the spawn. */
static mmp_err secrets_pipe(coord *c, proc *p, posix_spawn_file_actions_t *fa, int *read_end)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        return mmp_errorf(MMP_ERR_IO, "pipe for %s: %s", p->name, strerror(errno));
    }
    char line[256];
    mmp_err e = mmp_launch_secrets_format(c->token, &c->keys, line, sizeof line);
    if (e != MMP_OK) {
        close(fds[0]);
        close(fds[1]);
        return mmp_error_prefix(e, "secrets for %s", p->name);
    }
    ssize_t n = (ssize_t)strlen(line);
    ssize_t w = write(fds[1], line, (size_t)n);
    explicit_bzero(line, sizeof line);
    if (w != n) {
        close(fds[0]);
        close(fds[1]);
        return mmp_errorf(MMP_ERR_IO, "secrets for %s: %s", p->name, strerror(errno));
    }
    posix_spawn_file_actions_adddup2(fa, fds[0], 0);
    p->pipe_w1 = fds[1] + 1;
    *read_end = fds[0];
    return MMP_OK;
}

mmp_err coord_spawn_all(coord *c)
{
    char exe[1024], cwd[1024];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        return mmp_errorf(MMP_ERR_IO, "cannot find my own executable: %s", strerror(errno));
    }
    exe[len] = 0;
    /* A binary replaced on disk while the run goes on (a rebuild, an
     * upgrade) reads "PATH (deleted)": the name of what is there now. */
    static const char gone[] = " (deleted)";
    if ((size_t)len > sizeof gone - 1 && strcmp(exe + len - (sizeof gone - 1), gone) == 0) {
        exe[len - (sizeof gone - 1)] = 0;
    }
    if (!getcwd(cwd, sizeof cwd)) {
        return mmp_errorf(MMP_ERR_IO, "current directory: %s", strerror(errno));
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    /* Own process group: a terminal's Ctrl-C reaches the coordinator only,
     * which then stops the stages in order. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    /* Over ipc the token travels in the stages' environment, never in argv
     * (ps shows argv to every user; /proc/PID/environ only to the owner);
     * over tcp (other hosts) on their stdin. */
    size_t n_env = 0;
    while (environ[n_env]) {
        n_env++;
    }
    char **envp = calloc(n_env + 3, sizeof *envp);
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
    char parent_env[sizeof MMP_CTL_PARENT_ENV + 24];
    snprintf(parent_env, sizeof parent_env, "%s=%ld", MMP_CTL_PARENT_ENV, (long)getpid());
    if (!c->tcp) {
        envp[k++] = token_env;
        envp[k++] = parent_env;
    }
    /* what decides a remote stage's arithmetic, as here (launcher.h) */
    const char *fwd[8];
    mmp_launch_forward_env(environ, fwd, (int)(sizeof fwd / sizeof fwd[0]));
    mmp_err ret = MMP_OK;
    int slots = mmp_plan_slots(&c->cur);
    for (int i = 0; i < c->n; i++) {
        proc *p = &c->procs[i];
        int host = mmp_plan_slot_host(&c->cur, slots > 0 ? i % slots : 0);
        /* train.pin counts the processes of each host in order (common/pin.h) */
        int pin_index = 0;
        for (int j = 0; j < i; j++) {
            pin_index += mmp_plan_slot_host(&c->cur, slots > 0 ? j % slots : 0) == host;
        }
        const mmp_host *h = &c->cur.hosts[host];
        mmp_launch_stage ls = {.exe = exe,
                               .cwd = cwd,
                               .endpoint = c->endpoint,
                               .stage = c->sched.stages[i].name,
                               .replica = c->sched.stages[i].replica,
                               .shm_prefix = c->shm_prefix,
                               .secrets_stdin = c->tcp,
                               .pinned = c->cur.train.pin.mode != MMP_PIN_OFF,
                               .pin_index = pin_index,
                               .nice = c->nice[i],
                               .env = fwd};
        static mmp_launch_line line;
        if ((ret = mmp_launch_line_build(&line, &c->cur, host, &ls)) != MMP_OK) {
            break;
        }
        p->where[0] = 0;
        if (c->cur.launcher != MMP_LAUNCH_LOCAL) {
            snprintf(p->where, sizeof p->where, ", %s to host %s at %s",
                     c->cur.launcher == MMP_LAUNCH_SSH     ? "ssh"
                     : c->cur.launcher == MMP_LAUNCH_AGENT ? "agent"
                                                           : "srun",
                     h->name, h->address[0] ? h->address : h->name);
        }
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        int read_end = -1;
        if (c->tcp) {
            if ((ret = secrets_pipe(c, p, &fa, &read_end)) != MMP_OK) {
                posix_spawn_file_actions_destroy(&fa);
                break;
            }
        }
        /* A local stage (and an agent's relay) runs this very binary
         * (/proc/self/exe), even when the file at its path was replaced
         * since: a restart or re-placement relaunches the code the run
         * started with, not a newer build. */
        int rc = c->cur.launcher == MMP_LAUNCH_LOCAL || c->cur.launcher == MMP_LAUNCH_AGENT
                     ? posix_spawn(&p->pid, "/proc/self/exe", &fa, &attr, line.argv, envp)
                     : posix_spawnp(&p->pid, line.argv[0], &fa, &attr, line.argv, envp);
        posix_spawn_file_actions_destroy(&fa);
        if (read_end >= 0) {
            close(read_end);
        }
        if (rc != 0) {
            close_pipe(p);
            ret = mmp_errorf(MMP_ERR_IO, "spawn %s (%s): %s", p->name, line.argv[0], strerror(rc));
            break;
        }
        p->alive = 1;
        p->last_seen = mmp_now();
        MMP_INFO("started %s (pid %d%s)", p->name, (int)p->pid, p->where);
    }
    posix_spawnattr_destroy(&attr);
    free(envp);
    return ret;
}

int coord_abrupt_end(const proc *p)
{
    /* ssh exits 255 when the remote command was killed by a signal or the
     * connection was lost; srun reports a killed task as status > 128 */
    int remote = p->where[0] != 0;
    return WIFSIGNALED(p->exit_status) ||
           (remote && WIFEXITED(p->exit_status) && WEXITSTATUS(p->exit_status) >= 128);
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
            close_pipe(p);
            p->exit_status = status;
            p->reported = 0;
            c->killed |= coord_abrupt_end(p); /* stop_all's own kills are not reaped here */
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
    for (int i = 0; i < c->n; i++) {
        close_pipe(&c->procs[i]);
    }
    mmp_shm_unlink_prefix(c->shm_prefix);
}
