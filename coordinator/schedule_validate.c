/* The schedule checker (coordinator/schedule.h, mmp_sched_validate): proves
 * a compiled or hand-made schedule sound before anything runs -- matching
 * sends and receives in the same order, F before B, inputs before the
 * compute that reads them, the in-flight bound, each split backward's W after
 * its B and before GRAD_NORM in ascending micro-batch order -- and proves deadlock
 * freedom the direct way, by executing all lists together against bounded
 * channels (the executor in schedule_simulate.c). Errors name the stage, the
 * instruction and the reason. Never blocks; allocates O(micro-batches). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/schedule_internal.h"

static mmp_err sched_err(const mmp_sched *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static mmp_err sched_err(const mmp_sched *s, const char *fmt, ...)
{
    char why[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return mmp_errorf(MMP_ERR_INTERNAL, "schedule %s: %s", mmp_schedule_name(s->kind), why);
}

/* "schedule 1f1b: stage image.1 instr 7 (RECV_GRAD e3 mb2): <why>"; pc < 0
 * leaves out the instruction. */
static mmp_err stage_err(const mmp_sched *s, int st, int pc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mmp_err stage_err(const mmp_sched *s, int st, int pc, const char *fmt, ...)
{
    char why[1600], ins[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (pc < 0) {
        return sched_err(s, "stage %s: %s", mmp_sched_pname(&s->stages[st]), why);
    }
    return sched_err(s, "stage %s instr %d (%s): %s", mmp_sched_pname(&s->stages[st]), pc,
                     mmp_instr_str(&s->stages[st].prog[pc], ins, sizeof ins), why);
}

static const char *carries(int grad)
{
    return grad ? "gradients" : "activations";
}

/* Ranges, names, and that every instruction names an edge this stage may use
 * that way. Everything after relies on it. */
static mmp_err check_structure(const mmp_sched *s)
{
    if (s->kind != MMP_SCHED_GPIPE && s->kind != MMP_SCHED_1F1B && s->kind != MMP_SCHED_ZB_H1) {
        return mmp_errorf(MMP_ERR_INTERNAL, "schedule: unknown kind %d", (int)s->kind);
    }
    int m = s->microbatches;
    if (m < 1) {
        return sched_err(s, "%d micro-batches", m);
    }
    if (s->n_stages < 1 || s->n_stages > MMP_SCHED_MAX_STAGES || s->n_edges < 0 ||
        s->n_edges > MMP_SCHED_MAX_EDGES || (s->n_edges > 0 && !s->edges)) {
        return sched_err(s, "%d stages and %d edges (at most %d and %d)", s->n_stages, s->n_edges,
                         MMP_SCHED_MAX_STAGES, MMP_SCHED_MAX_EDGES);
    }
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        if (E->from < 0 || E->from >= s->n_stages || E->to < 0 || E->to >= s->n_stages ||
            E->from == E->to || (E->grad != 0 && E->grad != 1) || E->slots < 1) {
            return sched_err(s, "edge e%d is malformed (from %d to %d, grad %d, %d slots)", e,
                             E->from, E->to, E->grad, E->slots);
        }
    }
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        if (!memchr(g->name, 0, sizeof g->name) || !g->name[0]) {
            return sched_err(s, "stage %d has no name", st);
        }
        if (!memchr(g->proc, 0, sizeof g->proc)) {
            return sched_err(s, "stage %d has no process name", st);
        }
        for (int j = 0; j < st; j++) {
            if (strcmp(s->stages[j].name, g->name) == 0 && s->stages[j].replica == g->replica) {
                return sched_err(s, "two processes are replica %d of %s", g->replica, g->name);
            }
        }
        /* Routing: each micro-batch on exactly one replica of the stage. */
        if (g->replica == 0 && (g->n_replicas > 1 || g->owns)) {
            if (g->n_replicas < 1 || st + g->n_replicas > s->n_stages) {
                return stage_err(s, st, -1, "%d replicas", g->n_replicas);
            }
            for (int mb = 0; mb < m; mb++) {
                int n = 0;
                for (int r = 0; r < g->n_replicas; r++) {
                    const mmp_sched_stage *h = &s->stages[st + r];
                    n += h->owns && h->owns[mb] && strcmp(h->name, g->name) == 0;
                }
                if (n != 1) {
                    return stage_err(s, st, -1, "mb%d is routed to %d of its %d replicas", mb, n,
                                     g->n_replicas);
                }
            }
        }
        if (g->n_prog < 0 || (g->n_prog > 0 && !g->prog)) {
            return stage_err(s, st, -1, "no list (%d instructions)", g->n_prog);
        }
        if (g->inflight_bound < 1) {
            return stage_err(s, st, -1, "in-flight bound %d", g->inflight_bound);
        }
        for (int pc = 0; pc < g->n_prog; pc++) {
            const mmp_instr *in = &g->prog[pc];
            if (!mmp_op_valid((int)in->op)) {
                return stage_err(s, st, pc, "unknown op");
            }
            if (mmp_op_is_step(in->op)) {
                if (in->mb != -1 || in->edge != -1) {
                    return stage_err(s, st, pc, "takes no micro-batch and no edge");
                }
                continue;
            }
            if (in->mb < 0 || in->mb >= m) {
                return stage_err(s, st, pc, "mb%d is outside 0..%d", in->mb, m - 1);
            }
            if (!mmp_op_is_send(in->op) && !mmp_op_is_recv(in->op)) {
                if (in->edge != -1) {
                    return stage_err(s, st, pc, "a compute instruction names edge e%d", in->edge);
                }
                continue;
            }
            if (in->edge < 0 || in->edge >= s->n_edges) {
                return stage_err(s, st, pc, "no edge e%d (there are %d)", in->edge, s->n_edges);
            }
            const mmp_sched_edge *E = &s->edges[in->edge];
            if (E->grad != mmp_op_is_grad(in->op)) {
                return stage_err(s, st, pc, "e%d carries %s", in->edge, carries(E->grad));
            }
            if ((mmp_op_is_send(in->op) ? E->from : E->to) != st) {
                return stage_err(s, st, pc, "e%d runs from %s to %s: this stage does not %s on it",
                                 in->edge, mmp_sched_pname(&s->stages[E->from]),
                                 mmp_sched_pname(&s->stages[E->to]),
                                 mmp_op_is_send(in->op) ? "send" : "receive");
            }
        }
    }
    return MMP_OK;
}

