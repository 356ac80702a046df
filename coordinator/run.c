/* Coordinator: launch, per-step control loop, metrics, checkpoints, clean-up. */
#include "coordinator/run.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/metrics.h"
#include "common/progress.h"
#include "common/trace.h"
#include "coordinator/balancer.h"
#include "coordinator/restart.h"
#include "coordinator/schedule.h"
#include "common/lr.h"
#include "coordinator/watchdog.h"
#include "transport/channel.h"
#include "transport/control.h"

extern char **environ;

#define HELLO_TIMEOUT_S 30.0
#define READY_TIMEOUT_S 120.0

typedef struct proc {
    char name[64]; /* "image.0/0" */
    pid_t pid;
    int alive;
    int exit_status;
    int reported; /* its end has been judged */
    double last_seen;
    /* per-step inbox */
    int have_norm, have_done, have_ack, have_ready, have_hello;
    double sumsq;
    Mmpipe__StepDone *done;
} proc;

typedef struct coord {
    const mmp_plan *plan; /* as launched */
    mmp_plan cur;         /* the placement running now (the balancer may change it) */
    const char *out_dir;
    char plan_json[1200];
    mmp_sched sched;
    mmp_balancer bal;
    double speed[MMP_SCHED_MAX_STAGES]; /* the routing's weights */
    int replan;                         /* run_steps stopped for a re-placement */
    mmp_plan next;                      /* ... to this placement */
    char decision[1200];                /* this step's balancer decision, JSON, or empty */
    int replan_step;                    /* steps done when it stopped for one */
    int launch;                         /* launches so far (names each one's shm) */
    int cur_step;                       /* the step running (0-based), -1 between runs */
    char token[33];
    char endpoint[128];
    char shm_prefix[64];
    mmp_ctl *ctl;
    proc procs[MMP_SCHED_MAX_STAGES];
    int n;
    int have_eval;
    float eval_i2t, eval_t2i;
    char failure[2048];
    char stage_error[2048]; /* the first Error a stage sent of its own failure (see settle) */
    char peer_error[2048];  /* the first Error that echoes a peer's end */
    FILE *metrics;
    mmp_trace trace;
    /* supervision */
    int fault;      /* the failure is a stage's death or stall: a restart may help */
    int killed;     /* a stage of this launch died by a signal we did not send */
    int in_steps;   /* stages are training (the watchdog and graceful stop apply) */
    int steps_done; /* steps completed (of the whole run) */
    int ckpt_step;  /* steps the newest checkpoint of this launch holds; -1 none */
    int stopped;    /* run_steps stopped for a signal, after checkpointing */
    mmp_restarts restarts;
} coord;

