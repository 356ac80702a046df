/* The step simulator (coordinator/schedule.h, mmp_sched_simulate) and the
 * executor under it. The checker (schedule_validate.c) runs the same
 * executor with zero costs to prove the lists cannot deadlock, so what
 * `mmpipe simulate` predicts is exactly what the checker accepted. Never
 * blocks; allocates O(list lengths). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/schedule_internal.h"

void mmp_sched_exec_fini(mmp_sched_exec *x)
{
    free(x->times);
    free(x->held);
    free(x->edges);
    x->times = NULL;
    x->held = NULL;
    x->edges = NULL;
}

/* s must have passed check_structure. */
mmp_err mmp_sched_exec_init(mmp_sched_exec *x, const mmp_sched *s, const mmp_sim_costs *c)
{
    memset(x, 0, sizeof *x);
    x->s = s;
    x->c = c;
    x->edges = calloc((size_t)s->n_edges + 1, sizeof *x->edges);
    if (!x->edges) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: executing %d edges", s->n_edges);
    }
    size_t msgs = 0, instrs = 0;
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        for (int pc = 0; pc < g->n_prog; pc++) {
            if (mmp_op_is_send(g->prog[pc].op)) {
                x->edges[g->prog[pc].edge].n_msgs++;
                msgs++;
            }
        }
        instrs += (size_t)g->n_prog;
    }
    x->times = malloc((2 * msgs + 1) * sizeof *x->times);
    x->held = malloc((instrs + 1) * sizeof *x->held);
    if (!x->times || !x->held) {
        mmp_sched_exec_fini(x);
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: executing %zu instructions", instrs);
    }
    double *t = x->times;
    for (int e = 0; e < s->n_edges; e++) {
        x->edges[e].arrive = t;
        x->edges[e].freed = t + x->edges[e].n_msgs;
        t += 2 * x->edges[e].n_msgs;
    }
    int *h = x->held;
    for (int st = 0; st < s->n_stages; st++) {
        x->stages[st].held = h;
        h += s->stages[st].n_prog;
    }
    return MMP_OK;
}

/* Runs stage st's next instruction if it can; 1 when it did. */
static int exec_step(mmp_sched_exec *x, int st)
{
    const mmp_sched_stage *g = &x->s->stages[st];
    mmp_sched_exec_stage *xs = &x->stages[st];
    if (xs->pc >= g->n_prog) {
        return 0;
    }
    const mmp_instr *in = &g->prog[xs->pc];
    const mmp_sim_costs *c = x->c;
    switch (in->op) {
    case MMP_OP_LOAD:
    case MMP_OP_FWD:
    case MMP_OP_BWD:
    case MMP_OP_BWD_INPUT:
    case MMP_OP_BWD_WEIGHT: {
        int fusion = g->kind == MMP_KIND_FUSION;
        if (mmp_op_is_bwd(in->op) && fusion && x->s->batch_loss) {
            /* the batch-wide loss needs the step's last forward (a zb-h1
             * fusion's W's come after its Bi's: they need nothing more) */
            if (x->fusion_fwds < x->s->microbatches) {
                return 0;
            }
            xs->t = fmax(xs->t, x->fusion_fwd_t);
        }
        double w = c->wgt_ms[st] > 0 ? c->wgt_ms[st] : 0.5 * c->bwd_ms[st];
        w = w < c->bwd_ms[st] ? w : c->bwd_ms[st];
        double cost = in->op == MMP_OP_LOAD         ? c->load_ms[st]
                      : in->op == MMP_OP_FWD        ? c->fwd_ms[st]
                      : in->op == MMP_OP_BWD_INPUT  ? c->bwd_ms[st] - w
                      : in->op == MMP_OP_BWD_WEIGHT ? w
                                                    : c->bwd_ms[st];
        xs->t += cost;
        xs->busy += cost;
        if (in->op != MMP_OP_LOAD && in->op != MMP_OP_BWD_WEIGHT) {
            for (int k = 0; k < xs->n_held; k++) {
                mmp_sched_exec_edge *E = &x->edges[xs->held[k]];
                E->freed[E->released++] = xs->t;
            }
            xs->n_held = 0;
        }
        if (in->op == MMP_OP_FWD) {
            xs->fwds++;
            if (fusion) {
                x->fusion_fwds++;
                x->fusion_fwd_t = fmax(x->fusion_fwd_t, xs->t);
            }
        }
        break;
    }
    case MMP_OP_SEND_ACT:
    case MMP_OP_SEND_GRAD: {
        mmp_sched_exec_edge *E = &x->edges[in->edge];
        int k = E->sent, slots = x->s->edges[in->edge].slots;
        if (k >= slots) {
            if (E->released <= k - slots) {
                return 0;
            }
            xs->t = fmax(xs->t, E->freed[k - slots]);
        }
        E->arrive[k] = xs->t + c->send_ms;
        E->sent++;
        break;
    }
    case MMP_OP_RECV_ACT:
    case MMP_OP_RECV_GRAD: {
        mmp_sched_exec_edge *E = &x->edges[in->edge];
        int k = E->received;
        if (k >= E->sent) {
            return 0;
        }
        xs->t = fmax(xs->t, E->arrive[k]);
        E->received++;
        xs->held[xs->n_held++] = in->edge;
        break;
    }
    case MMP_OP_GRAD_NORM:
        if (!xs->at_barrier) {
            xs->at_barrier = 1;
            x->n_at_barrier++;
            x->barrier_t = fmax(x->barrier_t, xs->t);
        }
        if (x->n_at_barrier < x->s->n_stages) {
            return 0;
        }
        xs->t = x->barrier_t + c->step_overhead_ms;
        xs->busy += c->step_overhead_ms;
        break;
    case MMP_OP_OPT_STEP:
        break;
    }
    xs->pc++;
    return 1;
}

