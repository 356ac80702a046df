/* The coordinator's control loop: files each control message from the
 * stages (checked against this run first), judges stage ends and errors,
 * waits for a condition while watching for stalls and signals, and sends.
 * The coordinator never touches a tensor. */
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
#include "common/test_hooks.h"
#include "coordinator/watchdog.h"

static int find_proc(coord *c, const char *name)
{
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->procs[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

void coord_fail(coord *c, const char *fmt, ...)
{
    if (c->failure[0]) {
        return; /* the first cause is the one to report */
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
}

/* 1234 -> "1234", 12345 -> "12.3k", 12345678 -> "12.3M" ... */
static const char *human(uint64_t v, char *buf, size_t n)
{
    if (v < 10000) {
        snprintf(buf, n, "%llu", (unsigned long long)v);
    } else if (v < 1000000) {
        snprintf(buf, n, "%.1fk", (double)v / 1e3);
    } else if (v < 1000000000) {
        snprintf(buf, n, "%.1fM", (double)v / 1e6);
    } else {
        snprintf(buf, n, "%.1fG", (double)v / 1e9);
    }
    return buf;
}

/* A start-up heartbeat (fields checked on arrival: transport/control.c) as
 * "manifest /d/train.jsonl: 12.3M of 30.0M lines". */
static void describe_startup(char *out, size_t n, const Mmpipe__Heartbeat *h)
{
    char done[32], total[32];
    const char *unit = h->unit ? h->unit : "";
    if (h->total > 0) {
        snprintf(out, n, "%s: %s of %s %s", h->phase, human(h->done, done, sizeof done),
                 human(h->total, total, sizeof total), unit);
    } else if (h->done > 0) {
        snprintf(out, n, "%s: %s %s", h->phase, human(h->done, done, sizeof done), unit);
    } else {
        snprintf(out, n, "%s", h->phase);
    }
}

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
    case MMPIPE__ENVELOPE__BODY_HELLO: {
        /* from another process: kept as printable text only, cut to size */
        const char *b = env->hello->blas ? env->hello->blas : "";
        size_t k = 0;
        for (; b[k] && k + 1 < sizeof p->blas; k++) {
            p->blas[k] = b[k] >= 0x20 && b[k] < 0x7f ? b[k] : '?';
        }
        p->blas[k] = 0;
        p->have_hello = 1;
        break;
    }
    case MMPIPE__ENVELOPE__BODY_READY:
        p->have_ready = 1;
        break;
    case MMPIPE__ENVELOPE__BODY_ENDPOINTS:
        coord_forward_endpoints(c, i, env->endpoints);
        break;
    case MMPIPE__ENVELOPE__BODY_GRAD_NORM:
        if (c->ahead && env->grad_norm->step == c->cur_step + 1 && !p->have_next_norm) {
            /* a stage already in the chained next step (steps.c) */
            p->have_next_norm = 1;
            p->next_norm_seq = ++c->norm_seq;
            p->next_sumsq = env->grad_norm->sumsq;
            break;
        }
        if (env->grad_norm->step != c->cur_step || p->have_norm) {
            coord_fail(c, "stage %s sent a gradient norm for step %d during step %d%s", p->name,
                       env->grad_norm->step + 1, c->cur_step + 1,
                       p->have_norm ? " (a second one)" : "");
            break;
        }
        p->have_norm = 1;
        p->norm_seq = ++c->norm_seq;
        p->sumsq = env->grad_norm->sumsq;
        break;
    case MMPIPE__ENVELOPE__BODY_EVAL_DONE:
        c->have_eval = 1;
        c->eval_i2t = env->eval_done->i2t_r1;
        c->eval_t2i = env->eval_done->t2i_r1;
        break;
    case MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK: {
        const Mmpipe__CheckpointAck *a = env->checkpoint_ack;
        if (!a->ok) {
            coord_fail(c, "stage %s could not write its checkpoint of step %d: %s", p->name,
                       a->step, a->error);
            break;
        }
        /* An ack for a checkpoint asked for, in order: the snapshot of the
         * newest (pending: its file follows), or a file on disk (the newest,
         * or the one before, still being written when the newest was asked). */
        int wanted = a->step == c->ckpt_req || (!a->pending && a->step == c->ckpt_pending);
        if (!wanted || (a->pending && p->have_ack) || (!a->pending && p->ckpt_written > a->step)) {
            coord_fail(c,
                       "stage %s acknowledged a checkpoint of step %d %s, which was not asked "
                       "for",
                       p->name, a->step, a->pending ? "taken" : "written");
            break;
        }
        if (a->step == c->ckpt_req) {
            p->have_ack = 1;
        }
        if (!a->pending) {
            p->ckpt_written = a->step + 1;
            p->have_on_disk = a->step == c->ckpt_req;
            coord_ckpt_publish(c);
        }
        break;
    }
    case MMPIPE__ENVELOPE__BODY_HEARTBEAT:
        if (env->heartbeat->phase && env->heartbeat->phase[0]) {
            describe_startup(p->doing, sizeof p->doing, env->heartbeat);
        }
        break;
    case MMPIPE__ENVELOPE__BODY_ERROR:
        /* Judged in settle: a stage's error is often the echo of a peer's
         * death (its channel saw the peer go). */
        if (env->error->holding) {
            p->holding = 1;
            p->held_steps = env->error->held_steps;
        }
        if (env->error->peer_lost) {
            p->peer_lost = 1;
            if (!c->peer_error[0]) {
                snprintf(c->peer_error, sizeof c->peer_error, "%s", env->error->message);
            }
        } else if (!c->stage_error[0]) {
            snprintf(c->stage_error, sizeof c->stage_error, "%s", env->error->message);
            c->stage_error_holds = env->error->holding;
        }
        break;
    default:
        MMP_WARN("unexpected message %d from %s ignored", (int)env->body_case, from);
    }
}

int coord_take_one(coord *c, int timeout_ms)
{
    Mmpipe__Envelope *env = NULL;
    char from[MMP_CTL_ID_MAX];
    mmp_err e = mmp_ctl_recv(c->ctl, timeout_ms, &env, from, sizeof from);
    if (e == MMP_ERR_TIMEOUT) {
        return 0;
    }
    if (e != MMP_OK) {
        coord_fail(c, "control plane: %s", mmp_last_error());
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
                coord_fail(c, "stage %s: step result field mb = %d, outside 0..%d", from,
                           d->mbs[k]->mb, m - 1);
                bad = 1;
            }
        }
        if (i >= 0 && !bad && d->step != c->cur_step) {
            coord_fail(c, "stage %s sent the results of step %d during step %d", from, d->step + 1,
                       c->cur_step + 1);
            bad = 1;
        }
        if (bad) {
            mmp_ctl_free(env);
            return 1;
        }
        if (i >= 0) {
            c->procs[i].have_done = 1;
            c->procs[i].in_step -= c->procs[i].in_step > 0;
            c->procs[i].steps = d->step + 1;
            c->procs[i].last_seen = c->procs[i].done_at = mmp_now();
            if (c->procs[i].done) {
                mmp_ctl_free(c->procs[i].done);
            }
            c->procs[i].done = env;
            return 1;
        }
    }
    handle(c, env, from);
    mmp_ctl_free(env);
    return 1;
}

