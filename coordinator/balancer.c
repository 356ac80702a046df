/* The load balancer (coordinator/balancer.h): routing weights from measured
 * replica speeds, and re-placement through the planner. */
#include "coordinator/balancer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pin.h"
#include "common/stats.h"
#include "coordinator/costs.h"
#include "coordinator/placement.h"
#include "coordinator/planner.h"
#include "coordinator/planner_cores.h"

#define ROUTE_TOLERANCE 0.10 /* a speed this far from the routed one re-routes */
#define SEND_MS 0.05         /* planner: one hand-off between stages */

static int window_of(const mmp_balancer *b)
{
    int w = b->cur.balance.window;
    return w < 1 ? 1 : w > MMP_BAL_WINDOW_MAX ? MMP_BAL_WINDOW_MAX : w;
}

/* The cores a CPU plan's processes share (balancer.h), 0 for other plans. */
static int cpu_cores(const mmp_plan *p)
{
    if (p->compute != MMP_COMPUTE_REAL || p->n_hosts != 1 || p->launcher != MMP_LAUNCH_LOCAL) {
        return 0;
    }
    for (int s = 0; s < mmp_plan_slots(p); s++) {
        if (mmp_plan_slot_device(p, s) >= 0) {
            return 0;
        }
    }
    static int list[MMP_PIN_MAX_CORES];
    return p->train.pin.mode != MMP_PIN_OFF ? mmp_pin_list(p, list)
                                            : mmp_pin_allowed(list, MMP_PIN_MAX_CORES);
}

void mmp_balancer_reset(mmp_balancer *b, const mmp_plan *cur, const mmp_sched *sched,
                        const char *plan_json)
{
    memset(b, 0, sizeof *b);
    b->cur = *cur;
    b->sched = sched;
    b->plan_json = plan_json;
    b->slots = mmp_plan_slots(cur);
    b->cores = cpu_cores(cur);
    if (b->cores > 0) {
        b->slots = b->cores;
    } else if (b->slots < sched->n_stages) {
        b->slots = sched->n_stages; /* more processes than slots share them */
    }
    for (int i = 0; i < sched->n_stages; i++) {
        b->routed_speed[i] = sched->stages[i].speed > 0 ? sched->stages[i].speed : 1;
    }
}

void mmp_balancer_observe(mmp_balancer *b, const mmp_bal_proc *procs, double step_ms)
{
    int n = b->sched->n_stages;
    double busy = 0;
    for (int i = 0; i < n; i++) {
        /* Where processes share cores, a process computes in wall time it
         * spends waiting for its core: count at most the CPU time it got,
         * so the cores' busy share cannot pass 1. */
        int shared = b->cores > 0 && n > b->cores && procs[i].cpu_ms > 0;
        busy += shared ? fmin(procs[i].busy_ms, procs[i].cpu_ms) : procs[i].busy_ms;
    }
    b->efficiency = step_ms > 0 ? busy / (b->slots * step_ms) : 0;
    for (int i = 0; i < n; i++) {
        const mmp_bal_proc *q = &procs[i];
        if (q->peak_mem_bytes > b->mem_peak[i]) {
            b->mem_peak[i] = q->peak_mem_bytes;
            b->mem_state[i] = q->state_bytes > 0 ? q->state_bytes : 0;
            b->mem_slots[i] = q->act_slots > 0 ? q->act_slots : 0;
        }
        if (q->device_total_bytes > 0 &&
            (b->device_total == 0 || q->device_total_bytes < b->device_total)) {
            b->device_total = q->device_total_bytes;
        }
    }
    b->steps_seen++;
    if (b->steps_seen == 1) {
        return; /* a launch's first step warms up: not a measure */
    }
    int k = (b->steps_seen - 2) % window_of(b);
    for (int i = 0; i < n; i++) {
        double t = procs[i].fwd_ms + procs[i].bwd_ms;
        b->ms_per_sample[i][k] = procs[i].samples > 0 ? t / procs[i].samples : NAN;
        if (t > 0) {
            b->fwd_share[i] = procs[i].fwd_ms / t;
        }
    }
}