/* Per edge: every receive has its send and vice versa, in the same order.
 * sent_n and recv_n ([microbatches]) are zero on entry and, on success,
 * again on return (cleared where this edge touched them: hundreds of
 * thousands of edges must not clear m counters each). */
static mmp_err check_edge(const mmp_sched *s, int e, int *sent_n, int *recv_n)
{
    const mmp_sched_edge *E = &s->edges[e];
    const mmp_sched_stage *src = &s->stages[E->from], *dst = &s->stages[E->to];
    mmp_op sop = E->grad ? MMP_OP_SEND_GRAD : MMP_OP_SEND_ACT;
    mmp_op rop = E->grad ? MMP_OP_RECV_GRAD : MMP_OP_RECV_ACT;
    for (int pc = 0; pc < src->n_prog; pc++) {
        if (src->prog[pc].op == sop && src->prog[pc].edge == e) {
            sent_n[src->prog[pc].mb]++;
        }
    }
    for (int pc = 0; pc < dst->n_prog; pc++) {
        if (dst->prog[pc].op == rop && dst->prog[pc].edge == e) {
            recv_n[dst->prog[pc].mb]++;
        }
    }
    for (int pc = 0; pc < dst->n_prog; pc++) {
        const mmp_instr *in = &dst->prog[pc];
        if (in->op == rop && in->edge == e && sent_n[in->mb] != recv_n[in->mb]) {
            if (!sent_n[in->mb]) {
                return stage_err(s, E->to, pc, "no matching send: %s never sends mb%d on e%d",
                                 mmp_sched_pname(src), in->mb, e);
            }
            return stage_err(s, E->to, pc, "mb%d is received %d times on e%d but sent %d times",
                             in->mb, recv_n[in->mb], e, sent_n[in->mb]);
        }
    }
    for (int pc = 0; pc < src->n_prog; pc++) {
        const mmp_instr *in = &src->prog[pc];
        if (in->op == sop && in->edge == e && !recv_n[in->mb]) {
            return stage_err(s, E->from, pc, "no matching receive: %s never receives mb%d on e%d",
                             mmp_sched_pname(dst), in->mb, e);
        }
    }
    /* Same multiset on both ends: walk the two sequences side by side. */
    int sp = 0, rp = 0, k = 0;
    for (;; k++) {
        while (sp < src->n_prog && !(src->prog[sp].op == sop && src->prog[sp].edge == e)) {
            sp++;
        }
        while (rp < dst->n_prog && !(dst->prog[rp].op == rop && dst->prog[rp].edge == e)) {
            rp++;
        }
        if (sp == src->n_prog || rp == dst->n_prog) {
            break;
        }
        if (src->prog[sp].mb != dst->prog[rp].mb) {
            return stage_err(s, E->to, rp,
                             "order differs on e%d: receive #%d expects mb%d but send #%d from %s "
                             "(instr %d) carries mb%d",
                             e, k, dst->prog[rp].mb, k, mmp_sched_pname(src), sp, src->prog[sp].mb);
        }
        sp++;
        rp++;
    }
    for (int pc = 0; pc < src->n_prog; pc++) {
        if (src->prog[pc].op == sop && src->prog[pc].edge == e) {
            sent_n[src->prog[pc].mb] = 0;
        }
    }
    for (int pc = 0; pc < dst->n_prog; pc++) {
        if (dst->prog[pc].op == rop && dst->prog[pc].edge == e) {
            recv_n[dst->prog[pc].mb] = 0;
        }
    }
    return MMP_OK;
}