/* How long a stage's control connection may stay dropped while its process
 * (its ssh or srun) lives on before the stage is called lost: a stage that
 * dies closes its connection first and is reaped well within this. */
#define LINK_GRACE_S 2.0

/* An end not judged yet that no report of the stage's own explains: a
 * stage that reported a peer gone and then exited on its own is that
 * peer's echo (the peer is the one to name); killed, it is not. */
static int unexplained_end(const proc *p)
{
    return !p->alive && !p->reported && (!p->peer_lost || coord_abrupt_end(p));
}

static int unexplained_ends(const coord *c)
{
    int n = 0;
    for (int i = 0; i < c->n; i++) {
        n += unexplained_end(&c->procs[i]);
    }
    return n;
}

/* Judges stage ends and errors, most telling cause first: a stage killed by
 * a signal; the first failure a stage reported of its own (a stage that exits
 * on its own sends its reason first: the control messages it sent are read
 * before its plain exit status is blamed); an exit nobody explained (a crash
 * that could not report); last, a stage's report that a peer went away. */
void coord_settle(coord *c)
{
    if (!unexplained_ends(c) && !c->stage_error[0] && !c->peer_error[0]) {
        return;
    }
    /* Give the stage at fault a moment to be reaped or to be heard: 0.3 s
     * after an end, for its reason. With only peers' reports so far, the
     * stage they saw go may be remote, whose end comes through its relay
     * (ssh, srun, an agent), later on a busy host: up to LINK_GRACE_S. */
    double t0 = mmp_now(), t_end = unexplained_ends(c) ? t0 : 0;
    while (!c->stage_error[0]) {
        double now = mmp_now();
        if (now - t0 >= (c->tcp ? LINK_GRACE_S : 0.3) || (t_end > 0 && now - t_end >= 0.3)) {
            break;
        }
        coord_take_one(c, 20);
        coord_reap(c);
        if (!unexplained_ends(c)) {
            t_end = 0; /* the end seen was a peer's echo after all */
        } else if (!t_end) {
            t_end = mmp_now();
        }
    }
    for (int signalled = 1; signalled >= 0; signalled--) {
        if (!signalled && c->stage_error[0]) {
            coord_fail(c, "%s", c->stage_error);
        }
        for (int i = 0; i < c->n; i++) {
            proc *p = &c->procs[i];
            if (unexplained_end(p) && coord_abrupt_end(p) == signalled) {
                char why[128];
                c->fault |= !c->failure[0];
                coord_fail(c, "stage %s (pid %d%s) died: %s%s", p->name, (int)p->pid, p->where,
                           coord_describe_exit(p->exit_status, why, sizeof why),
                           p->where[0] && !WIFSIGNALED(p->exit_status)
                               ? " (over ssh/srun: killed there, or its host or link was lost)"
                               : "");
            }
        }
    }
    if (c->peer_error[0]) {
        c->fault |= !c->failure[0];
        coord_fail(c, "%s", c->peer_error);
    }
    for (int i = 0; i < c->n; i++) {
        c->procs[i].reported |= !c->procs[i].alive;
    }
}

