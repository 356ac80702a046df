/* Keeping what a failed launch trained (coordinator/coord.h
 * coord_keep_held): when the failure leaves the trained state whole (a bad
 * sample its stage holds for, a lost or stalled replica whose siblings live
 * on), every live stage holds the last finished step (stages/worker.c hold)
 * and that step becomes a checkpoint, so a restart or a --resume goes on
 * from it instead of the last periodic one. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "common/ckpt.h"
#include "common/interrupt.h"
#include "common/metrics.h"
#include "common/progress.h"
#include "coordinator/coord.h"

/* How long coord_keep_held waits for every process to hold: each ends its
 * step as soon as a channel it waits on closes or its peer is seen gone (a
 * cascade of a few hops). */
#define KEEP_WAIT_S 20.0

/* Every process that ended is a replica of a stage with another one alive:
 * the state the run trained still lives in full. 0 when none ended. */
static int lost_only_replicas(const coord *c)
{
    int lost = 0;
    for (int i = 0; i < c->n; i++) {
        if (!c->procs[i].alive) {
            if (coord_writer_of(c, i) < 0) {
                return 0;
            }
            lost = 1;
        }
    }
    return lost;
}

/* The steps process i's state holds, once known: what it holds (it stopped
 * its step: stages/worker.c hold), or, between steps (no step sent to it
 * whose results have not come), the steps of its last results: it serves a
 * checkpoint request as it is. -1 while not known. */
static int state_of(const coord *c, int i)
{
    const proc *p = &c->procs[i];
    if (p->holding) {
        return p->held_steps;
    }
    return p->in_step == 0 ? p->steps : -1;
}

/* A stalled process that is a replica of a stage with another replica alive
 * goes (SIGKILL, reaped at once as coord_stop_all does): its siblings hold
 * the state it held, and its peers stop waiting for it. */
static void stop_stalled_replica(coord *c)
{
    int k = c->stalled;
    if (!c->fault || k < 0 || !c->procs[k].alive) {
        return;
    }
    int siblings = 0;
    for (int j = 0; j < c->n; j++) {
        siblings += j != k && c->procs[j].alive &&
                    strcmp(c->sched.stages[j].name, c->sched.stages[k].name) == 0;
    }
    if (!siblings) {
        return;
    }
    proc *p = &c->procs[k];
    MMP_INFO("stopping the stalled replica %s (pid %d): its siblings hold what was trained",
             p->name, (int)p->pid);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &p->exit_status, 0);
    p->alive = 0;
    p->reported = 1; /* its end is judged: the watchdog named it */
}

/* Calls off the step in flight: stages past their part of it wait for its
 * coefficient, and hold instead (the others ignore it). 0, or 1 when the
 * control plane failed. */
static int call_off(coord *c)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Clip off = MMPIPE__CLIP__INIT;
    off.step = c->cur_step > 0 ? c->cur_step : 0;
    off.call_off = 1;
    env.body_case = MMPIPE__ENVELOPE__BODY_CLIP;
    env.clip = &off;
    for (int i = 0; i < c->n; i++) {
        if (c->procs[i].alive && !c->procs[i].holding &&
            mmp_ctl_send(c->ctl, c->procs[i].name, &env) != MMP_OK) {
            MMP_WARN("nothing kept of the step in flight: %s", mmp_last_error());
            return 1;
        }
    }
    return 0;
}

/* Waits (KEEP_WAIT_S at most) until every live process's state is known
 * and returns the step they all hold, or -1 (with a warning why): a process
 * ended that was not a lost replica (data: any that ended), one did not
 * stop its step, or two hold different steps. */
