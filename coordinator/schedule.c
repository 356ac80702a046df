/* The schedule compiler, its checker and the step simulator
 * (coordinator/schedule.h): builds the stage DAG from the plan, writes one
 * instruction list per stage, proves the lists sound before anything runs,
 * and predicts how long they take.
 *
 * Everything here is bookkeeping over small integer lists: it never touches
 * tensors, processes or channels and never blocks. Deadlock freedom is proved
 * the direct way, by executing all lists together against bounded channels
 * (the executor below); the simulator is the same executor with costs
 * attached, so what `mmpipe simulate` predicts is exactly what the checker
 * accepted. */
#include "coordinator/schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

static const char *const op_compact[] = {
    [MMP_OP_LOAD] = "L",       [MMP_OP_RECV_ACT] = "Ra",    [MMP_OP_FWD] = "F",
    [MMP_OP_SEND_ACT] = "Sa",  [MMP_OP_RECV_GRAD] = "Rg",   [MMP_OP_BWD] = "B",
    [MMP_OP_SEND_GRAD] = "Sg", [MMP_OP_GRAD_NORM] = "NORM", [MMP_OP_OPT_STEP] = "OPT",
};

static int op_valid(int op)
{
    return op >= MMP_OP_LOAD && op <= MMP_OP_OPT_STEP;
}

static int op_is_send(mmp_op op)
{
    return op == MMP_OP_SEND_ACT || op == MMP_OP_SEND_GRAD;
}

static int op_is_recv(mmp_op op)
{
    return op == MMP_OP_RECV_ACT || op == MMP_OP_RECV_GRAD;
}

static int op_is_grad(mmp_op op)
{
    return op == MMP_OP_RECV_GRAD || op == MMP_OP_SEND_GRAD;
}

/* The step's barrier and the optimizer: no micro-batch, no edge. */
static int op_is_step(mmp_op op)
{
    return op == MMP_OP_GRAD_NORM || op == MMP_OP_OPT_STEP;
}

const char *mmp_op_name(mmp_op op)
{
    return op_valid((int)op) ? op_names[op] : "?";
}

const char *mmp_instr_str(const mmp_instr *in, char *buf, size_t n)
{
    if (!op_valid((int)in->op)) {
        snprintf(buf, n, "op %d", (int)in->op);
    } else if (op_is_send(in->op) || op_is_recv(in->op)) {
        snprintf(buf, n, "%s e%d mb%d", op_names[in->op], in->edge, in->mb);
    } else if (op_is_step(in->op)) {
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
        n += E->grad == op_is_grad(op) && (op_is_send(op) ? E->from : E->to) == st;
    }
    return n;
}

const char *mmp_instr_compact(const mmp_sched *s, int stage, const mmp_instr *in, char *buf,
                              size_t n)
{
    if (!op_valid((int)in->op)) {
        snprintf(buf, n, "?%d", (int)in->op);
    } else if (op_is_step(in->op)) {
        snprintf(buf, n, "%s", op_compact[in->op]);
    } else if ((op_is_send(in->op) || op_is_recv(in->op)) && role_edges(s, stage, in->op) > 1) {
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

void mmp_sched_route(const double *speed, int R, int m, int *owner)
{
    int count[MMP_SCHED_MAX_STAGES] = {0};
    MMP_ASSERT(R >= 1 && R <= MMP_SCHED_MAX_STAGES);
    int idle = R; /* replicas dealt nothing yet */
    for (int mb = 0; mb < m; mb++) {
        int best = 0;
        if (m - mb <= idle) {
            /* The last micro-batches go to replicas that have none: each
             * replica takes part in every step (and so keeps being
             * measured), however slow it was measured. */
            while (count[best] > 0) {
                best++;
            }
        } else {
            double best_t = INFINITY;
            for (int r = 0; r < R; r++) {
                double t = (count[r] + 1) / speed[r];
                if (t < best_t * (1 - 1e-12)) {
                    best = r;
                    best_t = t;
                }
            }
        }
        owner[mb] = best;
        idle -= count[best]++ == 0;
    }
}

/* Whether process st handles micro-batch mb (a hand-made schedule without a
 * routing table: every one). */
static int owns(const mmp_sched_stage *g, int mb)
{
    return !g->owns || g->owns[mb];
}

void mmp_sched_fini(mmp_sched *s)
{
    if (!s) {
        return;
    }
    int n = s->n_stages < 0                      ? 0
            : s->n_stages > MMP_SCHED_MAX_STAGES ? MMP_SCHED_MAX_STAGES
                                                 : s->n_stages;
    for (int i = 0; i < n; i++) {
        free(s->stages[i].prog);
        free(s->stages[i].owns);
        s->stages[i].prog = NULL;
        s->stages[i].owns = NULL;
        s->stages[i].n_prog = 0;
    }
}

/* ---- the stage graph ------------------------------------------------------------ */

/* Appends replicas processes of the stage g describes. */
static mmp_err add_replicas(mmp_sched *s, const mmp_sched_stage *g, int replicas, const char *key)
{
    if (s->n_stages + replicas > MMP_SCHED_MAX_STAGES - 1) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "%s: %d replicas of %s make more than the %d processes a schedule may "
                          "have",
                          key, replicas, g->name, MMP_SCHED_MAX_STAGES);
    }
    for (int r = 0; r < replicas; r++) {
        mmp_sched_stage *h = &s->stages[s->n_stages++];
        *h = *g;
        h->replica = r;
        h->n_replicas = replicas;
    }
    return MMP_OK;
}