/* Over tcp: a stage whose control connection ZeroMQ dropped (its heartbeats
 * unanswered for 5 s: its host or link is gone) while the process that
 * started it lives on. ssh notices a lost host by its own keepalive; srun
 * does not (SLURM calls a node down after minutes), and without this check
 * only the stall watchdog (train.stall_timeout) would end the wait. */
static int watch_links(coord *c)
{
    /* twice a second is plenty against a 2 s grace: the loop turns once a
     * message, and a look walks every stage's entry */
    double now = mmp_now();
    if (!c->tcp || c->failure[0] || now - c->links_checked < 0.5) {
        return 0;
    }
    c->links_checked = now;
    for (int i = 0; i < c->n; i++) {
        const proc *p = &c->procs[i];
        /* Not before its hello: until then a drop under its name is its
         * predecessor's (the process a restart or re-placement replaced). */
        double t = p->alive && p->have_hello ? mmp_ctl_peer_dropped_s(c->ctl, p->name) : -1;
        if (t >= LINK_GRACE_S) {
            c->fault |= !c->failure[0];
            coord_fail(c,
                       "stage %s (pid %d%s) lost: its control connection dropped %.0f s ago "
                       "(no heartbeat answer within %d s: its host or link is down) and its "
                       "process has not ended",
                       p->name, (int)p->pid, p->where, t, MMP_CTL_HEARTBEAT_TIMEOUT_S);
            return 1;
        }
    }
    return 0;
}

/* The stall watchdog's turn (while training): names the stage to blame when
 * one the coordinator waits on has been silent for train.stall_timeout since
 * the wait began (since: a stage that finished its part of an evaluation or
 * a checkpoint long before the others is not silent, only done). */