/* Median ms per sample of process i over the measured steps (NAN: none). */
static double median_ms(const mmp_balancer *b, int i)
{
    int have = b->steps_seen - 1;
    int w = window_of(b);
    have = have > w ? w : have;
    double v[MMP_BAL_WINDOW_MAX];
    int n = 0;
    for (int k = 0; k < have; k++) {
        if (isfinite(b->ms_per_sample[i][k])) {
            v[n++] = b->ms_per_sample[i][k];
        }
    }
    return mmp_median(v, n); /* NAN when none */
}

/* Whether weighted routing applies: some stage has replicas to route
 * between, and the processes do not share cores (balancer.h). */
static int routes(const mmp_balancer *b)
{
    if (b->cur.balance.routing != MMP_ROUTE_WEIGHTED ||
        (b->cores > 0 && b->sched->n_stages > b->cores)) {
        return 0;
    }
    for (int i = 0; i < b->sched->n_stages; i++) {
        if (b->sched->stages[i].n_replicas > 1) {
            return 1;
        }
    }
    return 0;
}

/* ---- memory ------------------------------------------------------------------------ */

#define GIB 1073741824.0
#define GPU_RESERVE_BYTES GIB /* CUDA context, library handles: not in a stage's peak */

/* The memory a re-placement may use per device (balancer.h), 0: no cap. */
static double device_cap(const mmp_balancer *b)
{
    if (b->cur.balance.device_memory_gib > 0) {
        return b->cur.balance.device_memory_gib * GIB;
    }
    if (b->device_total > 0) {
        return b->device_total > 2 * GPU_RESERVE_BYTES ? b->device_total - GPU_RESERVE_BYTES
                                                       : b->device_total / 2;
    }
    return 0;
}

/* One process's share of a device's cap when `procs` processes are dealt
 * over the plan's slots: the most that land on one device divide it. */
static double per_process_cap(const mmp_balancer *b, double cap, int procs)
{
    return cap / mmp_procs_most_on_device(&b->cur, procs);
}

/* Puts the measured memory into lc; 0 (and a reason in why) when some
 * process has no measured peak. */
static int measured_memory(const mmp_balancer *b, mmp_layer_costs *lc, char *why, size_t why_n)
{
    const mmp_plan *p = &b->cur;
    int q0 = (p->train.batch + p->train.microbatches - 1) / p->train.microbatches;
    mmp_costs_per_layer_mem(b->sched, b->mem_peak, b->mem_state, b->mem_slots, q0, lc);
    if (!lc->have_mem) {
        for (int i = 0; i < b->sched->n_stages; i++) {
            if (!(b->mem_peak[i] > 0)) {
                snprintf(why, why_n, "%s reported no peak memory", b->sched->stages[i].proc);
                break;
            }
        }
        return 0;
    }
    return 1;
}

/* Whether the planner is asked, with `seen` steps observed: dynamic mode or
 * stages: auto's first placement, once a window is measured. */
static int replans(const mmp_balancer *b, int seen)
{
    return (b->cur.balance.mode == MMP_BALANCE_DYNAMIC || b->cur.stages_auto) &&
           seen >= window_of(b) + 1;
}

int mmp_balancer_route(mmp_balancer *b, double *speed, char *why, size_t why_n)
{
    const mmp_sched *s = b->sched;
    if (!routes(b) || b->steps_seen < 2) {
        return 0;
    }
    int change = 0;
    size_t len = 0;
    why[0] = 0;
    for (int i = 0; i < s->n_stages; i++) {
        speed[i] = b->routed_speed[i];
    }
    for (int i = 0; i < s->n_stages; i += s->stages[i].n_replicas) {
        int R = s->stages[i].n_replicas;
        if (R < 2) {
            continue;
        }
        double sp[MMP_SCHED_MAX_STAGES], top = 0, rtop = 0;
        int ok = 1;
        for (int r = 0; r < R; r++) {
            double ms = median_ms(b, i + r);
            /* A replica routed nothing has no measure: keep its weight. */
            sp[r] = isfinite(ms) && ms > 0 ? 1.0 / ms : NAN;
            ok &= isfinite(sp[r]) || b->routed_speed[i + r] > 0;
            top = fmax(top, isfinite(sp[r]) ? sp[r] : 0);
            rtop = fmax(rtop, b->routed_speed[i + r]);
        }
        if (!ok || top <= 0) {
            continue;
        }
        int differs = 0;
        for (int r = 0; r < R; r++) {
            double now = isfinite(sp[r]) ? sp[r] / top : b->routed_speed[i + r] / rtop;
            differs |= fabs(now / (b->routed_speed[i + r] / rtop) - 1) > ROUTE_TOLERANCE;
            sp[r] = now;
        }
        if (!differs) {
            continue;
        }
        change = 1;
        len += (size_t)snprintf(why + len, len < why_n ? why_n - len : 0, "%s%s speeds",
                                len ? "; " : "", s->stages[i].name);
        for (int r = 0; r < R; r++) {
            speed[i + r] = sp[r];
            len += (size_t)snprintf(why + len, len < why_n ? why_n - len : 0, "%s%.2f",
                                    r ? ":" : " ", sp[r]);
        }
    }
    return change;
}