/* Appends one branch's sub-stages, cut at cfg's split points, each with its
 * replicas. */
static mmp_err add_branch(mmp_sched *s, mmp_stage_kind kind, const char *branch,
                          const mmp_stage_cfg *cfg, int layers)
{
    if (cfg->n_split < 0 || cfg->n_split > MMP_MAX_SPLITS) {
        return mmp_errorf(MMP_ERR_CONFIG, "stages.%s.split: %d split points (at most %d)", branch,
                          cfg->n_split, MMP_MAX_SPLITS);
    }
    int n_sub = cfg->n_split + 1;
    if (s->n_stages + n_sub + 1 > MMP_SCHED_MAX_STAGES) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "stages.%s.split: %d sub-stages leave no room for the "
                          "rest of the %d stages a schedule may have",
                          branch, n_sub, MMP_SCHED_MAX_STAGES);
    }
    int first = 0;
    for (int k = 0; k < n_sub; k++) {
        int last = k < cfg->n_split ? cfg->split[k] : layers;
        if (last <= first) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "stages.%s.split: sub-stage %s.%d would hold no layers (range "
                              "[%d, %d) of the branch's %d)",
                              branch, branch, k, first, last, layers);
        }
        mmp_sched_stage g = {0};
        snprintf(g.name, sizeof g.name, "%s.%d", branch, k);
        g.kind = kind;
        g.sub = k;
        g.n_sub = n_sub;
        g.layer_first = first;
        g.layer_last = last;
        char key[40];
        snprintf(key, sizeof key, "stages.%s.replicas", branch);
        int reps = cfg->n_replicas == n_sub ? cfg->replicas[k] : cfg->replicas[0];
        MMP_TRY(add_replicas(s, &g, cfg->n_replicas >= 1 ? reps : 1, key));
        first = last;
    }
    return MMP_OK;
}

mmp_err mmp_sched_compile(mmp_sched *s, const mmp_plan *plan)
{
    return mmp_sched_compile_routed(s, plan, NULL);
}

mmp_err mmp_sched_compile_routed(mmp_sched *s, const mmp_plan *plan, const double *speed)
{
    memset(s, 0, sizeof *s);
    MMP_TRY(
        add_branch(s, MMP_KIND_IMAGE, "image", &plan->stages.image, mmp_plan_image_layers(plan)));
    MMP_TRY(add_branch(s, MMP_KIND_TEXT, "text", &plan->stages.text, mmp_plan_text_layers(plan)));
    mmp_sched_stage f = {0};
    snprintf(f.name, sizeof f.name, "fusion");
    f.kind = MMP_KIND_FUSION;
    f.sub = 0;
    f.n_sub = 1;
    f.layer_first = 0;
    f.layer_last = 1;
    MMP_TRY(add_replicas(s, &f, mmp_plan_replicas(plan, MMP_BRANCH_FUSION, 0),
                         "stages.fusion.replicas"));
    for (int i = 0; speed && i < s->n_stages; i++) {
        s->stages[i].speed = speed[i];
    }
    return mmp_sched_compile_stages(s, plan->train.schedule, plan->train.microbatches);
}

/* The stage after branch stage i: its next sub-stage, or fusion after the last. */
static int next_stage(const mmp_sched *s, int i, int fusion)
{
    const mmp_sched_stage *g = &s->stages[i];
    if (g->sub == g->n_sub - 1) {
        return fusion;
    }
    for (int j = 0; j < s->n_stages; j++) {
        const mmp_sched_stage *h = &s->stages[j];
        if (h->kind == g->kind && h->sub == g->sub + 1 && h->replica == 0) {
            return j;
        }
    }
    return -1;
}