/* Stage st does op on edge e (-1: LOAD) exactly once per micro-batch, each
 * before (or after) the compute instruction recorded in ref. */
static mmp_err check_role(const mmp_sched *s, int st, mmp_op op, int e, const int *ref,
                          const char *ref_name, int before, int *at)
{
    const mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches;
    for (int mb = 0; mb < m; mb++) {
        at[mb] = -1;
    }
    for (int pc = 0; pc < g->n_prog; pc++) {
        const mmp_instr *in = &g->prog[pc];
        if (in->op != op || in->edge != e) {
            continue;
        }
        if (at[in->mb] >= 0) {
            return stage_err(s, st, pc, "repeats instr %d", at[in->mb]);
        }
        at[in->mb] = pc;
    }
    for (int mb = 0; mb < m; mb++) {
        int routed = e < 0 ? mmp_sched_owns(g, mb) : mmp_sched_edge_carries(s, e, mb);
        if (!routed) {
            if (at[mb] >= 0) {
                return stage_err(s, st, at[mb], "mb%d is not routed %s", mb,
                                 e < 0 ? "to this replica" : "over this edge");
            }
            continue;
        }
        if (at[mb] < 0) {
            char ins[64];
            mmp_instr_str(&(mmp_instr){.op = op, .mb = mb, .edge = e}, ins, sizeof ins);
            return stage_err(s, st, -1, "mb%d is missing its %s", mb, ins);
        }
        if (before ? at[mb] > ref[mb] : at[mb] < ref[mb]) {
            return stage_err(s, st, at[mb], "must come %s %s mb%d (instr %d)",
                             before ? "before" : "after", ref_name, mb, ref[mb]);
        }
    }
    return MMP_OK;
}

/* Per stage: each micro-batch forwarded and backwarded once, F before B,
 * every input received before the compute that reads it and every output
 * sent after the compute that makes it; the list ends GRAD_NORM, OPT_STEP. */
/* A split backward (zb-h1): each BWD_INPUT has one BWD_WEIGHT after it (so
 * before GRAD_NORM, which only the list's end holds), each BWD_WEIGHT its
 * BWD_INPUT, and only zb-h1 splits. W's run in ascending micro-batch order:
 * the order the gradient sums add the micro-batches in (nn/wgrad.h). A
 * fusion under the batch-wide loss runs the batch's weight pass at its first
 * W, after its first B (the batch's): these rules cover it too. */
