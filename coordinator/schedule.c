/* The schedule's vocabulary (coordinator/schedule.h): instruction names and
 * forms, and the small lookups the compiler, the checker and the simulator
 * all use (coordinator/schedule_internal.h). The three jobs live in
 * schedule_compile.c, schedule_validate.c and schedule_simulate.c.
 *
 * Everything here is bookkeeping over small integer lists: it never touches
 * tensors, processes or channels and never blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/schedule_internal.h"

/* ---- names ------------------------------------------------------------------- */

static const char *const op_names[] = {
    [MMP_OP_LOAD] = "LOAD",
    [MMP_OP_RECV_ACT] = "RECV_ACT",
    [MMP_OP_FWD] = "FWD",
    [MMP_OP_SEND_ACT] = "SEND_ACT",
    [MMP_OP_RECV_GRAD] = "RECV_GRAD",
    [MMP_OP_BWD] = "BWD",
    [MMP_OP_SEND_GRAD] = "SEND_GRAD",
    [MMP_OP_GRAD_NORM] = "GRAD_NORM",
    [MMP_OP_OPT_STEP] = "OPT_STEP",
    [MMP_OP_BWD_INPUT] = "BWD_INPUT",
    [MMP_OP_BWD_WEIGHT] = "BWD_WEIGHT",
};

static const char *const op_compact[] = {
    [MMP_OP_LOAD] = "L",       [MMP_OP_RECV_ACT] = "Ra",    [MMP_OP_FWD] = "F",
    [MMP_OP_SEND_ACT] = "Sa",  [MMP_OP_RECV_GRAD] = "Rg",   [MMP_OP_BWD] = "B",
    [MMP_OP_SEND_GRAD] = "Sg", [MMP_OP_GRAD_NORM] = "NORM", [MMP_OP_OPT_STEP] = "OPT",
    [MMP_OP_BWD_INPUT] = "Bi", [MMP_OP_BWD_WEIGHT] = "W",
};

int mmp_op_valid(int op)
{
    return op >= MMP_OP_LOAD && op <= MMP_OP_BWD_WEIGHT;
}

int mmp_op_is_send(mmp_op op)
{
    return op == MMP_OP_SEND_ACT || op == MMP_OP_SEND_GRAD;
}

int mmp_op_is_recv(mmp_op op)
{
    return op == MMP_OP_RECV_ACT || op == MMP_OP_RECV_GRAD;
}

int mmp_op_is_grad(mmp_op op)
{
    return op == MMP_OP_RECV_GRAD || op == MMP_OP_SEND_GRAD;
}

/* A backward that frees received messages: BWD or zb-h1's BWD_INPUT. */
int mmp_op_is_bwd(mmp_op op)
{
    return op == MMP_OP_BWD || op == MMP_OP_BWD_INPUT;
}

/* The step's barrier and the optimizer: no micro-batch, no edge. */
int mmp_op_is_step(mmp_op op)
{
    return op == MMP_OP_GRAD_NORM || op == MMP_OP_OPT_STEP;
}

const char *mmp_op_name(mmp_op op)
{
    return mmp_op_valid((int)op) ? op_names[op] : "?";
}

const char *mmp_instr_str(const mmp_instr *in, char *buf, size_t n)
{
    if (!mmp_op_valid((int)in->op)) {
        snprintf(buf, n, "op %d", (int)in->op);
    } else if (mmp_op_is_send(in->op) || mmp_op_is_recv(in->op)) {
        snprintf(buf, n, "%s e%d mb%d", op_names[in->op], in->edge, in->mb);
    } else if (mmp_op_is_step(in->op)) {
        snprintf(buf, n, "%s", op_names[in->op]);
    } else {
        snprintf(buf, n, "%s mb%d", op_names[in->op], in->mb);
    }
    return buf;
}

/* Edges of s on which stage st plays the role op implies (sends / receives,
 * activations / gradients). */
static int role_edges(const mmp_sched *s, int st, mmp_op op)
{
    int n = 0;
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        n += E->grad == mmp_op_is_grad(op) && (mmp_op_is_send(op) ? E->from : E->to) == st;
    }
    return n;
}