/* Checks the caller-filled graph fields and finds the fusion stage. */
static mmp_err check_graph(const mmp_sched *s, int *fusion)
{
    if (s->n_stages < 1 || s->n_stages > MMP_SCHED_MAX_STAGES) {
        return mmp_errorf(MMP_ERR_CONFIG, "schedule: %d stages (1 to %d)", s->n_stages,
                          MMP_SCHED_MAX_STAGES);
    }
    *fusion = -1;
    for (int i = 0; i < s->n_stages; i++) {
        const mmp_sched_stage *g = &s->stages[i];
        if (g->n_replicas < 1 || g->replica < 0 || g->replica >= g->n_replicas ||
            !(g->speed > 0) || !isfinite(g->speed)) {
            return mmp_errorf(MMP_ERR_CONFIG, "schedule: stage %s is replica %d of %d, speed %g",
                              g->name, g->replica, g->n_replicas, g->speed);
        }
        if (g->replica > 0) {
            const mmp_sched_stage *h = &s->stages[i - 1];
            if (strcmp(h->name, g->name) != 0 || h->replica != g->replica - 1 ||
                h->n_replicas != g->n_replicas || h->kind != g->kind || h->sub != g->sub ||
                h->layer_first != g->layer_first || h->layer_last != g->layer_last) {
                return mmp_errorf(MMP_ERR_CONFIG,
                                  "schedule: replica %d of %s does not follow replica %d of it",
                                  g->replica, g->name, g->replica - 1);
            }
            continue;
        }
        if (g->kind == MMP_KIND_FUSION) {
            if (*fusion >= 0) {
                return mmp_errorf(MMP_ERR_CONFIG, "schedule: two fusion stages (%s and %s)",
                                  s->stages[*fusion].name, g->name);
            }
            *fusion = i;
        } else if (g->kind != MMP_KIND_IMAGE && g->kind != MMP_KIND_TEXT) {
            return mmp_errorf(MMP_ERR_CONFIG, "schedule: stage %d has unknown kind %d", i,
                              (int)g->kind);
        } else if (g->sub < 0 || g->sub >= g->n_sub) {
            return mmp_errorf(MMP_ERR_CONFIG, "schedule: stage %s is sub-stage %d of %d", g->name,
                              g->sub, g->n_sub);
        }
        for (int j = 0; j < i; j++) {
            const mmp_sched_stage *h = &s->stages[j];
            if (h->replica > 0) {
                continue;
            }
            if (strcmp(h->name, g->name) == 0) {
                return mmp_errorf(MMP_ERR_CONFIG, "schedule: two stages named %s", g->name);
            }
            if (g->kind != MMP_KIND_FUSION && h->kind == g->kind &&
                (h->sub == g->sub || h->n_sub != g->n_sub)) {
                return mmp_errorf(MMP_ERR_CONFIG,
                                  "schedule: stages %s (sub %d of %d) and %s (sub %d of %d) do "
                                  "not cut one branch",
                                  h->name, h->sub, h->n_sub, g->name, g->sub, g->n_sub);
            }
        }
    }
    if (*fusion < 0) {
        return mmp_errorf(MMP_ERR_CONFIG, "schedule: no fusion stage");
    }
    return MMP_OK;
}

static void add_edge(mmp_sched *s, int from, int to, int grad)
{
    MMP_ASSERT(s->n_edges < MMP_SCHED_MAX_EDGES);
    s->edges[s->n_edges++] = (mmp_sched_edge){.from = from, .to = to, .grad = grad, .slots = 0};
}

/* ---- lists ------------------------------------------------------------------ */

typedef struct builder {
    mmp_instr *p;
    int n, cap;
} builder;

static void put(builder *b, mmp_op op, int mb, int edge)
{
    MMP_ASSERT(b->n < b->cap);
    b->p[b->n++] = (mmp_instr){.op = op, .mb = mb, .edge = edge};
}

/* Micro-batch mb's forward with its inputs and outputs: LOAD where the stage
 * has no input edge, else a RECV_ACT per input (in edge order: image before
 * text at fusion); then FWD; then a SEND_ACT per output. */
/* Whether micro-batch mb travels on edge e: both ends handle it. */
static int edge_carries(const mmp_sched *s, int e, int mb)
{
    return owns(&s->stages[s->edges[e].from], mb) && owns(&s->stages[s->edges[e].to], mb);
}

/* Whether stage st receives activations (else it loads its inputs). */
static int has_inputs(const mmp_sched *s, int st)
{
    for (int e = 0; e < s->n_edges; e++) {
        if (!s->edges[e].grad && s->edges[e].to == st) {
            return 1;
        }
    }
    return 0;
}