static mmp_err check_split(const mmp_sched *s, int st, const int *bwd_at, int *w_at)
{
    const mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches, last_w = -1;
    for (int mb = 0; mb < m; mb++) {
        w_at[mb] = -1;
    }
    for (int pc = 0; pc < g->n_prog; pc++) {
        const mmp_instr *in = &g->prog[pc];
        if (in->op != MMP_OP_BWD_INPUT && in->op != MMP_OP_BWD_WEIGHT) {
            continue;
        }
        if (s->kind != MMP_SCHED_ZB_H1) {
            return stage_err(s, st, pc, "only zb-h1 splits the backward (%s runs BWD)",
                             mmp_schedule_name(s->kind));
        }
        if (in->op == MMP_OP_BWD_INPUT) {
            continue;
        }
        if (w_at[in->mb] >= 0) {
            return stage_err(s, st, pc, "repeats instr %d", w_at[in->mb]);
        }
        w_at[in->mb] = pc;
        if (bwd_at[in->mb] < 0 || g->prog[bwd_at[in->mb]].op != MMP_OP_BWD_INPUT) {
            return stage_err(s, st, pc, "mb%d has no BWD_INPUT to take the weight pass of", in->mb);
        }
        if (pc < bwd_at[in->mb]) {
            return stage_err(s, st, pc, "mb%d's weight pass comes before its BWD_INPUT (instr %d)",
                             in->mb, bwd_at[in->mb]);
        }
        if (last_w >= 0 && g->prog[last_w].mb > in->mb) {
            return stage_err(s, st, pc,
                             "weight passes must run in ascending micro-batch order (the order "
                             "the gradient sums add them in), but mb%d's came first (instr %d)",
                             g->prog[last_w].mb, last_w);
        }
        last_w = pc;
    }
    for (int mb = 0; mb < m; mb++) {
        if (bwd_at[mb] >= 0 && g->prog[bwd_at[mb]].op == MMP_OP_BWD_INPUT && w_at[mb] < 0) {
            return stage_err(s, st, bwd_at[mb], "mb%d has no BWD_WEIGHT before GRAD_NORM", mb);
        }
    }
    return MMP_OK;
}