const char *mmp_instr_compact(const mmp_sched *s, int stage, const mmp_instr *in, char *buf,
                              size_t n)
{
    if (!mmp_op_valid((int)in->op)) {
        snprintf(buf, n, "?%d", (int)in->op);
    } else if (mmp_op_is_step(in->op)) {
        snprintf(buf, n, "%s", op_compact[in->op]);
    } else if ((mmp_op_is_send(in->op) || mmp_op_is_recv(in->op)) &&
               role_edges(s, stage, in->op) > 1) {
        snprintf(buf, n, "%s%d:e%d", op_compact[in->op], in->mb, in->edge);
    } else {
        snprintf(buf, n, "%s%d", op_compact[in->op], in->mb);
    }
    return buf;
}

int mmp_sched_find(const mmp_sched *s, const char *name)
{
    for (int i = 0; i < s->n_stages; i++) {
        if (strcmp(s->stages[i].name, name) == 0 || strcmp(s->stages[i].proc, name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Whether process st handles micro-batch mb (a hand-made schedule without a
 * routing table: every one). */
int mmp_sched_owns(const mmp_sched_stage *g, int mb)
{
    return !g->owns || g->owns[mb];
}

/* Whether micro-batch mb travels on edge e: both ends handle it. */
int mmp_sched_edge_carries(const mmp_sched *s, int e, int mb)
{
    return mmp_sched_owns(&s->stages[s->edges[e].from], mb) &&
           mmp_sched_owns(&s->stages[s->edges[e].to], mb);
}

/* The process's name for messages ("image.0/1"), or the stage's. */
const char *mmp_sched_pname(const mmp_sched_stage *g)
{
    return g->proc[0] && g->n_replicas > 1 ? g->proc : g->name;
}

/* Most micro-batches forwarded and not yet backwarded at any point of the
 * list (a split backward holds its micro-batch until BWD_WEIGHT); *at is the
 * FWD that first exceeds bound (-1 if none). */
int mmp_sched_list_inflight(const mmp_sched_stage *g, int bound, int *at)
{
    int cur = 0, max = 0;
    *at = -1;
    for (int pc = 0; pc < g->n_prog; pc++) {
        cur += g->prog[pc].op == MMP_OP_FWD;
        cur -= g->prog[pc].op == MMP_OP_BWD || g->prog[pc].op == MMP_OP_BWD_WEIGHT;
        if (cur > max) {
            max = cur;
            if (max > bound && *at < 0) {
                *at = pc;
            }
        }
    }
    return max;
}

void mmp_sched_adj_fini(mmp_sched_adj *a)
{
    free(a->in_at);
    free(a->in);
    free(a->out_at);
    free(a->out);
    *a = (mmp_sched_adj){0};
}

mmp_err mmp_sched_adj_init(mmp_sched_adj *a, const mmp_sched *s)
{
    int n = s->n_stages, E = s->n_edges;
    a->in_at = calloc((size_t)n + 1, sizeof *a->in_at);
    a->out_at = calloc((size_t)n + 1, sizeof *a->out_at);
    a->in = malloc(((size_t)E + 1) * sizeof *a->in);
    a->out = malloc(((size_t)E + 1) * sizeof *a->out);
    if (!a->in_at || !a->out_at || !a->in || !a->out) {
        mmp_sched_adj_fini(a);
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: the index of %d edges", E);
    }
    for (int e = 0; e < E; e++) {
        a->in_at[s->edges[e].to + 1]++;
        a->out_at[s->edges[e].from + 1]++;
    }
    for (int i = 0; i < n; i++) {
        a->in_at[i + 1] += a->in_at[i];
        a->out_at[i + 1] += a->out_at[i];
    }
    int *in_n = calloc((size_t)n + 1, sizeof *in_n), *out_n = calloc((size_t)n + 1, sizeof *out_n);
    if (!in_n || !out_n) {
        free(in_n);
        free(out_n);
        mmp_sched_adj_fini(a);
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: the index of %d edges", E);
    }
    for (int e = 0; e < E; e++) {
        int t = s->edges[e].to, f = s->edges[e].from;
        a->in[a->in_at[t] + in_n[t]++] = e;
        a->out[a->out_at[f] + out_n[f]++] = e;
    }
    free(in_n);
    free(out_n);
    return MMP_OK;
}