static void put_forward(const mmp_sched *s, int st, builder *b, int mb)
{
    for (int e = 0; e < s->n_edges; e++) {
        if (!s->edges[e].grad && s->edges[e].to == st && edge_carries(s, e, mb)) {
            put(b, MMP_OP_RECV_ACT, mb, e);
        }
    }
    if (!has_inputs(s, st)) {
        put(b, MMP_OP_LOAD, mb, -1);
    }
    put(b, MMP_OP_FWD, mb, -1);
    for (int e = 0; e < s->n_edges; e++) {
        if (!s->edges[e].grad && s->edges[e].from == st && edge_carries(s, e, mb)) {
            put(b, MMP_OP_SEND_ACT, mb, e);
        }
    }
}

static void put_backward(const mmp_sched *s, int st, builder *b, int mb)
{
    for (int e = 0; e < s->n_edges; e++) {
        if (s->edges[e].grad && s->edges[e].to == st && edge_carries(s, e, mb)) {
            put(b, MMP_OP_RECV_GRAD, mb, e);
        }
    }
    put(b, MMP_OP_BWD, mb, -1);
    for (int e = 0; e < s->n_edges; e++) {
        if (s->edges[e].grad && s->edges[e].from == st && edge_carries(s, e, mb)) {
            put(b, MMP_OP_SEND_GRAD, mb, e);
        }
    }
}

/* Writes stage st's list. A stage that sends no activations (fusion) computes
 * the loss and runs its backward at once in both schedules: F0 B0 F1 B1 ...
 * Others run `warm` forwards, then alternate F(warm+i) B(i), then drain the
 * backwards: GPipe warms up with all m, 1F1B with depth - 1. Backwards are in
 * ascending micro-batch order either way. */
static mmp_err build_list(mmp_sched *s, int st)
{
    mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches;
    /* A micro-batch's forward and backward each take at most one receive,
     * one load and one send per branch input plus the compute. */
    builder b = {.n = 0, .cap = g->n_owned * 8 + 2};
    b.p = malloc((size_t)b.cap * sizeof *b.p);
    if (!b.p) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: stage %s: %d instructions", g->name, b.cap);
    }
    /* The stage's order; this replica keeps its own micro-batches' part. */
    int warm = g->warm;
    for (int i = 0; i < warm; i++) {
        if (owns(g, i)) {
            put_forward(s, st, &b, i);
        }
    }
    for (int i = 0; i < m - warm; i++) {
        if (owns(g, warm + i)) {
            put_forward(s, st, &b, warm + i);
        }
        if (owns(g, i)) {
            put_backward(s, st, &b, i);
        }
    }
    for (int i = m - warm; i < m; i++) {
        if (owns(g, i)) {
            put_backward(s, st, &b, i);
        }
    }
    put(&b, MMP_OP_GRAD_NORM, -1, -1);
    put(&b, MMP_OP_OPT_STEP, -1, -1);
    g->prog = b.p;
    g->n_prog = b.n;
    return MMP_OK;
}

/* Most micro-batches forwarded and not yet backwarded at any point of the
 * list; *at is the FWD that first exceeds bound (-1 if none). */
static int list_inflight(const mmp_sched_stage *g, int bound, int *at)
{
    int cur = 0, max = 0;
    *at = -1;
    for (int pc = 0; pc < g->n_prog; pc++) {
        cur += g->prog[pc].op == MMP_OP_FWD;
        cur -= g->prog[pc].op == MMP_OP_BWD;
        if (cur > max) {
            max = cur;
            if (max > bound && *at < 0) {
                *at = pc;
            }
        }
    }
    return max;
}