static int watch(coord *c, done_fn done, void *arg, const char *what, double since)
{
    mmp_watch_proc w[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < c->n; i++) {
        const proc *p = &c->procs[i];
        /* Waiting on a flag: the processes without it. Waiting on the
         * norms: the stages none of whose replicas sent one. Waiting on the
         * evaluation: the fusion stage, which sends its result. */
        int awaited = done == coord_all_flag      ? !*(const int *)((const char *)p + (size_t)arg)
                      : done == coord_stage_norms ? coord_stage_norm(c, i) < 0
                                                  : c->sched.stages[i].kind == MMP_KIND_FUSION;
        w[i] = (mmp_watch_proc){.name = p->name,
                                .pid = (int)p->pid,
                                .alive = p->alive,
                                .awaited = awaited && p->have_hello,
                                .last_seen = p->last_seen > since ? p->last_seen : since};
    }
    char why[1024];
    int k = mmp_watchdog_check(w, c->n, mmp_now(), c->plan->train.stall_timeout, what,
                               "train.stall_timeout", why, sizeof why);
    if (k < 0) {
        return 0;
    }
    c->stalled = c->failure[0] ? c->stalled : k;
    c->fault |= !c->failure[0];
    coord_fail(c, "watchdog: %s", why);
    return 1;
}

/* The start-up limit: READY_SILENCE_S, or shorter for a test. */
static double ready_silence_s(void)
{
    double v = mmp_test_hook_value(MMP_HOOK_READY_SILENCE_S);
    return v > 0 && v < READY_SILENCE_S ? v : READY_SILENCE_S;
}

/* The start-up's watchdog: names a stage not ready yet that has been silent
 * (no progress heartbeat, stages/worker.c worker_startup) for the limit since
 * the wait began, with what it last reported doing. */
static int watch_startup(coord *c, double since)
{
    mmp_watch_proc w[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < c->n; i++) {
        const proc *p = &c->procs[i];
        w[i] = (mmp_watch_proc){.name = p->name,
                                .pid = (int)p->pid,
                                .alive = p->alive,
                                .awaited = !p->have_ready,
                                .last_seen = p->last_seen > since ? p->last_seen : since,
                                .doing = p->doing};
    }
    char why[1400];
    if (mmp_watchdog_check(w, c->n, mmp_now(), ready_silence_s(), "stages to be ready",
                           "the start-up silence limit", why, sizeof why) < 0) {
        return 0;
    }
    c->fault |= !c->failure[0];
    coord_fail(c, "start-up: %s", why);
    return 1;
}

/* A long start-up's progress, per stage not ready yet: once the wait is
 * READY_SHOW_S old, then at most every READY_SHOW_EVERY_S. */
static void show_startup(coord *c, double t0)
{
    double now = mmp_now();
    if (now - t0 < READY_SHOW_S) {
        return;
    }
    for (int i = 0; i < c->n; i++) {
        proc *p = &c->procs[i];
        if (!p->have_ready && p->doing[0] &&
            (p->shown == 0 || now - p->shown >= READY_SHOW_EVERY_S)) {
            MMP_INFO("starting %s: %s", p->name, p->doing);
            p->shown = now;
        }
    }
}

/* Serves the control socket until done(c) holds, a failure, or a timeout.
 * A first SIGINT/SIGTERM ends the wait only before training (a step in
 * flight is finished and checkpointed: see run_steps); a second ends it at
 * once. startup: the start-up's watchdog and progress instead of the
 * training's watchdog. Returns 0 when done. */
/* How many processes have the flag coord_all_flag(c, arg) waits for. */
static int count_flag(const coord *c, void *arg)
{
    size_t off = (size_t)arg;
    int n = 0;
    for (int i = 0; i < c->n; i++) {
        n += *(const int *)((const char *)&c->procs[i] + off) != 0;
    }
    return n;
}