static mmp_err check_stage(const mmp_sched *s, const mmp_sched_adj *adj, int st, int *fwd_at,
                           int *bwd_at, int *at)
{
    const mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches, n = g->n_prog;
    for (int mb = 0; mb < m; mb++) {
        fwd_at[mb] = bwd_at[mb] = -1;
    }
    int inputs = 0;
    for (int k = adj->in_at[st]; k < adj->in_at[st + 1]; k++) {
        inputs += !s->edges[adj->in[k]].grad;
    }
    if (n < 2 || g->prog[n - 2].op != MMP_OP_GRAD_NORM || g->prog[n - 1].op != MMP_OP_OPT_STEP) {
        return stage_err(s, st, -1, "the list must end with GRAD_NORM, OPT_STEP");
    }
    for (int pc = 0; pc < n; pc++) {
        const mmp_instr *in = &g->prog[pc];
        int *slot = in->op == MMP_OP_FWD ? fwd_at : mmp_op_is_bwd(in->op) ? bwd_at : NULL;
        if (slot) {
            if (slot[in->mb] >= 0) {
                return stage_err(s, st, pc, "repeats instr %d", slot[in->mb]);
            }
            slot[in->mb] = pc;
        } else if (mmp_op_is_step(in->op) && pc != n - 2 + (in->op == MMP_OP_OPT_STEP)) {
            return stage_err(s, st, pc,
                             "only the list's last two instructions are GRAD_NORM, "
                             "OPT_STEP");
        } else if (in->op == MMP_OP_LOAD && inputs) {
            return stage_err(s, st, pc, "a stage that receives its inputs does not load them");
        }
    }
    for (int mb = 0; mb < m; mb++) {
        if (!mmp_sched_owns(g, mb)) {
            if (fwd_at[mb] >= 0 || bwd_at[mb] >= 0) {
                return stage_err(s, st, fwd_at[mb] >= 0 ? fwd_at[mb] : bwd_at[mb],
                                 "mb%d is routed to another replica", mb);
            }
            continue;
        }
        if (fwd_at[mb] < 0) {
            return stage_err(s, st, -1, "mb%d is never forwarded", mb);
        }
        if (bwd_at[mb] < 0) {
            return stage_err(s, st, -1, "mb%d is never backwarded", mb);
        }
        if (bwd_at[mb] < fwd_at[mb]) {
            return stage_err(s, st, bwd_at[mb],
                             "mb%d's backward comes before its forward (instr %d)", mb, fwd_at[mb]);
        }
    }
    MMP_TRY(check_split(s, st, bwd_at, at));
    if (!inputs) {
        MMP_TRY(check_role(s, st, MMP_OP_LOAD, -1, fwd_at, "FWD", 1, at));
    }
    /* in edge order, the incoming and outgoing edges merged (the first
     * error is the one a scan of every edge would find) */
    for (int i = adj->in_at[st], o = adj->out_at[st];
         i < adj->in_at[st + 1] || o < adj->out_at[st + 1];) {
        int ei = i < adj->in_at[st + 1] ? adj->in[i] : s->n_edges;
        int eo = o < adj->out_at[st + 1] ? adj->out[o] : s->n_edges;
        int e = ei < eo ? ei : eo;
        const mmp_sched_edge *E = &s->edges[e];
        if (ei == e) {
            i++;
            MMP_TRY(check_role(s, st, E->grad ? MMP_OP_RECV_GRAD : MMP_OP_RECV_ACT, e,
                               E->grad ? bwd_at : fwd_at, E->grad ? "BWD" : "FWD", 1, at));
        }
        if (eo == e) {
            o++;
            MMP_TRY(check_role(s, st, E->grad ? MMP_OP_SEND_GRAD : MMP_OP_SEND_ACT, e,
                               E->grad ? bwd_at : fwd_at, E->grad ? "BWD" : "FWD", 0, at));
        }
    }
    if (s->batch_loss && g->kind == MMP_KIND_FUSION) {
        int last_fwd = -1, first_bwd = -1;
        for (int mb = 0; mb < m; mb++) {
            last_fwd = fwd_at[mb] > last_fwd ? fwd_at[mb] : last_fwd;
            if (bwd_at[mb] >= 0 && (first_bwd < 0 || bwd_at[mb] < first_bwd)) {
                first_bwd = bwd_at[mb];
            }
        }
        if (first_bwd >= 0 && first_bwd < last_fwd) {
            return stage_err(s, st, first_bwd,
                             "the batch-wide loss (model.fusion.itc_scope: batch) needs the "
                             "step's last forward (instr %d) before any backward",
                             last_fwd);
        }
    }
    int over;
    mmp_sched_list_inflight(g, g->inflight_bound, &over);
    if (over >= 0) {
        return stage_err(s, st, over, "%d micro-batches in flight, more than the bound %d",
                         g->inflight_bound + 1, g->inflight_bound);
    }
    return MMP_OK;
}

static int count_fwds(const mmp_sched_stage *g)
{
    int n = 0;
    for (int pc = 0; pc < g->n_prog; pc++) {
        n += g->prog[pc].op == MMP_OP_FWD;
    }
    return n;
}