mmp_err mmp_sched_compile_stages(mmp_sched *s, mmp_schedule kind, int microbatches)
{
    s->n_edges = 0;
    for (int i = 0; i < MMP_SCHED_MAX_STAGES; i++) {
        s->stages[i].prog = NULL;
        s->stages[i].n_prog = 0;
        s->stages[i].owns = NULL;
    }
    if (kind != MMP_SCHED_GPIPE && kind != MMP_SCHED_1F1B) {
        return mmp_errorf(MMP_ERR_CONFIG, "train.schedule: unknown schedule %d", (int)kind);
    }
    if (microbatches < 1) {
        return mmp_errorf(MMP_ERR_CONFIG, "train.microbatches: %d (at least 1)", microbatches);
    }
    s->kind = kind;
    s->microbatches = microbatches;
    if (s->n_stages < 1 || s->n_stages > MMP_SCHED_MAX_STAGES) {
        return mmp_errorf(MMP_ERR_CONFIG, "schedule: %d processes (1 to %d)", s->n_stages,
                          MMP_SCHED_MAX_STAGES);
    }
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        g->owns = NULL;
        g->n_owned = 0;
        if (g->n_replicas == 0 && g->replica == 0) {
            g->n_replicas = 1;
        }
        if (g->speed == 0) {
            g->speed = 1;
        }
        char name[sizeof g->name];
        memcpy(name, g->name, sizeof name); /* not name and proc of one struct in one call */
        name[sizeof name - 1] = 0;
        snprintf(g->proc, sizeof g->proc, "%s/%d", name, g->replica);
    }
    int fusion = -1;
    MMP_TRY(check_graph(s, &fusion));
    int m = microbatches;
    /* Routing: each stage's micro-batches dealt among its replicas. */
    int *owner = malloc((size_t)m * sizeof *owner);
    if (!owner) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: %d micro-batches", m);
    }
    for (int i = 0; i < s->n_stages; i += s->stages[i].n_replicas) {
        int R = s->stages[i].n_replicas;
        double speed[MMP_SCHED_MAX_STAGES];
        for (int r = 0; r < R; r++) {
            speed[r] = s->stages[i + r].speed;
        }
        mmp_sched_route(speed, R, m, owner);
        for (int r = 0; r < R; r++) {
            mmp_sched_stage *g = &s->stages[i + r];
            g->owns = calloc((size_t)m, 1);
            if (!g->owns) {
                free(owner);
                return mmp_errorf(MMP_ERR_NOMEM, "schedule: routing of %d micro-batches", m);
            }
            for (int mb = 0; mb < m; mb++) {
                g->owns[mb] = owner[mb] == r;
                g->n_owned += owner[mb] == r;
            }
        }
    }
    free(owner);
    /* Per replica pair of consecutive stages, edge 2k carries activations,
     * edge 2k+1 the paired gradients back. */
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        if (g->kind == MMP_KIND_FUSION) {
            g->depth = 1;
            continue;
        }
        int next = next_stage(s, i, fusion);
        if (next < 0) {
            return mmp_errorf(MMP_ERR_CONFIG, "schedule: stage %s: no sub-stage %d after it",
                              g->name, g->sub + 1);
        }
        int R = s->stages[next].n_replicas;
        if (s->n_edges + 2 * R > MMP_SCHED_MAX_EDGES) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "schedule: the replicas' edges are more than the %d a schedule may "
                              "have (every replica pair of consecutive stages needs two)",
                              MMP_SCHED_MAX_EDGES);
        }
        for (int r = 0; r < R; r++) {
            add_edge(s, i, next + r, 0);
            add_edge(s, next + r, i, 1);
        }
        g->depth = g->n_sub - g->sub + 1;
    }
    /* Warm-ups, from fusion (a sink: each backward right after its forward)
     * back along each branch: a stage must send at least one micro-batch
     * more than the next stage takes in before that one's first backward. */
    for (int i = 0; i < s->n_stages; i++) {
        s->stages[i].warm = 0;
    }
    /* Until nothing changes: at most one sweep per sub-stage of a branch
     * (stages may be listed in any order). */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = s->n_stages - 1; i >= 0; i--) {
            mmp_sched_stage *g = &s->stages[i];
            if (g->kind == MMP_KIND_FUSION) {
                continue;
            }
            int after = s->stages[next_stage(s, i, fusion)].warm + 1;
            int w = g->n_replicas * g->depth - 1;
            w = kind == MMP_SCHED_GPIPE ? m : w > after ? w : after;
            w = w < m ? w : m;
            changed |= w != g->warm;
            g->warm = w;
        }
    }
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        g->stage_bound = kind == MMP_SCHED_GPIPE || g->warm + 1 >= m ? m : g->warm + 1;
        g->inflight_bound = g->n_owned < g->stage_bound ? g->n_owned : g->stage_bound;
        if (g->inflight_bound < 1) {
            g->inflight_bound = 1; /* a replica routed no micro-batch holds none */
        }
    }
    /* A message on an act edge belongs to a micro-batch its producer holds in
     * flight until the gradient comes back, and one on the paired grad edge
     * to a micro-batch its consumer holds: the producer's bound covers both.
     * The bound any routing allows, so a new routing keeps the channels. */
    for (int e = 0; e < s->n_edges; e += 2) {
        s->edges[e].slots = s->stages[s->edges[e].from].stage_bound;
        s->edges[e + 1].slots = s->edges[e].slots;
    }
    for (int i = 0; i < s->n_stages; i++) {
        MMP_TRY(build_list(s, i));
        int at;
        s->stages[i].max_inflight = list_inflight(&s->stages[i], s->stages[i].inflight_bound, &at);
    }
    return mmp_sched_validate(s);
}

/* ---- the executor --------------------------------------------------------------- */