static int wait_loop(coord *c, done_fn done, void *arg, double timeout_s, const char *what,
                     int startup)
{
    double t0 = mmp_now();
    /* Waiting for every process (coord_all_flag): timeout_s counts from the
     * last process that got there, not from the start. Hundreds of processes
     * starting on a few cores take longer than any fixed bound, and keep
     * arriving; one that never comes still ends the wait timeout_s after
     * the last one did. */
    int counted = done == coord_all_flag, have = counted ? count_flag(c, arg) : 0;
    double t_last = t0;
    while (!done(c, arg)) {
        if (mmp_interrupt_count() >= 2) {
            coord_fail(c, "stopped at once by a second signal");
        } else if (mmp_interrupt_signal() && !c->in_steps) {
            coord_fail(c, "interrupted by %s", strsignal(mmp_interrupt_signal()));
        }
        coord_reap(c);
        coord_settle(c);
        watch_links(c);
        if (c->tcp && c->plan->control.stop_on_refused && mmp_ctl_get_stats(c->ctl).refused > 0) {
            char why[400];
            mmp_ctl_last_refused(c->ctl, why, sizeof why);
            coord_fail(c, "control plane: %s (control.on_refused: stop)", why);
        }
        if (c->failure[0]) {
            return 1;
        }
        double now = mmp_now();
        if (counted) {
            int n = count_flag(c, arg);
            t_last = n > have ? now : t_last;
            have = n;
        }
        if (timeout_s > 0 && now - t_last > timeout_s) {
            if (counted) {
                coord_fail(c,
                           "timed out waiting for %s: %d of %d there, none more in the last "
                           "%.0f s",
                           what, have, c->n, timeout_s);
            } else {
                coord_fail(c, "timed out after %.0f s waiting for %s", timeout_s, what);
            }
            return 1;
        }
        if (c->in_steps && !startup && watch(c, done, arg, what, t0)) {
            return 1;
        }
        if (startup && watch_startup(c, t0)) {
            return 1;
        }
        if (startup) {
            show_startup(c, t0);
        }
        coord_take_one(c, 200);
    }
    /* The message that completed done() may itself have failed the run (a
     * stage's checkpoint ack saying it could not write): done, but not ok. */
    return c->failure[0] ? 1 : 0;
}

int coord_wait_until(coord *c, done_fn done, void *arg, double timeout_s, const char *what)
{
    return wait_loop(c, done, arg, timeout_s, what, 0);
}

int coord_wait_ready(coord *c)
{
    return wait_loop(c, coord_all_flag, ALL(have_ready), 0, "stages to be ready", 1);
}

int coord_all_flag(coord *c, void *arg)
{
    size_t off = (size_t)arg;
    for (int i = 0; i < c->n; i++) {
        if (!*(int *)((char *)&c->procs[i] + off)) {
            return 0;
        }
    }
    return 1;
}

int coord_stage_norm(const coord *c, int i)
{
    int best = -1;
    for (int j = 0; j < c->n; j++) {
        if (c->procs[j].have_norm &&
            strcmp(c->sched.stages[j].name, c->sched.stages[i].name) == 0 &&
            (best < 0 || c->procs[j].norm_seq < c->procs[best].norm_seq)) {
            best = j;
        }
    }
    return best;
}

int coord_stage_norms(coord *c, void *arg)
{
    (void)arg;
    for (int i = 0; i < c->n; i++) {
        if (coord_stage_norm(c, i) < 0) {
            return 0;
        }
    }
    return 1;
}

int coord_got_eval(coord *c, void *arg)
{
    (void)arg;
    return c->have_eval;
}

mmp_err coord_send_to(coord *c, int i, Mmpipe__Envelope *env)
{
    mmp_err e = mmp_ctl_send(c->ctl, c->procs[i].name, env);
    if (e != MMP_OK) {
        /* Most often the peer just died and its connection closed before its
         * end was heard: a local child is reaped within milliseconds, but a
         * remote one's end comes through its ssh, srun or agent relay, later
         * on a busy host. Wait for it (as long as a dropped link is allowed)
         * so that the death is the reported cause and a restart may follow. */
        char why[256];
        snprintf(why, sizeof why, "%s", mmp_last_error());
        double t0 = mmp_now();
        while (!c->stage_error[0] && !c->peer_error[0] && mmp_now() - t0 < LINK_GRACE_S) {
            coord_reap(c);
            if (unexplained_ends(c)) {
                break;
            }
            coord_take_one(c, 20);
        }
        coord_settle(c);
        c->fault |= !c->failure[0]; /* a stage gone from the control plane */
        coord_fail(c, "sending to %s: %s", c->procs[i].name, why);
    }
    return e;
}

mmp_err coord_broadcast(coord *c, Mmpipe__Envelope *env)
{
    for (int i = 0; i < c->n; i++) {
        MMP_TRY(coord_send_to(c, i, env));
    }
    return MMP_OK;
}