static int find_proc(coord *c, const char *name)
{
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->procs[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

static void fail(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(coord *c, const char *fmt, ...)
{
    if (c->failure[0]) {
        return; /* the first cause is the one to report */
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
}

/* ---- processes ------------------------------------------------------------------- */

static mmp_err spawn_all(coord *c)
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
        char *argv[] = {exe,      "stage",  "--connect", c->endpoint, "--stage", stage,
                        "--replica", replica, NULL};
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

static const char *describe_exit(int status, char *buf, size_t n)
{
    if (WIFSIGNALED(status)) {
        snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    } else {
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    }
    return buf;
}

/* Reaps children that ended (no judgement: see settle). Returns how many. */
static int reap(coord *c)
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

static void stop_all(coord *c, int graceful)
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
        reap(c);
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

/* ---- messages ---------------------------------------------------------------------- */

typedef int (*done_fn)(coord *c, void *arg);

static void handle(coord *c, Mmpipe__Envelope *env, const char *from)
{
    int i = find_proc(c, from);
    if (i < 0) {
        MMP_WARN("message from unknown process '%s' ignored", from);
        return;
    }
    proc *p = &c->procs[i];
    p->last_seen = mmp_now();
    switch (env->body_case) {
    case MMPIPE__ENVELOPE__BODY_HELLO: p->have_hello = 1; break;
    case MMPIPE__ENVELOPE__BODY_READY: p->have_ready = 1; break;
    case MMPIPE__ENVELOPE__BODY_GRAD_NORM:
        if (env->grad_norm->step != c->cur_step) {
            fail(c, "stage %s sent a gradient norm for step %d during step %d", p->name,
                 env->grad_norm->step + 1, c->cur_step + 1);
            break;
        }
        p->have_norm = 1;
        p->sumsq = env->grad_norm->sumsq;
        break;
    case MMPIPE__ENVELOPE__BODY_EVAL_DONE:
        c->have_eval = 1;
        c->eval_i2t = env->eval_done->i2t_r1;
        c->eval_t2i = env->eval_done->t2i_r1;
        break;
    case MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK:
        p->have_ack = 1;
        if (!env->checkpoint_ack->ok) {
            fail(c, "stage %s could not write its checkpoint: %s", p->name,
                 env->checkpoint_ack->error);
        }
        break;
    case MMPIPE__ENVELOPE__BODY_HEARTBEAT: break;
    case MMPIPE__ENVELOPE__BODY_ERROR:
        /* Judged in settle: a stage's error is often the echo of a peer's
         * death (its channel saw the peer go). */
        if (env->error->peer_lost) {
            if (!c->peer_error[0]) {
                snprintf(c->peer_error, sizeof c->peer_error, "%s", env->error->message);
            }
        } else if (!c->stage_error[0]) {
            snprintf(c->stage_error, sizeof c->stage_error, "%s", env->error->message);
        }
        break;
    default: MMP_WARN("unexpected message %d from %s ignored", (int)env->body_case, from);
    }
}

/* Takes one control message (waiting up to timeout_ms) and files it.
 * Returns 1 when one was taken. */
static int take_one(coord *c, int timeout_ms)
{
    Mmpipe__Envelope *env = NULL;
    char from[MMP_CTL_ID_MAX];
    mmp_err e = mmp_ctl_recv(c->ctl, timeout_ms, &env, from, sizeof from);
    if (e == MMP_ERR_TIMEOUT) {
        return 0;
    }
    if (e != MMP_OK) {
        fail(c, "control plane: %s", mmp_last_error());
        return 0;
    }
    if (env->body_case == MMPIPE__ENVELOPE__BODY_STEP_DONE) {
        /* StepDone is kept (the envelope owns it) until the step's metrics are written. */
        int i = find_proc(c, from);
        /* Fields checked against this run (mmp_ctl_decode did the rest). */
        const Mmpipe__StepDone *d = env->step_done;
        int m = c->sched.microbatches, bad = 0;
        for (size_t k = 0; i >= 0 && !bad && k < d->n_mbs; k++) {
            if (d->mbs[k]->mb >= m) {
                fail(c, "stage %s: step result field mb = %d, outside 0..%d", from, d->mbs[k]->mb,
                     m - 1);
                bad = 1;
            }
        }
        if (i >= 0 && !bad && d->step != c->cur_step) {
            fail(c, "stage %s sent the results of step %d during step %d", from, d->step + 1,
                 c->cur_step + 1);
            bad = 1;
        }
        if (bad) {
            mmp_ctl_free(env);
            return 1;
        }
        if (i >= 0) {
            c->procs[i].have_done = 1;
            c->procs[i].last_seen = mmp_now();
            if (c->procs[i].done) {
                mmp_ctl_free((Mmpipe__Envelope *)c->procs[i].done);
            }
            c->procs[i].done = (Mmpipe__StepDone *)env;
            return 1;
        }
    }
    handle(c, env, from);
    mmp_ctl_free(env);
    return 1;
}

/* Judges stage ends and errors, most telling cause first: a stage killed by
 * a signal; the first failure a stage reported of its own (a stage that exits
 * on its own sends its reason first: the control messages it sent are read
 * before its plain exit status is blamed); an exit nobody explained (a crash
 * that could not report); last, a stage's report that a peer went away. */
static void settle(coord *c)
{
    int dead = 0;
    for (int i = 0; i < c->n; i++) {
        dead += !c->procs[i].alive && !c->procs[i].reported;
    }
    if (!dead && !c->stage_error[0] && !c->peer_error[0]) {
        return;
    }
    if (!c->stage_error[0]) {
        /* Give the stage at fault a moment to be reaped or to be heard. */
        double t0 = mmp_now();
        while (!c->stage_error[0] && mmp_now() - t0 < 0.3) {
            take_one(c, 20);
            reap(c);
        }
    }
    for (int signalled = 1; signalled >= 0; signalled--) {
        if (!signalled && c->stage_error[0]) {
            fail(c, "%s", c->stage_error);
        }
        for (int i = 0; i < c->n; i++) {
            proc *p = &c->procs[i];
            if (!p->alive && !p->reported && WIFSIGNALED(p->exit_status) == signalled) {
                char why[128];
                c->fault |= !c->failure[0];
                fail(c, "stage %s (pid %d) died: %s", p->name, (int)p->pid,
                     describe_exit(p->exit_status, why, sizeof why));
            }
        }
    }
    if (c->peer_error[0]) {
        c->fault |= !c->failure[0];
        fail(c, "%s", c->peer_error);
    }
    for (int i = 0; i < c->n; i++) {
        c->procs[i].reported |= !c->procs[i].alive;
    }
}

static int all_flag(coord *c, void *arg);

/* The stall watchdog's turn (while training): names the stage to blame when
 * one the coordinator waits on has been silent for train.stall_timeout. */
static int watch(coord *c, done_fn done, void *arg, const char *what)
{
    mmp_watch_proc w[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < c->n; i++) {
        const proc *p = &c->procs[i];
        /* Waiting on a flag: the processes without it. Waiting on the
         * evaluation: the fusion stage, which sends its result. */
        int awaited = done == all_flag ? !*(const int *)((const char *)p + (size_t)arg)
                                       : c->sched.stages[i].kind == MMP_KIND_FUSION;
        w[i] = (mmp_watch_proc){.name = p->name,
                                .pid = (int)p->pid,
                                .alive = p->alive,
                                .awaited = awaited && p->have_hello,
                                .last_seen = p->last_seen};
    }
    char why[1024];
    if (mmp_watchdog_check(w, c->n, mmp_now(), c->plan->train.stall_timeout, what, why,
                           sizeof why) < 0) {
        return 0;
    }
    c->fault |= !c->failure[0];
    fail(c, "watchdog: %s", why);
    return 1;
}

/* Serves the control socket until done(c) holds, a failure, or a timeout.
 * A first SIGINT/SIGTERM ends the wait only before training (a step in
 * flight is finished and checkpointed: see run_steps); a second ends it at
 * once. Returns 0 when done. */
static int wait_until(coord *c, done_fn done, void *arg, double timeout_s, const char *what)
{
    double t0 = mmp_now();
    while (!done(c, arg)) {
        if (mmp_interrupt_count() >= 2) {
            fail(c, "stopped at once by a second signal");
        } else if (mmp_interrupt_signal() && !c->in_steps) {
            fail(c, "interrupted by %s", strsignal(mmp_interrupt_signal()));
        }
        reap(c);
        settle(c);
        if (c->failure[0]) {
            return 1;
        }
        double now = mmp_now();
        if (timeout_s > 0 && now - t0 > timeout_s) {
            fail(c, "timed out after %.0f s waiting for %s", timeout_s, what);
            return 1;
        }
        if (c->in_steps && watch(c, done, arg, what)) {
            return 1;
        }
        take_one(c, 200);
    }
    return 0;
}

static int all_flag(coord *c, void *arg)
{
    size_t off = (size_t)arg;
    for (int i = 0; i < c->n; i++) {
        if (!*(int *)((char *)&c->procs[i] + off)) {
            return 0;
        }
    }
    return 1;
}

static int got_eval(coord *c, void *arg)
{
    (void)arg;
    return c->have_eval;
}

#define ALL(field) ((void *)offsetof(proc, field))

static mmp_err send_to(coord *c, int i, Mmpipe__Envelope *env)
{
    mmp_err e = mmp_ctl_send(c->ctl, c->procs[i].name, env);
    if (e != MMP_OK) {
        /* Most often the peer just died: let its death be the reported cause. */
        usleep(50000);
        reap(c);
        settle(c);
        fail(c, "sending to %s: %s", c->procs[i].name, mmp_last_error());
    }
    return e;
}

static mmp_err broadcast(coord *c, Mmpipe__Envelope *env)
{
    for (int i = 0; i < c->n; i++) {
        MMP_TRY(send_to(c, i, env));
    }
    return MMP_OK;
}

/* ---- assignments --------------------------------------------------------------------- */

/* Stage st's list as protobuf instructions: *ins (the messages) and *insp
 * (pointers to them), both for the caller to free. */
static mmp_err program_msg(const mmp_sched_stage *st, Mmpipe__Instr **ins, Mmpipe__Instr ***insp)
{
    *ins = calloc((size_t)st->n_prog + 1, sizeof **ins);
    *insp = calloc((size_t)st->n_prog + 1, sizeof **insp);
    if (!*ins || !*insp) {
        free(*ins);
        free(*insp);
        return mmp_errorf(MMP_ERR_NOMEM, "instruction list of %d", st->n_prog);
    }
    for (int k = 0; k < st->n_prog; k++) {
        mmpipe__instr__init(&(*ins)[k]);
        (*ins)[k].op = (Mmpipe__Op)st->prog[k].op;
        (*ins)[k].mb = st->prog[k].mb;
        (*ins)[k].edge = st->prog[k].edge;
        (*insp)[k] = &(*ins)[k];
    }
    return MMP_OK;
}

static mmp_err assign(coord *c, const char *plan_json, const char *resume_dir)
{
    const mmp_sched *s = &c->sched;
    for (int i = 0; i < c->n; i++) {
        const mmp_sched_stage *st = &s->stages[i];
        Mmpipe__Channel chans[MMP_SCHED_MAX_EDGES], *chp[MMP_SCHED_MAX_EDGES];
        char addr[MMP_SCHED_MAX_EDGES][96], peer[MMP_SCHED_MAX_EDGES][64];
        int nc = 0;
        for (int e = 0; e < s->n_edges; e++) {
            const mmp_sched_edge *ed = &s->edges[e];
            if (ed->from != i && ed->to != i) {
                continue;
            }
            Mmpipe__Channel *ch = &chans[nc];
            mmpipe__channel__init(ch);
            ch->id = e;
            ch->send = ed->from == i;
            ch->grad = ed->grad;
            snprintf(peer[nc], sizeof peer[nc], "%s", c->procs[ch->send ? ed->to : ed->from].name);
            ch->peer = peer[nc];
            ch->transport = "shm";
            snprintf(addr[nc], sizeof addr[nc], "%s-g%d-e%d", c->shm_prefix, c->launch, e);
            ch->address = addr[nc];
            ch->slots = ed->slots;
            ch->creator = ch->send; /* the sender creates and sizes the ring */
            chp[nc] = ch;
            nc++;
        }
        Mmpipe__Instr *ins, **insp;
        MMP_TRY(program_msg(st, &ins, &insp));
        Mmpipe__Assignment a = MMPIPE__ASSIGNMENT__INIT;
        char kind[16], ckpt_file[80];
        snprintf(kind, sizeof kind, "%s",
                 st->kind == MMP_KIND_IMAGE ? "image" : st->kind == MMP_KIND_TEXT ? "text" : "fusion");
        /* One checkpoint file per process; a branch cut into sub-stages
         * names them image.0.ckpt ..., a whole branch image.ckpt, so a
         * pipeline's checkpoint reads like the single-process one. */
        if (st->n_sub > 1) {
            snprintf(ckpt_file, sizeof ckpt_file, "%s.ckpt", st->name);
        } else {
            snprintf(ckpt_file, sizeof ckpt_file, "%s.ckpt", kind);
        }
        char reduce[128];
        snprintf(reduce, sizeof reduce, "%s-g%d-r-%s", c->shm_prefix, c->launch, st->name);
        int slots = mmp_plan_slots(&c->cur);
        a.name = c->procs[i].name;
        a.kind = kind;
        a.sub = st->sub;
        a.replica = st->replica;
        a.replicas = st->n_replicas;
        a.reduce_address = reduce;
        a.slot = slots > 0 ? i % slots : 0;
        a.inflight_bound = st->stage_bound;
        a.layer_first = st->layer_first;
        a.layer_last = st->layer_last;
        a.plan_path = (char *)plan_json;
        a.run_dir = (char *)c->out_dir;
        a.n_channels = (size_t)nc;
        a.channels = chp;
        a.n_program = (size_t)st->n_prog;
        a.program = insp;
        a.microbatches = s->microbatches;
        a.ckpt_file = ckpt_file;
        a.resume_dir = (char *)(resume_dir ? resume_dir : "");
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_ASSIGNMENT;
        env.assignment = &a;
        mmp_err e = send_to(c, i, &env);
        free(ins);
        free(insp);
        MMP_TRY(e);
    }
    return MMP_OK;
}

/* ---- per step -------------------------------------------------------------------------- */

static const Mmpipe__StepDone *done_of(const coord *c, int i)
{
    return ((const Mmpipe__Envelope *)c->procs[i].done)->step_done;
}

static void write_metrics(coord *c, int step, double step_ms, double grad_norm, int eval)
{
    const mmp_plan *p = c->plan;
    double loss = 0, itc = 0, itm = 0, idle = 0, wall = 0, data = 0;
    int skipped = 0;
    for (int i = 0; i < c->n; i++) {
        const Mmpipe__StepDone *d = done_of(c, i);
        if (c->sched.stages[i].kind == MMP_KIND_FUSION) {
            /* Each fusion replica sums its micro-batches' losses, already
             * divided by the global batch: the step's loss is their sum. */
            loss += d->loss;
            itc += d->itc;
            itm += d->itm;
            skipped += d->skipped;
        }
        idle += d->idle_ms;
        wall += d->wall_ms;
        data = fmax(data, d->data_ms);
    }
    FILE *f = c->metrics;
    fprintf(f,
            "{\"step\":%d,\"loss\":%.6g,\"itc_loss\":%.6g,\"itm_loss\":%.6g,\"lr\":%.6g,"
            "\"grad_norm\":%.6g,\"samples_per_s\":%.4g,\"step_ms\":%.4g,\"data_ms\":%.4g,"
            "\"skipped_samples\":%d,\"bubble\":%.4f,\"stages\":[",
            step + 1, loss, itc, itm, (double)mmp_lr_at(p, step), grad_norm,
            p->train.batch / (step_ms / 1e3), step_ms, data, skipped, wall > 0 ? idle / wall : 0);
    for (int i = 0; i < c->n; i++) {
        const Mmpipe__StepDone *d = done_of(c, i);
        double fwd = 0, bwd = 0;
        for (size_t k = 0; k < d->n_mbs; k++) {
            fwd += d->mbs[k]->fwd_ms;
            bwd += d->mbs[k]->bwd_ms;
        }
        double m = d->n_mbs ? (double)d->n_mbs : 1;
        fprintf(f,
                "%s{\"name\":\"%s\",\"replica\":%d,\"microbatches\":%d,\"busy_ms\":%.4g,"
                "\"idle_ms\":%.4g,\"wall_ms\":%.4g,\"data_wait_ms\":%.4g,\"fwd_ms\":%.4g,"
                "\"bwd_ms\":%.4g,\"load_ms\":%.4g,"
                "\"max_inflight\":%d,\"peak_mem_bytes\":%llu}",
                i ? "," : "", c->sched.stages[i].name, c->sched.stages[i].replica,
                (int)d->n_mbs, d->busy_ms, d->idle_ms, d->wall_ms, d->data_ms, fwd / m, bwd / m,
                d->data_ms / m, d->max_inflight, (unsigned long long)d->peak_mem_bytes);
    }
    char placement[1024];
    fprintf(f, "],\"balance\":{\"efficiency\":%.4f,\"placement\":\"%s\",\"decision\":%s}",
            c->bal.efficiency, mmp_placement_str(&c->sched, placement, sizeof placement),
            c->decision[0] ? c->decision : "null");
    if (eval) {
        fprintf(f, ",\"val_i2t_r1\":%.4f,\"val_t2i_r1\":%.4f", (double)c->eval_i2t,
                (double)c->eval_t2i);
    }
    mmp_restart_write_field(&c->restarts, f, step + 1);
    fprintf(f, "}\n");
    fflush(f);
}

static int checkpoint(coord *c, int steps_done)
{
    char dir[1100];
    mmp_ckpt_step_dir(dir, sizeof dir, c->out_dir, steps_done);
    if (mmp_mkdirs(dir) != MMP_OK) {
        fail(c, "%s", mmp_last_error());
        return 1;
    }
    for (int i = 0; i < c->n; i++) {
        c->procs[i].have_ack = 0;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__CheckpointRequest r = MMPIPE__CHECKPOINT_REQUEST__INIT;
    r.step = steps_done;
    r.dir = dir;
    env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST;
    env.checkpoint_request = &r;
    if (broadcast(c, &env) != MMP_OK || wait_until(c, all_flag, ALL(have_ack), 600, "checkpoint acks")) {
        return 1;
    }
    /* latest moves only after every stage acknowledged its file. */
    if (mmp_ckpt_write_meta(dir, steps_done, c->plan) != MMP_OK ||
        mmp_ckpt_mark_latest(c->out_dir, steps_done) != MMP_OK ||
        mmp_ckpt_prune(c->out_dir, steps_done, c->plan->train.ckpt_keep) != MMP_OK) {
        fail(c, "checkpoint: %s", mmp_last_error());
        return 1;
    }
    mmp_trace_instant(&c->trace, "checkpoint", mmp_trace_now_us(), dir);
    c->ckpt_step = steps_done;
    return 0;
}

/* Sends every process its list under the routing c->speed, from step on. */
static int reroute(coord *c, int step)
{
    mmp_sched next;
    if (mmp_sched_compile_routed(&next, &c->cur, c->speed) != MMP_OK) {
        fail(c, "re-routing: %s", mmp_last_error());
        mmp_sched_fini(&next);
        return 1;
    }
    for (int i = 0; i < c->n; i++) {
        const mmp_sched_stage *st = &next.stages[i];
        Mmpipe__Instr *ins, **insp;
        if (program_msg(st, &ins, &insp) != MMP_OK) {
            fail(c, "re-routing: %s", mmp_last_error());
            mmp_sched_fini(&next);
            return 1;
        }
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Program pr = MMPIPE__PROGRAM__INIT;
        pr.first_step = step;
        pr.n_program = (size_t)st->n_prog;
        pr.program = insp;
        env.body_case = MMPIPE__ENVELOPE__BODY_PROGRAM;
        env.program = &pr;
        mmp_err e = send_to(c, i, &env);
        free(ins);
        free(insp);
        if (e != MMP_OK) {
            mmp_sched_fini(&next);
            return 1;
        }
    }
    mmp_sched_fini(&c->sched);
    c->sched = next;
    c->bal.sched = &c->sched;
    mmp_balancer_routed(&c->bal, c->speed);
    return 0;
}

/* The balancer's turn after step `done`: feeds it the step's reports, and
 * re-routes now or asks for a re-placement (c->replan). Fills c->decision. */
static int balance(coord *c, int done, double step_ms)
{
    mmp_bal_proc bp[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < c->n; i++) {
        const Mmpipe__StepDone *d = done_of(c, i);
        bp[i] = (mmp_bal_proc){.busy_ms = d->busy_ms};
        for (size_t k = 0; k < d->n_mbs; k++) {
            bp[i].fwd_ms += d->mbs[k]->fwd_ms;
            bp[i].bwd_ms += d->mbs[k]->bwd_ms;
            bp[i].samples += mmp_plan_mb_size(c->plan, d->mbs[k]->mb);
        }
    }
    mmp_balancer_observe(&c->bal, bp, step_ms);
    c->decision[0] = 0;
    char why[1024], esc[1100];
    double gain;
    int go = 0;
    if (done < c->plan->job.steps &&
        mmp_balancer_replan(&c->bal, done, &c->next, &go, why, sizeof why, &gain) != MMP_OK) {
        fail(c, "balancer: %s", mmp_last_error());
        return 1;
    }
    if (go) {
        mmp_sched probe;
        mmp_err e = mmp_sched_compile(&probe, &c->next);
        char to[1024] = "";
        if (e == MMP_OK) {
            mmp_placement_str(&probe, to, sizeof to);
        }
        mmp_sched_fini(&probe);
        if (e != MMP_OK) {
            fail(c, "balancer: the new placement does not compile: %s", mmp_last_error());
            return 1;
        }
        char g[32];
        snprintf(g, sizeof g, isfinite(gain) ? "%.4f" : "null", gain);
        snprintf(c->decision, sizeof c->decision,
                 "{\"action\":\"replace\",\"to\":\"%s\",\"predicted_gain\":%s,\"reason\":\"%s\"}",
                 to, g, mmp_json_escape(why, esc, sizeof esc));
        MMP_INFO("balancer: after step %d, re-placing to %s: %s", done, to, why);
        mmp_trace_instant(&c->trace, "re-place", mmp_trace_now_us(), to);
        c->replan = 1;
        return 0;
    }
    double speed[MMP_SCHED_MAX_STAGES];
    if (done < c->plan->job.steps && mmp_balancer_route(&c->bal, speed, why, sizeof why)) {
        memcpy(c->speed, speed, sizeof speed);
        if (reroute(c, done)) {
            return 1;
        }
        snprintf(c->decision, sizeof c->decision, "{\"action\":\"route\",\"reason\":\"%s\"}",
                 mmp_json_escape(why, esc, sizeof esc));
        MMP_INFO("balancer: after step %d, routing by %s", done, why);
        mmp_trace_instant(&c->trace, "re-route", mmp_trace_now_us(), why);
    }
    return 0;
}

/* Runs steps from first_step; returns 0 at the end, when the balancer asks
 * for a re-placement (c->replan, after checkpointing) or when a signal asked
 * to stop (c->stopped, after finishing the step in flight and checkpointing
 * it), 1 on a failure. */
static int run_steps(coord *c, int first_step)
{
    const mmp_plan *p = c->plan;
    mmp_progress progress;
    mmp_progress_init(&progress, p->job.steps, 10);
    c->in_steps = 1;
    for (int step = first_step; step < p->job.steps; step++) {
        if (step == first_step && mmp_interrupt_signal()) {
            c->stopped = 1; /* nothing trained since the state this launch started from */
            break;
        }
        double t0 = mmp_now();
        c->cur_step = step;
        for (int i = 0; i < c->n; i++) {
            c->procs[i].have_norm = c->procs[i].have_done = 0;
        }
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Start st = MMPIPE__START__INIT;
        st.first_step = step;
        st.steps = 1;
        env.body_case = MMPIPE__ENVELOPE__BODY_START;
        env.start = &st;
        if (broadcast(c, &env) != MMP_OK ||
            wait_until(c, all_flag, ALL(have_norm), 0, "gradient norms")) {
            break;
        }
        /* Sum in stage order (image, text, fusion), as the single process
         * does; replicas hold the same reduced gradients: replica 0 counts. */
        double sumsq = 0;
        for (int i = 0; i < c->n; i++) {
            if (c->sched.stages[i].replica == 0) {
                sumsq += c->procs[i].sumsq;
            }
        }
        double norm = sqrt(sumsq);
        if (!isfinite(norm)) {
            fail(c, "step %d: gradient norm is not finite", step + 1);
            break;
        }
        Mmpipe__Envelope cenv = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Clip clip = MMPIPE__CLIP__INIT;
        clip.step = step;
        clip.coef = mmp_clip_coef(p, norm);
        cenv.body_case = MMPIPE__ENVELOPE__BODY_CLIP;
        cenv.clip = &clip;
        if (broadcast(c, &cenv) != MMP_OK ||
            wait_until(c, all_flag, ALL(have_done), 0, "step results")) {
            break;
        }
        double step_ms = (mmp_now() - t0) * 1e3;
        int done = step + 1;
        int eval = mmp_plan_eval_due(p, done);
        if (eval) {
            c->have_eval = 0;
            Mmpipe__Envelope eenv = MMPIPE__ENVELOPE__INIT;
            Mmpipe__EvalRequest er = MMPIPE__EVAL_REQUEST__INIT;
            er.step = step;
            eenv.body_case = MMPIPE__ENVELOPE__BODY_EVAL_REQUEST;
            eenv.eval_request = &er;
            if (broadcast(c, &eenv) != MMP_OK ||
                wait_until(c, got_eval, NULL, 600, "evaluation")) {
                break;
            }
        }
        if (balance(c, done, step_ms)) {
            break;
        }
        write_metrics(c, step, step_ms, norm, eval);
        if (eval) {
            mmp_progress_end(&progress);
            MMP_INFO("step %d: val recall@1 image->text %.3f, text->image %.3f", done,
                     (double)c->eval_i2t, (double)c->eval_t2i);
        }
        if ((p->train.ckpt_every > 0 && done % p->train.ckpt_every == 0) || done == p->job.steps ||
            c->replan) {
            if (checkpoint(c, done)) {
                break;
            }
        }
        double lsum = 0;
        for (int i = 0; i < c->n; i++) {
            if (c->sched.stages[i].kind == MMP_KIND_FUSION) {
                lsum += done_of(c, i)->loss;
            }
        }
        char text[256];
        snprintf(text, sizeof text, "loss %.4f  %.0f samples/s  efficiency %.2f", lsum,
                 p->train.batch / (step_ms / 1e3), c->bal.efficiency);
        mmp_progress_update(&progress, done, text);
        c->steps_done = done;
        if (c->replan) {
            c->replan_step = done;
            break;
        }
        if (mmp_interrupt_signal() && done < p->job.steps) {
            mmp_progress_end(&progress);
            MMP_INFO("%s: step %d finished; checkpointing and stopping (a second signal stops "
                     "at once)",
                     strsignal(mmp_interrupt_signal()), done);
            if (c->ckpt_step != done && checkpoint(c, done)) {
                break;
            }
            c->stopped = 1;
            break;
        }
    }
    c->in_steps = 0;
    mmp_progress_end(&progress);
    return c->failure[0] ? 1 : 0;
}

/* ---- entry --------------------------------------------------------------------------------- */

/* One launch of the current placement: compile, spawn, hello, assign, ready,
 * run; stops the stages. Returns 0 when the run ended or a re-placement is
 * due (c->replan), 1 on a failure. */
static int launch(coord *c, int first_step, const char *resume_dir)
{
    if (mmp_sched_compile(&c->sched, &c->cur) != MMP_OK) {
        fail(c, "%s", mmp_last_error());
        return 1;
    }
    c->n = c->sched.n_stages;
    memset(c->procs, 0, sizeof c->procs);
    for (int i = 0; i < c->n; i++) {
        snprintf(c->procs[i].name, sizeof c->procs[i].name, "%s", c->sched.stages[i].proc);
        c->speed[i] = 1;
    }
    mmp_balancer_reset(&c->bal, &c->cur, &c->sched, c->plan_json);
    c->replan = 0;
    c->ckpt_step = -1;
    c->killed = 0;
    char note[96];
    snprintf(note, sizeof note, "launch %d from step %d", c->launch, first_step);
    mmp_trace_instant(&c->trace, "launch", mmp_trace_now_us(), note);
    if (spawn_all(c) != MMP_OK) {
        fail(c, "%s", mmp_last_error());
        return 1;
    }
    char placement[1024];
    MMP_INFO("%d stage processes (%s), schedule %s, %d micro-batches; run directory %s; shared "
             "memory %s-*",
             c->n, mmp_placement_str(&c->sched, placement, sizeof placement),
             mmp_schedule_name(c->cur.train.schedule), c->cur.train.microbatches, c->out_dir,
             c->shm_prefix);
    if (wait_until(c, all_flag, ALL(have_hello), HELLO_TIMEOUT_S, "stage processes to connect") ||
        assign(c, c->plan_json, resume_dir) != MMP_OK ||
        wait_until(c, all_flag, ALL(have_ready), READY_TIMEOUT_S, "stages to be ready") ||
        run_steps(c, first_step) != 0) {
        return 1;
    }
    stop_all(c, 1);
    return 0;
}

static void free_dones(coord *c)
{
    for (int i = 0; i < c->n; i++) {
        if (c->procs[i].done) {
            mmp_ctl_free((Mmpipe__Envelope *)c->procs[i].done);
            c->procs[i].done = NULL;
        }
    }
}

/* Whether the failure that ended a launch calls for a restart: a stage died
 * or stalled (not a stage's own reported error, not a signal to us), and
 * restarts are left. */
static int should_restart(const coord *c)
{
    return (c->fault || c->killed) && c->restarts.n < c->plan->train.max_restarts &&
           c->restarts.n < MMP_RESTART_MAX && !mmp_interrupt_signal();
}

/* After a fault: stops what is left of the launch (shared memory removed),
 * drops the control messages its processes left, and rewinds the records to
 * the newest checkpoint (coordinator/restart.h; the trace keeps everything
 * and marks the restart). Sets *first_step and resume_dir (empty: from the
 * start) for the relaunch. Returns 0, or 1 when the run cannot go on
 * (c->failure says why). */
static int prepare_restart(coord *c, int *first_step, char *resume_dir, size_t n)
{
    char cause[sizeof c->failure], esc[1100], note[1300];
    snprintf(cause, sizeof cause, "%s", c->failure);
    stop_all(c, 0);
    Mmpipe__Envelope *env;
    char from_id[MMP_CTL_ID_MAX];
    while (mmp_ctl_recv(c->ctl, 50, &env, from_id, sizeof from_id) == MMP_OK) {
        mmp_ctl_free(env); /* from the stopped processes: stale */
    }
    free_dones(c);
    mmp_sched_fini(&c->sched);
    c->failure[0] = c->stage_error[0] = c->peer_error[0] = 0;
    c->fault = 0;
    if (mmp_restart_rewind(&c->restarts, c->out_dir, c->steps_done, cause, first_step, resume_dir,
                           n, &c->metrics) != MMP_OK) {
        fail(c, "cannot restart: %s", mmp_last_error());
        return 1;
    }
    MMP_WARN("restart %d of %d after step %d: %s; relaunching every stage from step %d",
             c->restarts.n, c->plan->train.max_restarts, c->steps_done, cause, *first_step);
    snprintf(note, sizeof note, "restart %d from step %d: %s", c->restarts.n, *first_step,
             mmp_json_escape(cause, esc, sizeof esc));
    mmp_trace_instant(&c->trace, "restart", mmp_trace_now_us(), note);
    c->steps_done = *first_step;
    return 0;
}

/* Says how a run stopped by a signal goes on. */
static void say_how_to_resume(const coord *c)
{
    char dir[1200];
    int step;
    if (mmp_ckpt_latest(c->out_dir, dir, sizeof dir, &step) != MMP_OK) {
        MMP_INFO("stopped by %s before any checkpoint: nothing to resume",
                 strsignal(mmp_interrupt_signal()));
        return;
    }
    MMP_INFO("stopped by %s; checkpoint %s (step %d of %d)", strsignal(mmp_interrupt_signal()), dir,
             step, c->plan->job.steps);
    MMP_INFO("resume with: mmpipe launch %s --resume %s", c->plan_json, c->out_dir);
}

int mmp_coord_run(const mmp_plan *plan, const char *out_dir, int resume)
{
    static coord c;
    memset(&c, 0, sizeof c);
    c.cur_step = -1;
    c.plan = plan;
    c.cur = *plan;
    c.out_dir = out_dir;
    int rc = 1, first_step = 0;
    char resume_dir[1200] = "";
    mmp_log_set_name("coordinator");
    if (mmp_plan_check_runnable(plan) != MMP_OK || mmp_sched_compile(&c.sched, plan) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        return 1;
    }
    mmp_sched_fini(&c.sched);
    if (resume) {
        if (mmp_ckpt_latest(out_dir, resume_dir, sizeof resume_dir, &first_step) != MMP_OK) {
            MMP_ERROR("%s", mmp_last_error());
            goto out;
        }
        MMP_INFO("resuming %s at step %d of %d", out_dir, first_step, plan->job.steps);
    }
    if (mmp_ctl_new_token(c.token) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    /* Socket and shm names are public (/proc/net/unix, /dev/shm): they come
     * from a second random id, never from the token. */
    char run_id[33];
    if (mmp_ctl_new_token(run_id) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    snprintf(c.endpoint, sizeof c.endpoint, "ipc://@mmpipe-%d-%.16s", (int)getpid(), run_id);
    snprintf(c.shm_prefix, sizeof c.shm_prefix, "/mmpipe-%.12s", run_id);
    snprintf(c.plan_json, sizeof c.plan_json, "%s/plan.json", out_dir);
    char trace_path[1200];
    snprintf(trace_path, sizeof trace_path, "%s/trace.json", out_dir);
    if (!resume) {
        unlink(trace_path); /* a new run's trace starts empty; a resumed one appends */
    }
    c.steps_done = first_step;
    /* One part file per coordinator process: a killed one's part, left for
     * the resumed run to merge, is not overwritten. */
    char coord_tag[48];
    snprintf(coord_tag, sizeof coord_tag, "coordinator.p%d", (int)getpid());
    if (mmp_plan_write_json(plan, c.plan_json) != MMP_OK ||
        mmp_metrics_continue(out_dir, resume ? first_step : -1, &c.metrics) != MMP_OK ||
        mmp_trace_open(&c.trace, out_dir, coord_tag, 0, "coordinator") != MMP_OK ||
        mmp_ctl_bind(&c.ctl, c.endpoint, c.token) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    if (plan->balance.force.step > 0) {
        /* A scripted re-placement is checked now, not when it is due. */
        if (mmp_balancer_forced_plan(plan, c.plan_json, &c.next) != MMP_OK) {
            MMP_ERROR("%s", mmp_last_error());
            goto out;
        }
    }
    mmp_interrupt_install(0);
    for (;;) {
        c.launch++;
        int bad = launch(&c, first_step, resume_dir[0] ? resume_dir : NULL);
        if (bad) {
            if (should_restart(&c) &&
                prepare_restart(&c, &first_step, resume_dir, sizeof resume_dir) == 0) {
                continue;
            }
            break;
        }
        if (c.stopped) {
            rc = mmp_interrupt_status();
            say_how_to_resume(&c);
            goto out;
        }
        if (!c.replan) {
            rc = 0;
            MMP_INFO("done: %d steps; checkpoint %s/ckpt/latest", plan->job.steps, out_dir);
            if (c.restarts.n) {
                MMP_INFO("%d restart%s (see \"restarts\" in metrics.jsonl)", c.restarts.n,
                         c.restarts.n == 1 ? "" : "s");
            }
            goto out;
        }
        /* Re-placement: the stages stopped after checkpointing step
         * replan_step; the new placement resumes from it. */
        free_dones(&c);
        mmp_sched_fini(&c.sched);
        c.cur = c.next;
        first_step = c.replan_step;
        mmp_ckpt_step_dir(resume_dir, sizeof resume_dir, out_dir, first_step);
    }
    stop_all(&c, 0);
    MMP_ERROR("%s", c.failure[0] ? c.failure : mmp_last_error());
    if (mmp_interrupt_signal()) {
        rc = mmp_interrupt_status();
        say_how_to_resume(&c);
    } else if (c.restarts.n > 0 && c.restarts.n >= c.plan->train.max_restarts) {
        MMP_ERROR("no restart left: %d of train.max_restarts %d used", c.restarts.n,
                  c.plan->train.max_restarts);
    }
out:
    free_dones(&c);
    mmp_ctl_close(c.ctl);
    mmp_trace_close(&c.trace);
    if (c.metrics) {
        fclose(c.metrics);
    }
    mmp_trace_merge(out_dir);
    mmp_sched_fini(&c.sched);
    return rc;
}