/* Runs every list together, one instruction at a time, with bounded
 * channels. Its channel model must stay at least as strict as the runtime's
 * ring (transport/channel.h): message k on an edge takes slot k % slots, so it
 * can be sent only once message k - slots has been released, and a message is
 * released when the receiving stage finishes the first FWD or BWD after its
 * RECV (that compute reads it in place). GRAD_NORM is a barrier over all
 * stages. Times follow the costs; with all-zero costs it is the plain
 * lock-step check. The result does not depend on the order stages are
 * visited in: every instruction's time is a max over its own predecessors. */
typedef struct exec_edge {
    int n_msgs; /* sends on the edge in the lists */
    int sent, received, released;
    double *arrive; /* [n_msgs] when message k can be received */
    double *freed;  /* [n_msgs] when message k's slot was released */
} exec_edge;

typedef struct exec_stage {
    int pc;
    double t, busy;
    int *held; /* edges of received messages not released yet, in receive order */
    int n_held;
    int at_barrier;
} exec_stage;

typedef struct sched_exec {
    const mmp_sched *s;
    const mmp_sim_costs *c;
    exec_edge edges[MMP_SCHED_MAX_EDGES];
    exec_stage stages[MMP_SCHED_MAX_STAGES];
    int n_at_barrier;
    double barrier_t;
    double *times; /* backs every edge's arrive and freed */
    int *held;     /* backs every stage's held */
} sched_exec;

static void exec_fini(sched_exec *x)
{
    free(x->times);
    free(x->held);
    x->times = NULL;
    x->held = NULL;
}

