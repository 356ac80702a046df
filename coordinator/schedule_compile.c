/* The schedule compiler (coordinator/schedule.h): builds the stage DAG from
 * the plan (splits, replicas), deals micro-batches to replicas, writes one
 * instruction list per process and hands the result to the checker
 * (schedule_validate.c) before anyone may run it.
 *
 * Bookkeeping over small integer lists only: it never touches tensors,
 * processes or channels and never blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/schedule_internal.h"

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
    free(s->edges);
    s->edges = NULL;
    s->n_edges = 0;
}

/* ---- the stage graph ------------------------------------------------------------ */

/* Appends replicas processes of the stage g describes. */
static mmp_err add_replicas(mmp_sched *s, const mmp_sched_stage *g, int replicas, const char *key)
{
    if (replicas > MMP_SCHED_MAX_STAGES - s->n_stages) { /* no overflow at INT_MAX */
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
                          "rest of the %d processes a schedule may have",
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
    s->batch_loss = plan->model.fusion.itc_scope == MMP_ITC_BATCH;
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
        if (g->n_replicas < 1 || g->replica < 0 || g->replica >= g->n_replicas || !(g->speed > 0) ||
            !isfinite(g->speed)) {
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

static void add_edge(mmp_sched *s, int cap, int from, int to, int grad)
{
    MMP_ASSERT(s->n_edges < cap);
    s->edges[s->n_edges++] = (mmp_sched_edge){.from = from, .to = to, .grad = grad, .slots = 0};
}

/* ---- lists ------------------------------------------------------------------ */

typedef struct builder {
    mmp_instr *p;
    int n, cap;
    const mmp_sched_adj *adj;
} builder;

static void put(builder *b, mmp_op op, int mb, int edge)
{
    MMP_ASSERT(b->n < b->cap);
    b->p[b->n++] = (mmp_instr){.op = op, .mb = mb, .edge = edge};
}

/* Whether stage st receives activations (else it loads its inputs). */
static int has_inputs(const mmp_sched *s, const mmp_sched_adj *a, int st)
{
    for (int k = a->in_at[st]; k < a->in_at[st + 1]; k++) {
        if (!s->edges[a->in[k]].grad) {
            return 1;
        }
    }
    return 0;
}

/* Micro-batch mb's forward with its inputs and outputs: LOAD where the stage
 * has no input edge, else a RECV_ACT per input (in edge order: image before
 * text at fusion); then FWD; then a SEND_ACT per output. */
static void put_forward(const mmp_sched *s, int st, builder *b, int mb)
{
    const mmp_sched_adj *a = b->adj;
    for (int k = a->in_at[st]; k < a->in_at[st + 1]; k++) {
        int e = a->in[k];
        if (!s->edges[e].grad && mmp_sched_edge_carries(s, e, mb)) {
            put(b, MMP_OP_RECV_ACT, mb, e);
        }
    }
    if (!has_inputs(s, a, st)) {
        put(b, MMP_OP_LOAD, mb, -1);
    }
    put(b, MMP_OP_FWD, mb, -1);
    for (int k = a->out_at[st]; k < a->out_at[st + 1]; k++) {
        int e = a->out[k];
        if (!s->edges[e].grad && mmp_sched_edge_carries(s, e, mb)) {
            put(b, MMP_OP_SEND_ACT, mb, e);
        }
    }
}

/* Whether stage st's backward runs split (BWD_INPUT + BWD_WEIGHT): every
 * stage's under zb-h1, fusion's under the batch-wide loss too (there its
 * first B runs the whole batch's loss and input gradients, W's its weight
 * gradients: stages/worker_exec.c). */
static int split_bwd(const mmp_sched *s, int st)
{
    (void)st;
    return s->kind == MMP_SCHED_ZB_H1;
}

static void put_backward(const mmp_sched *s, int st, builder *b, int mb)
{
    const mmp_sched_adj *a = b->adj;
    for (int k = a->in_at[st]; k < a->in_at[st + 1]; k++) {
        int e = a->in[k];
        if (s->edges[e].grad && mmp_sched_edge_carries(s, e, mb)) {
            put(b, MMP_OP_RECV_GRAD, mb, e);
        }
    }
    put(b, split_bwd(s, st) ? MMP_OP_BWD_INPUT : MMP_OP_BWD, mb, -1);
    for (int k = a->out_at[st]; k < a->out_at[st + 1]; k++) {
        int e = a->out[k];
        if (s->edges[e].grad && mmp_sched_edge_carries(s, e, mb)) {
            put(b, MMP_OP_SEND_GRAD, mb, e);
        }
    }
}

/* zb-h1: the weight passes pending after backwards, oldest first. */
typedef struct wqueue {
    int *mb;
    int head, tail;
} wqueue;

/* After a split backward of mb: the oldest pending W's while more than
 * defer are pending. */
static void put_weights(builder *b, wqueue *q, int mb, int defer)
{
    q->mb[q->tail++] = mb;
    while (q->tail - q->head > defer) {
        put(b, MMP_OP_BWD_WEIGHT, q->mb[q->head++], -1);
    }
}

/* Writes stage st's list. A stage that sends no activations (fusion) computes
 * the loss and runs its backward at once in every schedule: F0 B0 F1 B1 ...
 * (with a batch-wide loss it warms up with all m: F0 .. Fm-1 B0 .. Bm-1).
 * Others run `warm` forwards, then alternate F(warm+i) B(i), then drain the
 * backwards: GPipe warms up with all m, 1F1B and zb-h1 with depth - 1.
 * Backwards are in ascending micro-batch order either way. zb-h1 splits each
 * backward into B (Bi) and W, keeping `defer` W's pending (FIFO) and ending
 * with the rest, e.g. defer 1: F0 F1 Bi0 F2 Bi1 W0 F3 Bi2 W1 Bi3 W2 W3; the
 * fusion under the batch-wide loss defers all its W's: F0 .. Fm-1 Bi0 ..
 * Bim-1 W0 .. Wm-1. */
static mmp_err build_list(mmp_sched *s, const mmp_sched_adj *adj, int st)
{
    mmp_sched_stage *g = &s->stages[st];
    int m = s->microbatches;
    /* A micro-batch's forward and backward each take at most one receive,
     * one load and one send per branch input plus the compute. */
    builder b = {.n = 0, .cap = g->n_owned * 9 + 2, .adj = adj};
    b.p = malloc((size_t)b.cap * sizeof *b.p);
    wqueue q = {.mb = malloc((size_t)(g->n_owned + 1) * sizeof *q.mb), .head = 0, .tail = 0};
    if (!b.p || !q.mb) {
        free(b.p);
        free(q.mb);
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: stage %s: %d instructions", g->name, b.cap);
    }
    int split = split_bwd(s, st);
    /* The stage's order; this replica keeps its own micro-batches' part. */
    int warm = g->warm;
    for (int i = 0; i < warm; i++) {
        if (mmp_sched_owns(g, i)) {
            put_forward(s, st, &b, i);
        }
    }
    for (int i = 0; i < m - warm; i++) {
        if (mmp_sched_owns(g, warm + i)) {
            put_forward(s, st, &b, warm + i);
        }
        if (mmp_sched_owns(g, i)) {
            put_backward(s, st, &b, i);
            if (split) {
                put_weights(&b, &q, i, g->defer);
            }
        }
    }
    for (int i = m - warm; i < m; i++) {
        if (mmp_sched_owns(g, i)) {
            put_backward(s, st, &b, i);
            if (split) {
                put_weights(&b, &q, i, g->defer);
            }
        }
    }
    while (q.head < q.tail) {
        put(&b, MMP_OP_BWD_WEIGHT, q.mb[q.head++], -1);
    }
    free(q.mb);
    put(&b, MMP_OP_GRAD_NORM, -1, -1);
    put(&b, MMP_OP_OPT_STEP, -1, -1);
    g->prog = b.p;
    g->n_prog = b.n;
    return MMP_OK;
}

mmp_err mmp_sched_compile_stages(mmp_sched *s, mmp_schedule kind, int microbatches)
{
    s->n_edges = 0;
    s->edges = NULL;
    for (int i = 0; i < MMP_SCHED_MAX_STAGES; i++) {
        s->stages[i].prog = NULL;
        s->stages[i].n_prog = 0;
        s->stages[i].owns = NULL;
    }
    if (kind != MMP_SCHED_GPIPE && kind != MMP_SCHED_1F1B && kind != MMP_SCHED_ZB_H1) {
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
     * edge 2k+1 the paired gradients back. Counted first: one allocation. */
    long n_edges = 0;
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        if (g->kind == MMP_KIND_FUSION) {
            continue;
        }
        int next = next_stage(s, i, fusion);
        if (next < 0) {
            return mmp_errorf(MMP_ERR_CONFIG, "schedule: stage %s: no sub-stage %d after it",
                              g->name, g->sub + 1);
        }
        n_edges += 2L * s->stages[next].n_replicas;
    }
    if (n_edges > MMP_SCHED_MAX_EDGES) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "schedule: the replicas' %ld edges are more than the %d a schedule may "
                          "have (every replica pair of consecutive stages needs two)",
                          n_edges, MMP_SCHED_MAX_EDGES);
    }
    s->edges = malloc(((size_t)n_edges + 1) * sizeof *s->edges);
    if (!s->edges) {
        return mmp_errorf(MMP_ERR_NOMEM, "schedule: %ld edges", n_edges);
    }
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        if (g->kind == MMP_KIND_FUSION) {
            g->depth = 1;
            continue;
        }
        int next = next_stage(s, i, fusion);
        for (int r = 0; r < s->stages[next].n_replicas; r++) {
            add_edge(s, (int)n_edges, i, next + r, 0);
            add_edge(s, (int)n_edges, next + r, i, 1);
        }
        g->depth = g->n_sub - g->sub + 1;
    }
    /* Warm-ups, from fusion (a sink: each backward right after its forward)
     * back along each branch: a stage must send at least one micro-batch
     * more than the next stage takes in before that one's first backward. */
    for (int i = 0; i < s->n_stages; i++) {
        /* a batch-wide loss: fusion's first backward needs every forward */
        s->stages[i].warm = s->batch_loss && s->stages[i].kind == MMP_KIND_FUSION ? m : 0;
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
    int peak = 1; /* 1F1B's (or GPipe's) largest bound */
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        g->stage_bound = kind == MMP_SCHED_GPIPE || g->warm + 1 >= m ? m : g->warm + 1;
        peak = g->stage_bound > peak ? g->stage_bound : peak;
    }
    /* A message on an act edge belongs to a micro-batch its producer holds in
     * flight until the gradient comes back, and one on the paired grad edge
     * to a micro-batch its consumer holds: the producer's bound covers both.
     * The bound any routing allows, so a new routing keeps the channels.
     * zb-h1 sends and receives in 1F1B's order: 1F1B's slots. */
    for (int e = 0; e < s->n_edges; e += 2) {
        s->edges[e].slots = s->stages[s->edges[e].from].stage_bound;
        s->edges[e + 1].slots = s->edges[e].slots;
    }
    for (int i = 0; i < s->n_stages; i++) {
        mmp_sched_stage *g = &s->stages[i];
        g->defer = 0;
        if (split_bwd(s, i) && s->batch_loss && g->kind == MMP_KIND_FUSION) {
            /* The batch-wide loss: every B sends its gradients before any W
             * (the branches wait on those, nobody on the W's), so the W's
             * fill the drain, where the fusion would wait for the branches'
             * last backwards. It holds all m from F on: its bound already. */
            g->defer = g->n_owned;
        } else if (split_bwd(s, i)) {
            /* W's pending fill the stage up to 1F1B's peak, never beyond */
            g->defer = peak - g->stage_bound;
            g->stage_bound = peak;
        }
        g->inflight_bound = g->n_owned < g->stage_bound ? g->n_owned : g->stage_bound;
        if (g->inflight_bound < 1) {
            g->inflight_bound = 1; /* a replica routed no micro-batch holds none */
        }
    }
    mmp_sched_adj adj;
    MMP_TRY(mmp_sched_adj_init(&adj, s));
    for (int i = 0; i < s->n_stages; i++) {
        mmp_err e = build_list(s, &adj, i);
        if (e != MMP_OK) {
            mmp_sched_adj_fini(&adj);
            return e;
        }
        int at;
        s->stages[i].max_inflight =
            mmp_sched_list_inflight(&s->stages[i], s->stages[i].inflight_bound, &at);
    }
    mmp_sched_adj_fini(&adj);
    return mmp_sched_validate(s);
}