void mmp_balancer_routed(mmp_balancer *b, const double *speed)
{
    for (int i = 0; i < b->sched->n_stages; i++) {
        b->routed_speed[i] = speed[i];
    }
}

/* ---- placement ------------------------------------------------------------------- */

/* The per-layer costs the measurements imply (coordinator/costs.h): each
 * process's median ms per sample, split by its last step's forward share.
 * 0 when a stage has no measure yet. */
static int estimate_costs(const mmp_balancer *b, mmp_layer_costs *out)
{
    const mmp_sched *s = b->sched;
    double fwd[MMP_SCHED_MAX_STAGES], bwd[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < s->n_stages; i++) {
        double ms = median_ms(b, i);
        fwd[i] = ms * b->fwd_share[i];
        bwd[i] = ms * (1 - b->fwd_share[i]);
    }
    return mmp_costs_per_layer(s, fwd, bwd, out);
}

mmp_err mmp_balancer_forced_plan(const mmp_plan *cur, const char *plan_json,
                                 const char *const *sets, int n_sets, mmp_plan *next)
{
    char buf[sizeof cur->balance.force.set];
    const char *ov[16];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", cur->balance.force.set);
    for (char *save = NULL, *t = strtok_r(buf, ";", &save); t && n < 16;
         t = strtok_r(NULL, ";", &save)) {
        while (*t == ' ') {
            t++;
        }
        if (*t) {
            ov[n++] = t;
        }
    }
    for (int i = 0; i < n; i++) {
        if (strncmp(ov[i], "stages.", 7) != 0) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "balance.force.set: '%s': only stages.* keys can change while the "
                              "job runs",
                              ov[i]);
        }
    }
    const char **all = malloc((size_t)(n_sets + n + 1) * sizeof *all); /* + 1: never 0 bytes */
    if (!all) {
        return mmp_errorf(MMP_ERR_NOMEM, "balance.force.set: %d overrides", n_sets + n);
    }
    for (int i = 0; i < n_sets; i++) {
        all[i] = sets[i];
    }
    for (int i = 0; i < n; i++) {
        all[n_sets + i] = ov[i];
    }
    mmp_err e = mmp_plan_load(next, plan_json, all, n_sets + n);
    free(all);
    if (e != MMP_OK) {
        return mmp_error_prefix(e, "balance.force.set");
    }
    return MMP_OK;
}

int mmp_balancer_may_act(const mmp_balancer *b, int done)
{
    int seen = b->steps_seen + 1; /* once step done is observed */
    return (b->cur.balance.force.step > 0 && done == b->cur.balance.force.step) ||
           replans(b, seen) || (routes(b) && seen >= 2);
}

/* Whether placement pl, put into the current plan as *out, is a plan that
 * runs: a branch's first sub-stage with no more replicas than micro-batches
 * (common/plan.c), and a schedule that compiles (at most
 * MMP_SCHED_MAX_STAGES processes, MMP_SCHED_MAX_EDGES channels). A
 * proposal that does not would stop the run (coordinator/steps.c). 0 with
 * the reason in mmp_last_error(). */