/* Runs until every list ends (1) or no stage can move (0). Sweeps alternate
 * direction so activations (forward order) and gradients (backward order)
 * both travel a whole chain per pair of sweeps. */
int mmp_sched_exec_run(mmp_sched_exec *x)
{
    int n = x->s->n_stages, progress = 1, forward = 1;
    while (progress) {
        progress = 0;
        for (int j = 0; j < n; j++) {
            int st = forward ? j : n - 1 - j;
            while (exec_step(x, st)) {
                progress = 1;
            }
        }
        forward = !forward;
    }
    for (int st = 0; st < n; st++) {
        if (x->stages[st].pc < x->s->stages[st].n_prog) {
            return 0;
        }
    }
    return 1;
}

/* ---- simulation ----------------------------------------------------------------- */

static int is_cost(double v)
{
    return isfinite(v) && v >= 0;
}

mmp_err mmp_sched_simulate(const mmp_sched *s, const mmp_sim_costs *c, mmp_sim_result *r)
{
    memset(r, 0, sizeof *r);
    MMP_TRY(mmp_sched_validate(s));
    for (int st = 0; st < s->n_stages; st++) {
        if (!is_cost(c->fwd_ms[st]) || !is_cost(c->bwd_ms[st]) || !is_cost(c->load_ms[st]) ||
            !is_cost(c->wgt_ms[st])) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "simulate: stage %s: costs fwd %g bwd %g (weight pass %g) load %g "
                              "ms (each must be finite and >= 0)",
                              mmp_sched_pname(&s->stages[st]), c->fwd_ms[st], c->bwd_ms[st],
                              c->wgt_ms[st], c->load_ms[st]);
        }
    }
    if (!is_cost(c->send_ms) || !is_cost(c->step_overhead_ms)) {
        return mmp_errorf(
            MMP_ERR_INVALID,
            "simulate: send %g ms, step overhead %g ms (each must be finite and >= 0)", c->send_ms,
            c->step_overhead_ms);
    }
    mmp_sched_exec *x = malloc(sizeof *x);
    if (!x) {
        return mmp_errorf(MMP_ERR_NOMEM, "simulate: executor");
    }
    mmp_err ret = mmp_sched_exec_init(x, s, c);
    if (ret == MMP_OK && !mmp_sched_exec_run(x)) {
        ret = mmp_sched_deadlock_err(s, x); /* validation ran the same lists: never expected */
    }
    if (ret == MMP_OK) {
        for (int st = 0; st < s->n_stages; st++) {
            r->step_ms = fmax(r->step_ms, x->stages[st].t);
        }
        double idle = 0;
        for (int st = 0; st < s->n_stages; st++) {
            r->busy_ms[st] = x->stages[st].busy;
            r->idle_ms[st] = r->step_ms - x->stages[st].busy;
            idle += r->idle_ms[st];
        }
        r->bubble = r->step_ms > 0 ? idle / (s->n_stages * r->step_ms) : 0;
    }
    mmp_sched_exec_fini(x);
    free(x);
    return ret;
}