static int wait_held(coord *c, int data)
{
    double t0 = mmp_now();
    const char *late = NULL;
    for (;;) {
        coord_reap(c);
        late = NULL;
        for (int i = 0; i < c->n; i++) {
            const proc *p = &c->procs[i];
            if (!p->alive && (data || coord_writer_of(c, i) < 0)) {
                MMP_WARN("nothing kept of the step in flight: stage %s ended", p->name);
                return -1;
            }
            late = !p->alive || state_of(c, i) >= 0 ? late : p->name;
        }
        if (!late || mmp_now() - t0 > KEEP_WAIT_S || mmp_interrupt_count() > 0) {
            break;
        }
        coord_take_one(c, 50);
    }
    if (late) {
        MMP_WARN("nothing kept: stage %s did not stop its step within %.0f s", late, KEEP_WAIT_S);
        return -1;
    }
    int held = -1;
    const char *first = NULL;
    for (int i = 0; i < c->n; i++) {
        if (!c->procs[i].alive) {
            continue;
        }
        if (held >= 0 && state_of(c, i) != held) {
            MMP_WARN("nothing kept: stage %s holds the state of step %d, stage %s of step %d",
                     first, held, c->procs[i].name, state_of(c, i));
            return -1;
        }
        held = state_of(c, i);
        first = c->procs[i].name;
    }
    return held;
}

/* The line of step `held` when a chained step's failure came before it (its
 * results are all in; a lost replica's may never have left it, and the line
 * leaves them out, unless it computed the loss). 1 when it cannot be. */
static int line_of_chained(coord *c, int held)
{
    /* the results of a lost replica, sent before it died, may still wait */
    while (coord_take_one(c, 50)) {
    }
    double last = 0;
    int bad = 0;
    for (int i = 0; i < c->n; i++) {
        bad |= !c->procs[i].have_done &&
               (c->procs[i].alive || c->sched.stages[i].kind == MMP_KIND_FUSION);
        last = c->procs[i].have_done ? fmax(last, c->procs[i].done_at) : last;
    }
    if (bad || coord_write_metrics(c, held - 1, (last - c->step_t0) * 1e3, c->step_norm,
                                   mmp_metrics_cpu_ms() - c->cpu_prev)) {
        return 1;
    }
    c->steps_done = held;
    return 0;
}

/* Checkpoints step `held` (every live process holds it, its line is
 * written) unless ckpt/latest is that step already; sets c->kept. */
static void keep_step(coord *c, int held, int data)
{
    char dir[1200];
    int latest = -1;
    if (mmp_ckpt_latest(c->out_dir, dir, sizeof dir, &latest) != MMP_OK) {
        latest = -1;
    }
    if (held == latest) {
        c->kept = held; /* its checkpoint is there already */
        return;
    }
    if (held <= 0) {
        return; /* nothing trained */
    }
    MMP_INFO("keeping what was trained: checkpointing step %d%s", held,
             data ? "" : " from the replicas left");
    if (!data) {
        /* A checkpoint asked for before may miss a lost replica's file (it
         * wrote its stage's): never published, asked for anew (the acks of
         * the live ones taken again). */
        c->ckpt_req = c->ckpt_pending = -1;
        for (int i = 0; i < c->n; i++) {
            if (c->procs[i].ckpt_written > held) {
                c->procs[i].ckpt_written = held;
            }
        }
    }
    if (coord_checkpoint(c, held, 0) == 0) {
        c->kept = held;
    } else {
        MMP_WARN("the checkpoint of step %d failed: %s", held, c->failure);
    }
}

void coord_keep_held(coord *c)
{
    c->kept = -1;
    if (c->stepping && !mmp_interrupt_signal()) {
        stop_stalled_replica(c);
    }
    /* a bad sample the stage that met it holds for; or a replica lost (its
     * siblings hold the same state) */
    int data = c->stage_error_holds && !c->fault;
    if (!c->stepping || mmp_interrupt_signal() || (!data && !(c->fault && lost_only_replicas(c)))) {
        return; /* (nothing trained in this launch: start-up failed) */
    }
    int held = call_off(c) ? -1 : wait_held(c, data);
    if (held < 0) {
        return;
    }
    /* The failure stays; the waits below need it out of the way (and the
     * errors already judged must not be judged again). */
    char failure[sizeof c->failure];
    snprintf(failure, sizeof failure, "%s", c->failure);
    c->failure[0] = c->stage_error[0] = c->peer_error[0] = 0;
    if (c->steps_done == held - 1 && held - 1 == c->cur_step) {
        line_of_chained(c, held);
    }
    if (c->steps_done != held) {
        MMP_WARN("nothing kept: the stages hold the state of step %d, the run's records end at "
                 "step %d",
                 held, c->steps_done);
    } else {
        keep_step(c, held, data);
    }
    snprintf(c->failure, sizeof c->failure, "%s", failure);
}