/* Which stage blocked stage st waits on (-1: none), and why, in words. */
static int waits_on(const mmp_sched *s, const mmp_sched_exec *x, int st, char *why, size_t n)
{
    const mmp_instr *in = &s->stages[st].prog[x->stages[st].pc];
    if (mmp_op_is_bwd(in->op)) { /* only a fusion BWD under batch_loss blocks */
        for (int j = 0; j < s->n_stages; j++) {
            if (s->stages[j].kind == MMP_KIND_FUSION &&
                x->stages[j].fwds < count_fwds(&s->stages[j])) {
                snprintf(why, n,
                         "waits for the step's last forward (model.fusion.itc_scope: batch): "
                         "%s has run %d of its %d FWDs",
                         mmp_sched_pname(&s->stages[j]), x->stages[j].fwds,
                         count_fwds(&s->stages[j]));
                return j;
            }
        }
        return -1;
    }
    if (in->op == MMP_OP_GRAD_NORM) {
        for (int j = 0; j < s->n_stages; j++) {
            if (!x->stages[j].at_barrier) {
                snprintf(why, n, "waits at the GRAD_NORM barrier for %s",
                         mmp_sched_pname(&s->stages[j]));
                return j;
            }
        }
        return -1;
    }
    const mmp_sched_edge *E = &s->edges[in->edge];
    if (mmp_op_is_recv(in->op)) {
        snprintf(why, n, "waits for %s to send it", mmp_sched_pname(&s->stages[E->from]));
        return E->from;
    }
    snprintf(why, n, "waits for a free slot: all %d slots of e%d hold messages %s has not released",
             E->slots, in->edge, mmp_sched_pname(&s->stages[E->to]));
    return E->to;
}

/* Names the cycle of waits that stops the lists (or, failing one, every
 * blocked stage). */
mmp_err mmp_sched_deadlock_err(const mmp_sched *s, const mmp_sched_exec *x)
{
    int seen[MMP_SCHED_MAX_STAGES], chain[MMP_SCHED_MAX_STAGES + 1], n = 0, start = -1;
    for (int i = 0; i < s->n_stages; i++) {
        seen[i] = -1;
        if (start < 0 && x->stages[i].pc < s->stages[i].n_prog) {
            start = i;
        }
    }
    MMP_ASSERT(start >= 0);
    char why[256], ins[64];
    int at = start, cycle_from = 0;
    while (at >= 0 && seen[at] < 0 && x->stages[at].pc < s->stages[at].n_prog) {
        seen[at] = n;
        chain[n++] = at;
        at = waits_on(s, x, at, why, sizeof why);
    }
    if (at >= 0 && seen[at] >= 0) {
        cycle_from = seen[at];
    }
    char msg[1700];
    size_t len = 0;
    len += (size_t)snprintf(
        msg, sizeof msg, "deadlock, %s: ", at >= 0 && seen[at] >= 0 ? "a cycle of waits" : "stuck");
    for (int k = cycle_from; k < n && len < sizeof msg; k++) {
        int st = chain[k];
        int pc = x->stages[st].pc;
        waits_on(s, x, st, why, sizeof why);
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%sstage %s instr %d (%s) %s",
                                k > cycle_from ? "; " : "", mmp_sched_pname(&s->stages[st]), pc,
                                mmp_instr_str(&s->stages[st].prog[pc], ins, sizeof ins), why);
    }
    return sched_err(s, "%s", msg);
}

mmp_err mmp_sched_validate(const mmp_sched *s)
{
    MMP_TRY(check_structure(s));
    int m = s->microbatches;
    int *scratch = calloc((size_t)m * 3, sizeof *scratch);
    if (!scratch) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: %d micro-batches", m);
    }
    mmp_sched_adj adj;
    mmp_err ret = mmp_sched_adj_init(&adj, s);
    for (int e = 0; e < s->n_edges && ret == MMP_OK; e++) {
        ret = check_edge(s, e, scratch, scratch + m);
    }
    for (int st = 0; st < s->n_stages && ret == MMP_OK; st++) {
        ret = check_stage(s, &adj, st, scratch, scratch + m, scratch + 2 * m);
    }
    mmp_sched_adj_fini(&adj);
    free(scratch);
    if (ret != MMP_OK) {
        return ret;
    }
    static const mmp_sim_costs no_costs;
    mmp_sched_exec *x = malloc(sizeof *x);
    if (!x) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: executor");
    }
    ret = mmp_sched_exec_init(x, s, &no_costs);
    if (ret == MMP_OK && !mmp_sched_exec_run(x)) {
        ret = mmp_sched_deadlock_err(s, x);
    }
    mmp_sched_exec_fini(x);
    free(x);
    return ret;
}