/* s must have passed check_structure. */
static mmp_err exec_init(sched_exec *x, const mmp_sched *s, const mmp_sim_costs *c)
{
    memset(x, 0, sizeof *x);
    x->s = s;
    x->c = c;
    size_t msgs = 0, instrs = 0;
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        for (int pc = 0; pc < g->n_prog; pc++) {
            if (op_is_send(g->prog[pc].op)) {
                x->edges[g->prog[pc].edge].n_msgs++;
                msgs++;
            }
        }
        instrs += (size_t)g->n_prog;
    }
    x->times = malloc((2 * msgs + 1) * sizeof *x->times);
    x->held = malloc((instrs + 1) * sizeof *x->held);
    if (!x->times || !x->held) {
        exec_fini(x);
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
static int exec_step(sched_exec *x, int st)
{
    const mmp_sched_stage *g = &x->s->stages[st];
    exec_stage *xs = &x->stages[st];
    if (xs->pc >= g->n_prog) {
        return 0;
    }
    const mmp_instr *in = &g->prog[xs->pc];
    const mmp_sim_costs *c = x->c;
    switch (in->op) {
    case MMP_OP_LOAD:
    case MMP_OP_FWD:
    case MMP_OP_BWD: {
        double cost = in->op == MMP_OP_LOAD  ? c->load_ms[st]
                      : in->op == MMP_OP_FWD ? c->fwd_ms[st]
                                             : c->bwd_ms[st];
        xs->t += cost;
        xs->busy += cost;
        if (in->op != MMP_OP_LOAD) {
            for (int k = 0; k < xs->n_held; k++) {
                exec_edge *E = &x->edges[xs->held[k]];
                E->freed[E->released++] = xs->t;
            }
            xs->n_held = 0;
        }
        break;
    }
    case MMP_OP_SEND_ACT:
    case MMP_OP_SEND_GRAD: {
        exec_edge *E = &x->edges[in->edge];
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
        exec_edge *E = &x->edges[in->edge];
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
static int exec_run(sched_exec *x)
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

/* ---- validation ----------------------------------------------------------------- */

/* The process's name for messages ("image.0/1"), or the stage's. */
static const char *pname(const mmp_sched_stage *g)
{
    return g->proc[0] && g->n_replicas > 1 ? g->proc : g->name;
}


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
        return sched_err(s, "stage %s: %s", pname(&s->stages[st]), why);
    }
    return sched_err(s, "stage %s instr %d (%s): %s", pname(&s->stages[st]), pc,
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
    if (s->kind != MMP_SCHED_GPIPE && s->kind != MMP_SCHED_1F1B) {
        return mmp_errorf(MMP_ERR_INTERNAL, "schedule: unknown kind %d", (int)s->kind);
    }
    int m = s->microbatches;
    if (m < 1) {
        return sched_err(s, "%d micro-batches", m);
    }
    if (s->n_stages < 1 || s->n_stages > MMP_SCHED_MAX_STAGES || s->n_edges < 0 ||
        s->n_edges > MMP_SCHED_MAX_EDGES) {
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
            if (strcmp(s->stages[j].name, g->name) == 0 &&
                s->stages[j].replica == g->replica) {
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
            if (!op_valid((int)in->op)) {
                return stage_err(s, st, pc, "unknown op");
            }
            if (op_is_step(in->op)) {
                if (in->mb != -1 || in->edge != -1) {
                    return stage_err(s, st, pc, "takes no micro-batch and no edge");
                }
                continue;
            }
            if (in->mb < 0 || in->mb >= m) {
                return stage_err(s, st, pc, "mb%d is outside 0..%d", in->mb, m - 1);
            }
            if (!op_is_send(in->op) && !op_is_recv(in->op)) {
                if (in->edge != -1) {
                    return stage_err(s, st, pc, "a compute instruction names edge e%d", in->edge);
                }
                continue;
            }
            if (in->edge < 0 || in->edge >= s->n_edges) {
                return stage_err(s, st, pc, "no edge e%d (there are %d)", in->edge, s->n_edges);
            }
            const mmp_sched_edge *E = &s->edges[in->edge];
            if (E->grad != op_is_grad(in->op)) {
                return stage_err(s, st, pc, "e%d carries %s", in->edge, carries(E->grad));
            }
            if ((op_is_send(in->op) ? E->from : E->to) != st) {
                return stage_err(s, st, pc, "e%d runs from %s to %s: this stage does not %s on it",
                                 in->edge, pname(&s->stages[E->from]), pname(&s->stages[E->to]),
                                 op_is_send(in->op) ? "send" : "receive");
            }
        }
    }
    return MMP_OK;
}

/* Per edge: every receive has its send and vice versa, in the same order. */
static mmp_err check_edge(const mmp_sched *s, int e, int *sent_n, int *recv_n)
{
    const mmp_sched_edge *E = &s->edges[e];
    const mmp_sched_stage *src = &s->stages[E->from], *dst = &s->stages[E->to];
    mmp_op sop = E->grad ? MMP_OP_SEND_GRAD : MMP_OP_SEND_ACT;
    mmp_op rop = E->grad ? MMP_OP_RECV_GRAD : MMP_OP_RECV_ACT;
    int m = s->microbatches;
    memset(sent_n, 0, (size_t)m * sizeof *sent_n);
    memset(recv_n, 0, (size_t)m * sizeof *recv_n);
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
                                 pname(src), in->mb, e);
            }
            return stage_err(s, E->to, pc, "mb%d is received %d times on e%d but sent %d times",
                             in->mb, recv_n[in->mb], e, sent_n[in->mb]);
        }
    }
    for (int pc = 0; pc < src->n_prog; pc++) {
        const mmp_instr *in = &src->prog[pc];
        if (in->op == sop && in->edge == e && !recv_n[in->mb]) {
            return stage_err(s, E->from, pc, "no matching receive: %s never receives mb%d on e%d",
                             pname(dst), in->mb, e);
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
                             e, k, dst->prog[rp].mb, k, pname(src), sp, src->prog[sp].mb);
        }
        sp++;
        rp++;
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
        int routed = e < 0 ? owns(g, mb) : edge_carries(s, e, mb);
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
static mmp_err check_stage(const mmp_sched *s, int st, int *fwd_at, int *bwd_at, int *at)
{
    const mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches, n = g->n_prog;
    for (int mb = 0; mb < m; mb++) {
        fwd_at[mb] = bwd_at[mb] = -1;
    }
    int inputs = 0;
    for (int e = 0; e < s->n_edges; e++) {
        inputs += !s->edges[e].grad && s->edges[e].to == st;
    }
    if (n < 2 || g->prog[n - 2].op != MMP_OP_GRAD_NORM || g->prog[n - 1].op != MMP_OP_OPT_STEP) {
        return stage_err(s, st, -1, "the list must end with GRAD_NORM, OPT_STEP");
    }
    for (int pc = 0; pc < n; pc++) {
        const mmp_instr *in = &g->prog[pc];
        int *slot = in->op == MMP_OP_FWD ? fwd_at : in->op == MMP_OP_BWD ? bwd_at : NULL;
        if (slot) {
            if (slot[in->mb] >= 0) {
                return stage_err(s, st, pc, "repeats instr %d", slot[in->mb]);
            }
            slot[in->mb] = pc;
        } else if (op_is_step(in->op) && pc != n - 2 + (in->op == MMP_OP_OPT_STEP)) {
            return stage_err(s, st, pc,
                             "only the list's last two instructions are GRAD_NORM, "
                             "OPT_STEP");
        } else if (in->op == MMP_OP_LOAD && inputs) {
            return stage_err(s, st, pc, "a stage that receives its inputs does not load them");
        }
    }
    for (int mb = 0; mb < m; mb++) {
        if (!owns(g, mb)) {
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
    if (!inputs) {
        MMP_TRY(check_role(s, st, MMP_OP_LOAD, -1, fwd_at, "FWD", 1, at));
    }
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        if (E->to == st) {
            MMP_TRY(check_role(s, st, E->grad ? MMP_OP_RECV_GRAD : MMP_OP_RECV_ACT, e,
                               E->grad ? bwd_at : fwd_at, E->grad ? "BWD" : "FWD", 1, at));
        }
        if (E->from == st) {
            MMP_TRY(check_role(s, st, E->grad ? MMP_OP_SEND_GRAD : MMP_OP_SEND_ACT, e,
                               E->grad ? bwd_at : fwd_at, E->grad ? "BWD" : "FWD", 0, at));
        }
    }
    int over;
    list_inflight(g, g->inflight_bound, &over);
    if (over >= 0) {
        return stage_err(s, st, over, "%d micro-batches in flight, more than the bound %d",
                         g->inflight_bound + 1, g->inflight_bound);
    }
    return MMP_OK;
}

/* Which stage blocked stage st waits on (-1: none), and why, in words. */
static int waits_on(const mmp_sched *s, const sched_exec *x, int st, char *why, size_t n)
{
    const mmp_instr *in = &s->stages[st].prog[x->stages[st].pc];
    if (in->op == MMP_OP_GRAD_NORM) {
        for (int j = 0; j < s->n_stages; j++) {
            if (!x->stages[j].at_barrier) {
                snprintf(why, n, "waits at the GRAD_NORM barrier for %s", pname(&s->stages[j]));
                return j;
            }
        }
        return -1;
    }
    const mmp_sched_edge *E = &s->edges[in->edge];
    if (op_is_recv(in->op)) {
        snprintf(why, n, "waits for %s to send it", pname(&s->stages[E->from]));
        return E->from;
    }
    snprintf(why, n, "waits for a free slot: all %d slots of e%d hold messages %s has not released",
             E->slots, in->edge, pname(&s->stages[E->to]));
    return E->to;
}

/* Names the cycle of waits that stops the lists (or, failing one, every
 * blocked stage). */
static mmp_err deadlock_err(const mmp_sched *s, const sched_exec *x)
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
                                k > cycle_from ? "; " : "", pname(&s->stages[st]), pc,
                                mmp_instr_str(&s->stages[st].prog[pc], ins, sizeof ins), why);
    }
    return sched_err(s, "%s", msg);
}