static int runnable(const mmp_balancer *b, const mmp_placement *pl, mmp_plan *out)
{
    *out = b->cur;
    out->stages_auto = 0;
    mmp_placement_to_plan(pl, out);
    for (int br = 0; br < 2; br++) {
        if (pl->sub[br][0].replicas > b->cur.train.microbatches) {
            mmp_errorf(MMP_ERR_INVALID, "%d replicas of %s.0, more than the %d micro-batches",
                       pl->sub[br][0].replicas, br ? "text" : "image", b->cur.train.microbatches);
            return 0;
        }
    }
    static mmp_sched probe;
    mmp_err e = mmp_sched_compile(&probe, out);
    mmp_sched_fini(&probe);
    return e == MMP_OK;
}

mmp_err mmp_balancer_replan(mmp_balancer *b, int done, mmp_plan *next, int *go, char *why,
                            size_t why_n, double *gain)
{
    *go = 0;
    *gain = NAN;
    why[0] = 0;
    memset(b->next_nice, 0, sizeof b->next_nice);
    if (b->cur.balance.force.step > 0 && done == b->cur.balance.force.step) {
        MMP_TRY(mmp_balancer_forced_plan(&b->cur, b->plan_json, NULL, 0, next));
        *go = 1;
        snprintf(why, why_n, "scripted by balance.force at step %d: %s", done,
                 b->cur.balance.force.set);
        return MMP_OK;
    }
    int profiling = b->cur.stages_auto; /* stages: auto, its first placement */
    if (!replans(b, b->steps_seen)) {
        return MMP_OK;
    }
    static mmp_layer_costs lc;
    if (!estimate_costs(b, &lc)) {
        return MMP_OK;
    }
    const mmp_plan *p = &b->cur;
    /* Memory (balancer.h): the cap, and the stages' measured memory. */
    double cap = device_cap(b);
    char reason[200] = "";
    if (cap > 0 && !measured_memory(b, &lc, reason, sizeof reason)) {
        if (!b->mem_warned++) {
            MMP_WARN("balancer: re-placing under a memory cap of %.2f GiB a device needs every "
                     "stage's measured memory, and %s: keeping the current placement",
                     cap / GIB, reason);
        }
        return MMP_OK;
    }
    /* The planner deals whole micro-batches to a stage's replicas, as the
     * runtime does: per-sample costs and the plan's own batch. */
    mmp_planner_input in;
    mmp_costs_planner_input(p, &lc, &in);
    /* A plan runs at most MMP_SCHED_MAX_STAGES processes (what the schedule
     * compiler takes, coordinator/schedule_compile.c), however many slots its
     * hosts list. */
    in.devices = b->slots < MMP_SCHED_MAX_STAGES ? b->slots : MMP_SCHED_MAX_STAGES;
    in.batch = p->train.batch;
    in.send_ms = SEND_MS;
    mmp_placement now;
    mmp_placement_of_sched(b->sched, &now);
    mmp_planner_eval cur_ev;
    mmp_planner_result res;
    static mmp_plan proposal;
    if (b->cores > 0) {
        mmp_cores_input ci = {.in = in, .cores = b->cores};
        MMP_TRY(mmp_planner_cores_evaluate(&ci, &now, &cur_ev, NULL));
        MMP_TRY(mmp_planner_cores_plan(&ci, &res));
        if (!runnable(b, &res.placement, &proposal)) {
            MMP_WARN("balancer: the placement planned on cores does not compile (%s): keeping "
                     "the current one",
                     mmp_last_error());
            return MMP_OK;
        }
        if (cap > 0) {
            /* the planner on cores knows no memory: a placement over the cap
             * (each process its own share of it) is not taken */
            mmp_planner_input mi = in;
            mmp_planner_eval mev;
            mi.devices = mmp_placement_procs(&res.placement);
            mi.mem_cap_bytes = cap;
            mi.method = MMP_PLANNER_CLOSED_FORM;
            if (mmp_planner_evaluate(&mi, &res.placement, &mev) != MMP_OK) {
                if (!b->mem_warned++) {
                    MMP_WARN("balancer: the placement planned on cores is over the memory cap of "
                             "%.2f GiB a process (%s): keeping the current one",
                             cap / GIB, mmp_last_error());
                }
                return MMP_OK;
            }
        }
    } else {
        MMP_TRY(mmp_planner_evaluate(&in, &now, &cur_ev)); /* no cap yet: whatever its memory */
        /* The planner keeps within each stage's limits; the schedule's (its
         * channels: every replica pair of consecutive stages needs two) may
         * still refuse a placement with many replicas on both sides of a
         * cut: then fewer devices are asked for, down to the processes
         * running now. */
        for (;;) {
            in.mem_cap_bytes = cap > 0 ? per_process_cap(b, cap, in.devices) : 0;
            mmp_err e = mmp_planner_plan(&in, &res);
            if (e != MMP_OK && cap > 0) {
                if (!b->mem_warned++) {
                    MMP_WARN("balancer: no re-placement within the memory cap of %.2f GiB a device "
                             "(%.2f GiB a process): %s: keeping the current one",
                             cap / GIB, in.mem_cap_bytes / GIB, mmp_last_error());
                }
                return MMP_OK;
            }
            MMP_TRY(e);
            if (runnable(b, &res.placement, &proposal)) {
                break;
            }
            if (in.devices <= b->sched->n_stages) {
                MMP_WARN("balancer: no placement the planner proposed compiles (the last: %s): "
                         "keeping the current one",
                         mmp_last_error());
                return MMP_OK;
            }
            int fewer = in.devices * 3 / 4;
            in.devices = fewer > b->sched->n_stages ? fewer : b->sched->n_stages;
        }
    }
    double g = cur_ev.step_ms / res.eval.step_ms - 1;
    if (memcmp(&now, &res.placement, sizeof now) == 0 ||
        !(g >= (profiling ? 0 : p->balance.min_gain))) {
        return MMP_OK;
    }
    char cores_note[64] = "", nice_note[160] = "", mem_note[160] = "";
    mmp_planner_input mi = in;
    mmp_planner_eval mev;
    mi.devices = mmp_placement_procs(&res.placement);
    mi.mem_cap_bytes = 0;
    mi.method = MMP_PLANNER_CLOSED_FORM;
    if (cap > 0 && mmp_planner_evaluate(&mi, &res.placement, &mev) == MMP_OK) {
        double most = mev.fusion_bytes;
        for (int bb = 0; bb < 2; bb++) {
            for (int j = 0; j < res.placement.n_sub[bb]; j++) {
                most = fmax(most, mev.stage_bytes[bb][j]);
            }
        }
        snprintf(mem_note, sizeof mem_note,
                 "; memory: %.2f GiB the largest process predicted, cap %.2f GiB a device",
                 most / GIB, cap / GIB);
    }
    if (b->cores > 0) {
        snprintf(cores_note, sizeof cores_note, "on %d cores, ", b->cores);
        mmp_cores_input ci = {.in = in, .cores = b->cores};
        int P = mmp_planner_cores_nice(&ci, &res.placement, b->next_nice);
        int heavy = 0;
        for (int k = 0; k < P; k++) {
            heavy += b->next_nice[k] > 0;
        }
        if (heavy > 0 && p->train.priority == MMP_PRIORITY_AUTO) {
            snprintf(nice_note, sizeof nice_note,
                     "; the %d process%s with the largest shares at nice %d (train.priority)",
                     heavy, heavy > 1 ? "es" : "", MMP_CORES_NICE_HEAVY);
        } else {
            memset(b->next_nice, 0, sizeof b->next_nice);
        }
    }
    *next = proposal;
    *go = 1;
    *gain = g;
    snprintf(why, why_n,
             "%s%smeasured costs predict step %.1f ms now (bottleneck %.2f ms queued a step, "
             "efficiency %.2f) and %.1f ms after re-placing (bottleneck %.2f ms, efficiency "
             "%.2f)%s%s",
             profiling ? "stages: auto, after profiling: " : "", cores_note, cur_ev.step_ms,
             cur_ev.bottleneck_ms, cur_ev.efficiency, res.eval.step_ms, res.eval.bottleneck_ms,
             res.eval.efficiency, nice_note, mem_note);
    return MMP_OK;
}