mmp_err mmp_sched_validate(const mmp_sched *s)
{
    MMP_TRY(check_structure(s));
    int m = s->microbatches;
    int *scratch = malloc((size_t)m * 3 * sizeof *scratch);
    if (!scratch) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: %d micro-batches", m);
    }
    mmp_err ret = MMP_OK;
    for (int e = 0; e < s->n_edges && ret == MMP_OK; e++) {
        ret = check_edge(s, e, scratch, scratch + m);
    }
    for (int st = 0; st < s->n_stages && ret == MMP_OK; st++) {
        ret = check_stage(s, st, scratch, scratch + m, scratch + 2 * m);
    }
    free(scratch);
    if (ret != MMP_OK) {
        return ret;
    }
    static const mmp_sim_costs no_costs;
    sched_exec *x = malloc(sizeof *x);
    if (!x) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: executor");
    }
    ret = exec_init(x, s, &no_costs);
    if (ret == MMP_OK && !exec_run(x)) {
        ret = deadlock_err(s, x);
    }
    exec_fini(x);
    free(x);
    return ret;
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
        if (!is_cost(c->fwd_ms[st]) || !is_cost(c->bwd_ms[st]) || !is_cost(c->load_ms[st])) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "simulate: stage %s: costs fwd %g bwd %g load %g ms (each must be "
                              "finite and >= 0)",
                              pname(&s->stages[st]), c->fwd_ms[st], c->bwd_ms[st], c->load_ms[st]);
        }
    }
    if (!is_cost(c->send_ms) || !is_cost(c->step_overhead_ms)) {
        return mmp_errorf(
            MMP_ERR_INVALID,
            "simulate: send %g ms, step overhead %g ms (each must be finite and >= 0)", c->send_ms,
            c->step_overhead_ms);
    }
    sched_exec *x = malloc(sizeof *x);
    if (!x) {
        return mmp_errorf(MMP_ERR_NOMEM, "simulate: executor");
    }
    mmp_err ret = exec_init(x, s, c);
    if (ret == MMP_OK && !exec_run(x)) {
        ret = deadlock_err(s, x); /* validation ran the same lists: never expected */
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
    exec_fini(x);
    free(x);
    return ret;
}
