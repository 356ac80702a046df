/* The placement planner (coordinator/planner.h): splits and replica counts
 * that minimise the bottleneck stage, for the live balancer and for
 * `mmpipe simulate --plan-devices`.
 *
 * Pure arithmetic over per-layer cost tables. It must never do I/O, read a
 * clock or depend on anything but its input: the balancer re-plans from it
 * mid-run and the same input must give the same placement. */
#include "coordinator/planner.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "coordinator/schedule.h"

#define GRID 12          /* bottleneck bounds tried for the fill/drain term */
#define POLISH_ROUNDS 64 /* local-search rounds per finalist */
#define TIE_RTOL 1e-9    /* steps closer than this are a tie */
#define NO_FIT INT_MAX   /* no replica count makes a range fit */
#define MAX_STAGES (2 * MMP_PLANNER_MAX_SUB + 1)

static const char *const branch_names[2] = {"image", "text"};

const char *mmp_planner_method_name(mmp_planner_method m)
{
    switch (m) {
    case MMP_PLANNER_AUTO:
        return "auto";
    case MMP_PLANNER_CLOSED_FORM:
        return "closed form";
    case MMP_PLANNER_SIMULATED:
        return "simulated";
    }
    return "?";
}

/* ---- input ------------------------------------------------------------------- */

static int is_amount(double v)
{
    return isfinite(v) && v >= 0;
}

static mmp_err check_array(const char *unit, const char *what, const double *v, int n, int required)
{
    if (!v) {
        return required ? mmp_errorf(MMP_ERR_INVALID, "planner: %s: no %s array", unit, what)
                        : MMP_OK;
    }
    for (int i = 0; i < n; i++) {
        if (!is_amount(v[i])) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "planner: %s layer %d: %s %g (must be finite and >= 0)", unit, i,
                              what, v[i]);
        }
    }
    return MMP_OK;
}

static mmp_err check_layers(const char *unit, const mmp_planner_layers *u)
{
    if (u->n < 1 || u->n > MMP_PLANNER_MAX_LAYERS) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: %s: %d layers (1 to %d)", unit, u->n,
                          MMP_PLANNER_MAX_LAYERS);
    }
    MMP_TRY(check_array(unit, "fwd_ms", u->fwd_ms, u->n, 1));
    MMP_TRY(check_array(unit, "bwd_ms", u->bwd_ms, u->n, 1));
    MMP_TRY(check_array(unit, "state_bytes", u->state_bytes, u->n, 0));
    MMP_TRY(check_array(unit, "act_bytes", u->act_bytes, u->n, 0));
    return check_array(unit, "grad_bytes", u->grad_bytes, u->n, 0);
}

mmp_err mmp_planner_check(const mmp_planner_input *in)
{
    if (!in) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: no input");
    }
    if (in->devices < 3 || in->devices > MMP_PLANNER_MAX_DEVICES) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "planner: %d devices (3 to %d: at least one per branch and one for "
                          "fusion)",
                          in->devices, MMP_PLANNER_MAX_DEVICES);
    }
    if (in->batch < 1) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: batch %d (at least 1)", in->batch);
    }
    if (in->microbatches < 1 || in->microbatches > in->batch) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: %d micro-batches (1 to the batch, %d)",
                          in->microbatches, in->batch);
    }
    if (in->schedule != MMP_SCHED_GPIPE && in->schedule != MMP_SCHED_1F1B &&
        in->schedule != MMP_SCHED_ZB_H1) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: unknown schedule %d", (int)in->schedule);
    }
    if (in->max_sub < 0 || in->max_sub > MMP_PLANNER_MAX_SUB) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: max_sub %d (0 for %d, or 1 to %d)",
                          in->max_sub, MMP_PLANNER_DEFAULT_SUB, MMP_PLANNER_MAX_SUB);
    }
    if (in->method != MMP_PLANNER_AUTO && in->method != MMP_PLANNER_CLOSED_FORM &&
        in->method != MMP_PLANNER_SIMULATED) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: unknown method %d", (int)in->method);
    }
    const double scalars[] = {in->mem_cap_bytes, in->send_ms, in->allreduce_bytes_per_ms,
                              in->step_overhead_ms};
    static const char *const scalar_names[] = {"mem_cap_bytes", "send_ms", "allreduce_bytes_per_ms",
                                               "step_overhead_ms"};
    for (int i = 0; i < 4; i++) {
        if (!is_amount(scalars[i])) {
            return mmp_errorf(MMP_ERR_INVALID, "planner: %s %g (must be finite and >= 0)",
                              scalar_names[i], scalars[i]);
        }
    }
    MMP_TRY(check_layers("image", &in->branch[MMP_PLANNER_IMAGE]));
    MMP_TRY(check_layers("text", &in->branch[MMP_PLANNER_TEXT]));
    return check_layers("fusion", &in->fusion);
}

/* ---- the cost model ------------------------------------------------------------ */

/* Prefix sums of one unit's layers: q[k][i] sums quantity k over layers [0, i). */
enum { Q_COST, Q_FWD, Q_BWD, Q_STATE, Q_ACT, Q_GRAD, N_Q };

typedef struct sums {
    int n;
    double *q[N_Q]; /* [n + 1] each */
} sums;

typedef struct ctx {
    const mmp_planner_input *in;
    int m, q0, max_sub;
    sums unit[3]; /* image, text, fusion */
    double *store;
} ctx;

static void ctx_fini(ctx *c)
{
    free(c->store);
    c->store = NULL;
}

static mmp_err ctx_init(ctx *c, const mmp_planner_input *in)
{
    memset(c, 0, sizeof *c);
    c->in = in;
    c->m = in->microbatches;
    c->q0 = (in->batch + in->microbatches - 1) / in->microbatches;
    c->max_sub = in->max_sub ? in->max_sub : MMP_PLANNER_DEFAULT_SUB;
    const mmp_planner_layers *units[3] = {&in->branch[0], &in->branch[1], &in->fusion};
    size_t total = 0;
    for (int u = 0; u < 3; u++) {
        total += (size_t)N_Q * (size_t)(units[u]->n + 1);
    }
    c->store = malloc(total * sizeof *c->store);
    if (!c->store) {
        return mmp_errorf(MMP_ERR_NOMEM, "planner: %zu prefix sums", total);
    }
    double *p = c->store;
    for (int u = 0; u < 3; u++) {
        const mmp_planner_layers *L = units[u];
        sums *s = &c->unit[u];
        s->n = L->n;
        for (int k = 0; k < N_Q; k++) {
            s->q[k] = p;
            p += L->n + 1;
            s->q[k][0] = 0;
        }
        for (int i = 0; i < L->n; i++) {
            const double v[N_Q] = {
                L->fwd_ms[i] + L->bwd_ms[i],
                L->fwd_ms[i],
                L->bwd_ms[i],
                L->state_bytes ? L->state_bytes[i] : 0,
                L->act_bytes ? L->act_bytes[i] : 0,
                L->grad_bytes ? L->grad_bytes[i] : 0,
            };
            for (int k = 0; k < N_Q; k++) {
                s->q[k][i + 1] = s->q[k][i] + v[k];
            }
        }
    }
    return MMP_OK;
}

static double range_sum(const sums *s, int k, int first, int last)
{
    return s->q[k][last] - s->q[k][first];
}

static int ceil_div(int a, int b)
{
    return (a + b - 1) / b;
}

/* Micro-batches whose activations a stage at depth holds at once; depth 1
 * is fusion, which backs each micro-batch off right after its forward
 * (unless the loss is batch-wide: then every stage holds all m). */
static int inflight(const ctx *c, int depth)
{
    if (c->in->batch_loss) {
        return c->m; /* the fusion's backwards wait for the step's last forward */
    }
    if (depth <= 1) {
        return 1;
    }
    return c->in->schedule == MMP_SCHED_GPIPE ? c->m : depth < c->m ? depth : c->m;
}

/* Micro-batches one of r replicas takes a step: the runtime deals whole
 * micro-batches in turn (mmp_sched_route), so the busiest takes ceil(m / r)
 * and runs them one after another. */
static int rounds(const ctx *c, int r)
{
    return ceil_div(c->m, r);
}

/* The fewest replicas that take m micro-batches in n rounds. */
static int replicas_for(const ctx *c, int n)
{
    return ceil_div(c->m, n);
}

/* Micro-batches one of r replicas of a stage at depth holds at once: the
 * stage's window (inflight) dealt in turn, never more than it owns. */
static int held(const ctx *c, int depth, int r)
{
    int w = inflight(c, depth), own = rounds(c, r);
    return w < own ? w : own;
}

/* One micro-batch through [first, last) on one replica: all its q0 samples,
 * however many replicas the stage has. */
static double stage_ms(const ctx *c, const sums *s, int first, int last)
{
    return c->q0 * range_sum(s, Q_COST, first, last);
}

static double allreduce_ms(const ctx *c, double grad_bytes, int r)
{
    double bw = c->in->allreduce_bytes_per_ms;
    return r > 1 && bw > 0 ? 2.0 * (r - 1) / r * grad_bytes / bw : 0;
}

/* The most replicas a plan lets the stage starting at layer `first` of s
 * have (common/plan.c refuses more): MMP_MAX_REPLICAS, and for a branch's
 * first sub-stage, which loads the data, no more than the micro-batches (the
 * runtime deals whole micro-batches to its replicas: one more would load
 * none). */
static int most_replicas(const ctx *c, int unit, int first)
{
    return unit < 2 && first == 0 && c->m < MMP_MAX_REPLICAS ? c->m : MMP_MAX_REPLICAS;
}

/* The fewest replicas that let the stage holding [first, last) of s, at
 * depth, queue at most T ms a step -- (rounds - 1) t, the time its busiest
 * replica spends on micro-batches other than the one it is the path of
 * (T = INFINITY: any time) -- and fit the memory cap; NO_FIT when no count
 * up to the device count and the stage's most_replicas does. Grows with
 * last, for a fixed first: the programme below stops at the first NO_FIT. */
static int min_replicas(const ctx *c, const sums *s, int first, int last, int depth, double T)
{
    int n = c->m; /* the most rounds (micro-batches) one replica may take */
    double t = stage_ms(c, s, first, last);
    if (t > 0 && T < INFINITY) {
        double fit = floor(T / t * (1 + 1e-12)) + 1;
        n = fit < n ? (int)fit : n;
    }
    double cap = c->in->mem_cap_bytes;
    if (cap > 0) {
        double fixed = range_sum(s, Q_STATE, first, last);
        double act = range_sum(s, Q_ACT, first, last) * c->q0;
        if (fixed > cap) {
            return NO_FIT;
        }
        if (act > 0) {
            /* a replica holds min(window, its rounds) micro-batches */
            double fit = floor((cap - fixed) / act);
            if (fit < 1) {
                return NO_FIT;
            }
            if (fit < inflight(c, depth)) {
                n = fit < n ? (int)fit : n;
            }
        }
    }
    int r = replicas_for(c, n);
    return r <= c->in->devices && r <= most_replicas(c, (int)(s - c->unit), first) ? r : NO_FIT;
}

/* Stage views of a placement, image sub-stages, text sub-stages, fusion. */
typedef struct flat {
    int n;
    int unit[MAX_STAGES]; /* 0 image, 1 text, 2 fusion */
    int *rep[MAX_STAGES]; /* into the placement */
    int most[MAX_STAGES]; /* most_replicas of each */
    int depth[MAX_STAGES];
    double cost[MAX_STAGES], fwd[MAX_STAGES], grad[MAX_STAGES];
} flat;

static void flatten(const ctx *c, mmp_placement *pl, flat *f)
{
    f->n = 0;
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < pl->n_sub[b]; j++) {
            mmp_planner_stage *g = &pl->sub[b][j];
            f->unit[f->n] = b;
            f->rep[f->n] = &g->replicas;
            f->most[f->n] = most_replicas(c, b, g->first);
            f->depth[f->n] = pl->n_sub[b] - j + 1;
            f->cost[f->n] = range_sum(&c->unit[b], Q_COST, g->first, g->last);
            f->fwd[f->n] = range_sum(&c->unit[b], Q_FWD, g->first, g->last);
            f->grad[f->n] = range_sum(&c->unit[b], Q_GRAD, g->first, g->last);
            f->n++;
        }
    }
    const sums *fu = &c->unit[2];
    f->unit[f->n] = 2;
    f->rep[f->n] = &pl->fusion_replicas;
    f->most[f->n] = most_replicas(c, 2, 0);
    f->depth[f->n] = 1;
    f->cost[f->n] = range_sum(fu, Q_COST, 0, fu->n);
    f->fwd[f->n] = range_sum(fu, Q_FWD, 0, fu->n);
    f->grad[f->n] = range_sum(fu, Q_GRAD, 0, fu->n);
    f->n++;
}

/* The closed form of planner.h: the step; *bottleneck gets W, the most any
 * stage queues; val[s] (when not NULL) what stage s alone makes the step,
 * before AR and overhead. */
static double stage_values(const ctx *c, const flat *f, double *bottleneck, double *val)
{
    const double send = c->in->send_ms;
    /* per branch: the forward and backward halves of its path, each with
     * one hand-off a hop */
    double pf[3] = {0, 0, 0}, pb[3] = {0, 0, 0};
    for (int s = 0; s < f->n; s++) {
        int u = f->unit[s];
        pf[u] += c->q0 * f->fwd[s] + (u < 2 ? send : 0);
        pb[u] += c->q0 * (f->cost[s] - f->fwd[s]) + (u < 2 ? send : 0);
    }
    double tf = pf[2] + pb[2];
    double long_f = pf[0] > pf[1] ? pf[0] : pf[1], long_b = pb[0] > pb[1] ? pb[0] : pb[1];
    double long_path = (pf[0] + pb[0] > pf[1] + pb[1] ? pf[0] + pb[0] : pf[1] + pb[1]) + tf;
    double W = 0, worst = 0, ar = 0, up_b = 0, down_f = 0, down_b = 0;
    for (int s = 0; s < f->n; s++) {
        int r = *f->rep[s], u = f->unit[s], n = rounds(c, r);
        double fs = c->q0 * f->fwd[s], bs = c->q0 * (f->cost[s] - f->fwd[s]);
        if (u < 2 && (s == 0 || f->unit[s - 1] != u)) {
            up_b = 0; /* a branch's first sub-stage */
            down_f = pf[u];
            down_b = pb[u];
        }
        if (u < 2) {
            down_f -= fs + send;
            down_b -= bs + send;
        }
        double q = (n - 1) * (fs + bs);
        double v = q + (u < 2 ? pf[u] + pb[u] + tf : long_path);
        int w = held(c, f->depth[s], r);
        if (u < 2 && n > w) {
            /* 1F1B: a replica runs its (w + 1)-th forward only after its
             * first backward, whose gradient comes back once the step's
             * first micro-batch has crossed the longer branch and fusion;
             * the rounds after the window alternate F and B; the last one's
             * activations then cross fusion and the longer backward. */
            double first_grad = long_f + tf + down_b + send;
            double last_fwd = first_grad + (n - w) * (fs + bs);
            double rest = w * bs + up_b;
            double after = down_f + send + tf + (long_b > rest ? long_b : rest);
            v = fmax(v, last_fwd + after);
        }
        if (u < 2) {
            up_b += bs + send;
        }
        W = q > W ? q : W;
        worst = v > worst ? v : worst;
        if (val) {
            val[s] = v;
        }
        double a = allreduce_ms(c, f->grad[s], r);
        ar = a > ar ? a : ar;
    }
    *bottleneck = W;
    return worst + ar + c->in->step_overhead_ms;
}

static double closed_step(const ctx *c, const flat *f, double *bottleneck)
{
    return stage_values(c, f, bottleneck, NULL);
}

int mmp_placement_procs(const mmp_placement *pl)
{
    int n = pl->fusion_replicas;
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < pl->n_sub[b]; j++) {
            n += pl->sub[b][j].replicas;
        }
    }
    return n;
}

/* ---- the search --------------------------------------------------------------- */

/* need[k][l] (k = 1..max_sub, l = 0..n-1): the fewest devices that run
 * layers [l, n) of a branch as exactly k sub-stages each within T; path[k][l]:
 * the least sum of their times among those (it is the branch's fill and
 * drain); cut[k][l]: where the first of them ends. */
typedef struct dp {
    int *need, *cut;
    double *path;
    int width; /* n + 1 */
} dp;

/* Fills d for branch b at bound T; returns the fewest devices over k
 * (NO_FIT when none) and *best_k the fewest sub-stages that get it. */
static int branch_need(const ctx *c, int b, double T, dp *d, int *best_k)
{
    const sums *s = &c->unit[b];
    int n = s->n, W = d->width, K = c->max_sub < n ? c->max_sub : n;
    for (int l = 0; l < n; l++) {
        int r = min_replicas(c, s, l, n, 2, T);
        d->need[W + l] = r;
        d->path[W + l] = r == NO_FIT ? INFINITY : stage_ms(c, s, l, n);
        d->cut[W + l] = n;
    }
    for (int k = 2; k <= K; k++) {
        int *need = d->need + k * W, *prev = d->need + (k - 1) * W;
        double *path = d->path + k * W, *prev_path = d->path + (k - 1) * W;
        for (int l = 0; l < n; l++) {
            int best = NO_FIT, at = -1;
            double best_path = INFINITY;
            for (int e = l + 1; e <= n - (k - 1); e++) {
                int r = min_replicas(c, s, l, e, k + 1, T);
                if (r == NO_FIT) {
                    break; /* a longer range fits even less */
                }
                if (prev[e] == NO_FIT || r + prev[e] > best) {
                    continue;
                }
                double p = stage_ms(c, s, l, e) + prev_path[e];
                if (r + prev[e] < best || p < best_path) {
                    best = r + prev[e];
                    best_path = p;
                    at = e;
                }
            }
            need[l] = best;
            path[l] = best_path;
            d->cut[k * W + l] = at;
        }
    }
    int best = NO_FIT;
    *best_k = 0;
    for (int k = 1; k <= K; k++) {
        if (d->need[k * W] < best) {
            best = d->need[k * W];
            *best_k = k;
        }
    }
    return best;
}

/* Branch b of pl as the k sub-stages d found at T. */
static void take_cut(const ctx *c, int b, int k, double T, const dp *d, mmp_placement *pl)
{
    const sums *s = &c->unit[b];
    int l = 0;
    pl->n_sub[b] = k;
    for (int j = 0; j < k; j++) {
        int left = k - j; /* sub-stages from this one to the branch's end: depth left + 1 */
        int e = d->cut[left * d->width + l];
        MMP_ASSERT(e > l && e <= s->n);
        pl->sub[b][j] = (mmp_planner_stage){
            .first = l, .last = e, .replicas = min_replicas(c, s, l, e, left + 1, T)};
        MMP_ASSERT(pl->sub[b][j].replicas != NO_FIT);
        l = e;
    }
    MMP_ASSERT(l == s->n);
}

typedef struct search {
    ctx *c;
    dp d[2];
    /* placements already filled (before the fill), open addressing */
    mmp_placement *seen;
    unsigned char *used;
    size_t n_seen, cap_seen;
    /* the best MMP_PLANNER_RESCORE, best first */
    mmp_placement top[MMP_PLANNER_RESCORE];
    double top_step[MMP_PLANNER_RESCORE];
    int n_top, candidates;
} search;

int mmp_placement_subs(const mmp_placement *pl)
{
    return pl->n_sub[0] + pl->n_sub[1];
}

/* Whether (step a, placement pa) ranks before (step b, pb): shorter step,
 * then fewer sub-stages, then fewer devices. */
static int ranks_before(double a, const mmp_placement *pa, double b, const mmp_placement *pb)
{
    double tol = TIE_RTOL * (a > b ? a : b);
    if (a < b - tol) {
        return 1;
    }
    if (b < a - tol) {
        return 0;
    }
    if (mmp_placement_subs(pa) != mmp_placement_subs(pb)) {
        return mmp_placement_subs(pa) < mmp_placement_subs(pb);
    }
    return mmp_placement_procs(pa) < mmp_placement_procs(pb);
}

static uint64_t placement_hash(const mmp_placement *pl)
{
    return mmp_fnv1a(MMP_FNV1A_INIT, pl, sizeof *pl);
}

/* 1 when pl was seen before; else records it and returns 0. */
static int seen_before(search *S, const mmp_placement *pl)
{
    size_t i = (size_t)(placement_hash(pl) % S->cap_seen);
    while (S->used[i]) {
        if (memcmp(&S->seen[i], pl, sizeof *pl) == 0) {
            return 1;
        }
        i = (i + 1) % S->cap_seen;
    }
    MMP_ASSERT(S->n_seen + 1 < S->cap_seen);
    S->used[i] = 1;
    S->seen[i] = *pl;
    S->n_seen++;
    return 0;
}

/* Hands the devices pl leaves unused to its stages, a move at a time: a
 * move takes one round (micro-batch) off the busiest replica of one stage
 * (or of every stage tied at the step together, since lowering one of them
 * alone gains nothing) and is taken when it shortens the closed-form step
 * most per device spent. Stops when no move that fits shortens it. */
static int placement_fits(const ctx *c, const mmp_placement *pl);

/* Spends pl's spare devices, a move at a time, on the one that shortens the
 * closed-form step most per device, among those that keep every stage
 * within the memory cap. */
static double fill(const ctx *c, mmp_placement *pl)
{
    flat f;
    flatten(c, pl, &f);
    int left = c->in->devices - mmp_placement_procs(pl);
    double B, val[MAX_STAGES], cur = stage_values(c, &f, &B, val);
    while (left > 0) {
        int best_mask_n = 0, best_mask[MAX_STAGES], best_to[MAX_STAGES];
        double best_rate = 0, best_step = cur, worst = 0;
        int best_d = 0;
        for (int s = 0; s < f.n; s++) {
            worst = val[s] > worst ? val[s] : worst;
        }
        /* candidates 0..n-1: one stage; n: the stages that make the step */
        for (int cand = 0; cand <= f.n; cand++) {
            int members[MAX_STAGES], to[MAX_STAGES], n_members = 0, d = 0, ok = 1;
            for (int s = 0; s < f.n; s++) {
                int in_move =
                    cand < f.n ? s == cand : worst > 0 && val[s] >= worst * (1 - TIE_RTOL);
                if (!in_move) {
                    continue;
                }
                int n = rounds(c, *f.rep[s]);
                if (n <= 1 || replicas_for(c, n - 1) > f.most[s] || f.cost[s] <= 0) {
                    ok = 0; /* no fewer rounds within what a plan allows, or no gain */
                    break;
                }
                members[n_members] = s;
                to[n_members] = replicas_for(c, n - 1);
                d += to[n_members] - *f.rep[s];
                n_members++;
            }
            if (!ok || n_members == 0 || d > left) {
                continue;
            }
            int was[MAX_STAGES];
            for (int k = 0; k < n_members; k++) {
                was[k] = *f.rep[members[k]];
                *f.rep[members[k]] = to[k];
            }
            double B2, step = closed_step(c, &f, &B2);
            int fits = placement_fits(c, pl);
            for (int k = 0; k < n_members; k++) {
                *f.rep[members[k]] = was[k];
            }
            if (!fits) {
                continue;
            }
            double rate = (cur - step) / d;
            if (cur - step > TIE_RTOL * cur && rate > best_rate) {
                best_rate = rate;
                best_step = step;
                best_d = d;
                best_mask_n = n_members;
                memcpy(best_mask, members, (size_t)n_members * sizeof *members);
                memcpy(best_to, to, (size_t)n_members * sizeof *to);
            }
        }
        if (best_mask_n == 0) {
            break;
        }
        for (int k = 0; k < best_mask_n; k++) {
            *f.rep[best_mask[k]] = best_to[k];
        }
        left -= best_d;
        cur = stage_values(c, &f, &B, val);
        MMP_ASSERT(fabs(cur - best_step) <= 1e-9 * (1 + cur));
    }
    return cur;
}

static int bound_of(const ctx *c, int warm)
{
    return c->in->schedule == MMP_SCHED_GPIPE || warm + 1 >= c->m ? c->m : warm + 1;
}

/* The micro-batches one replica of stage j of branch b (b == 2: fusion)
 * may hold at once in pl, as the schedule compiler bounds them
 * (coordinator/schedule_compile.c): from fusion back along each branch a
 * stage runs ahead by R * depth - 1 micro-batches (its R replicas' share of
 * its pipeline depth), and at least one more than the next stage takes in
 * before its first backward; all m under GPipe or a batch-wide loss; under
 * ZB-H1 every stage holds up to the largest 1F1B bound (its deferred weight
 * passes); the fusion itself backs each micro-batch off right after its
 * forward. Then no more than the replica owns (rounds). A stage with more
 * replicas below it runs further ahead than its depth: `inflight` (the
 * programme's view, one stage at a time) is a lower bound of this. */
static int held_at(const ctx *c, const mmp_placement *pl, int b, int j)
{
    int m = c->m, gpipe = c->in->schedule == MMP_SCHED_GPIPE;
    int fusion_warm = c->in->batch_loss ? m : 0;
    int want = c->in->batch_loss ? m : 1, peak = bound_of(c, fusion_warm);
    for (int u = 0; u < 2; u++) {
        int after = fusion_warm + 1;
        for (int k = pl->n_sub[u] - 1; k >= 0; k--) {
            int depth = pl->n_sub[u] - k + 1;
            int w = pl->sub[u][k].replicas * depth - 1;
            w = gpipe ? m : w > after ? w : after;
            w = w < m ? w : m;
            int bound = bound_of(c, w);
            peak = bound > peak ? bound : peak;
            want = u == b && k == j ? bound : want;
            after = w + 1;
        }
    }
    if (c->in->schedule == MMP_SCHED_ZB_H1) {
        want = peak > want ? peak : want;
    }
    int own = rounds(c, b < 2 ? pl->sub[b][j].replicas : pl->fusion_replicas);
    return want < own ? want : own;
}

/* Bytes on each device of stage j of branch b (b == 2: fusion) in pl. */
static double bytes_at(const ctx *c, const mmp_placement *pl, int b, int j)
{
    const sums *s = &c->unit[b];
    int first = b < 2 ? pl->sub[b][j].first : 0, last = b < 2 ? pl->sub[b][j].last : s->n;
    return range_sum(s, Q_STATE, first, last) +
           (double)held_at(c, pl, b, j) * c->q0 * range_sum(s, Q_ACT, first, last);
}

/* Whether stage j of branch b (b == 2: fusion) fits the memory cap. */
static int stage_fits(const ctx *c, const mmp_placement *pl, int b, int j)
{
    double cap = c->in->mem_cap_bytes;
    return cap <= 0 || bytes_at(c, pl, b, j) <= cap * (1 + 1e-12);
}

/* Whether every stage of pl fits: a replica more on one stage lets the
 * stages above it run further ahead, so a change anywhere is checked
 * everywhere. */
static int placement_fits(const ctx *c, const mmp_placement *pl)
{
    if (c->in->mem_cap_bytes <= 0) {
        return 1;
    }
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < pl->n_sub[b]; j++) {
            if (!stage_fits(c, pl, b, j)) {
                return 0;
            }
        }
    }
    return stage_fits(c, pl, 2, 0);
}

/* One move of polish: t, when every stage fits, filled; kept in *best when
 * that shortens the step past the tie tolerance. */
static void consider(const ctx *c, mmp_placement *t, mmp_placement *best, double *best_step)
{
    if (!placement_fits(c, t)) {
        return;
    }
    double s = fill(c, t);
    if (s < *best_step * (1 - TIE_RTOL)) {
        *best = *t;
        *best_step = s;
    }
}

/* Local search from a filled placement: move one cut by a layer, or take
 * one replica off a stage and fill again, while either shortens the step.
 * It mends what the greedy fill and the cheapest-cut programme miss (a cut
 * that is as cheap in devices but drains slower once filled; spare devices
 * spent where they gain least). Returns pl's step. */
static double polish(const ctx *c, mmp_placement *pl, double step)
{
    for (int round = 0; round < POLISH_ROUNDS; round++) {
        mmp_placement best = *pl, t;
        double best_step = step;
        for (int b = 0; b < 2; b++) {
            for (int j = 0; j + 1 < pl->n_sub[b]; j++) {
                /* the cut by a layer, and with it (shift -1, 1) a replica
                 * from one of the two stages it parts to the other */
                for (int move = 0; move < 6; move++) {
                    int delta = move % 2 ? 1 : -1, shift = move / 2 - 1;
                    t = *pl;
                    int cut = t.sub[b][j].last + delta;
                    if (cut <= t.sub[b][j].first || cut >= t.sub[b][j + 1].last) {
                        continue;
                    }
                    t.sub[b][j].last = t.sub[b][j + 1].first = cut;
                    int *from = shift < 0 ? &t.sub[b][j].replicas : &t.sub[b][j + 1].replicas;
                    int *to = shift < 0 ? &t.sub[b][j + 1].replicas : &t.sub[b][j].replicas;
                    if (shift != 0) {
                        if (*from <= 1 ||
                            *to >= most_replicas(c, b, to == &t.sub[b][0].replicas ? 0 : 1)) {
                            continue;
                        }
                        (*from)--;
                        (*to)++;
                    }
                    consider(c, &t, &best, &best_step);
                }
            }
        }
        /* split a layer off either end of a sub-stage into a sub-stage of
         * one replica, a spare device's or one the stage gives up (it moves
         * a gradient all-reduce's bytes, or a layer's queueing, off a
         * crowded stage) */
        int spare_now = c->in->devices - mmp_placement_procs(pl);
        for (int b = 0; b < 2; b++) {
            for (int j = 0; j < pl->n_sub[b] && pl->n_sub[b] < c->max_sub; j++) {
                const mmp_planner_stage g = pl->sub[b][j];
                if (g.last - g.first < 2) {
                    continue;
                }
                for (int move = 0; move < 4; move++) {
                    int tail = move % 2, give = move / 2;
                    if ((give && g.replicas <= 1) || (!give && spare_now < 1)) {
                        continue;
                    }
                    t = *pl;
                    memmove(&t.sub[b][j + 1], &t.sub[b][j],
                            (size_t)(t.n_sub[b] - j) * sizeof t.sub[b][j]);
                    t.n_sub[b]++;
                    int cut = tail ? g.last - 1 : g.first + 1;
                    mmp_planner_stage *lo = &t.sub[b][j], *hi = &t.sub[b][j + 1];
                    lo->last = hi->first = cut;
                    mmp_planner_stage *one = tail ? hi : lo, *rest = tail ? lo : hi;
                    one->replicas = 1;
                    rest->replicas = g.replicas - give;
                    if (t.sub[b][0].replicas > most_replicas(c, b, 0)) {
                        continue;
                    }
                    consider(c, &t, &best, &best_step);
                }
            }
        }
        /* take a replica off stage a; give what that frees (and any spare)
         * to stage g, as much as fits, or (g == a) to the greedy fill */
        mmp_placement base = *pl;
        flat f;
        flatten(c, &base, &f);
        int spare = c->in->devices - mmp_placement_procs(pl);
        for (int a = 0; a < f.n; a++) {
            if (*f.rep[a] <= 1) {
                continue;
            }
            for (int g = 0; g < f.n; g++) {
                flat tf;
                t = *pl;
                flatten(c, &t, &tf);
                int was = *tf.rep[a];
                *tf.rep[a] = replicas_for(c, rounds(c, was - 1)); /* fewest for those rounds */
                int left = spare + was - *tf.rep[a];
                while (g != a && rounds(c, *tf.rep[g]) > 1) {
                    int up = replicas_for(c, rounds(c, *tf.rep[g]) - 1);
                    if (up - *tf.rep[g] > left || up > tf.most[g]) {
                        break;
                    }
                    left -= up - *tf.rep[g];
                    *tf.rep[g] = up;
                }
                consider(c, &t, &best, &best_step);
            }
        }
        if (best_step >= step) {
            break;
        }
        *pl = best;
        step = best_step;
    }
    return step;
}

/* Gives back the devices pl's step does not need: one stage at a time, the
 * one that frees the most, goes to the fewest replicas for its rounds, or
 * takes one round more, while the closed-form step does not grow (a stage
 * off the longest path may queue the difference; replicas past the
 * micro-batches buy nothing). Returns pl's step. */
static double trim(const ctx *c, mmp_placement *pl, double step)
{
    const double most = step * (1 + 1e-12);
    for (;;) {
        flat f;
        flatten(c, pl, &f);
        int best = -1, best_to = 0, best_free = 0;
        for (int s = 0; s < f.n; s++) {
            int was = *f.rep[s], n = rounds(c, was);
            if (was <= 1) {
                continue;
            }
            int to = replicas_for(c, n) < was ? replicas_for(c, n) : replicas_for(c, n + 1);
            *f.rep[s] = to;
            double B, t = closed_step(c, &f, &B);
            if (t <= most && was - to > best_free && placement_fits(c, pl)) {
                best = s;
                best_to = to;
                best_free = was - to;
            }
            *f.rep[s] = was;
        }
        if (best < 0) {
            break;
        }
        *f.rep[best] = best_to;
    }
    flat f;
    flatten(c, pl, &f);
    double B;
    return closed_step(c, &f, &B);
}

/* Keeps pl among the best MMP_PLANNER_RESCORE distinct placements, when
 * every stage of it fits the memory cap. */
static void offer(search *S, const mmp_placement *pl, double step)
{
    if (!placement_fits(S->c, pl)) {
        return;
    }
    for (int i = 0; i < S->n_top; i++) {
        if (memcmp(&S->top[i], pl, sizeof *pl) == 0) {
            return;
        }
    }
    int at = S->n_top;
    while (at > 0 && ranks_before(step, pl, S->top_step[at - 1], &S->top[at - 1])) {
        at--;
    }
    if (at >= MMP_PLANNER_RESCORE) {
        return;
    }
    int last = S->n_top < MMP_PLANNER_RESCORE ? S->n_top : MMP_PLANNER_RESCORE - 1;
    for (int i = last; i > at; i--) {
        S->top[i] = S->top[i - 1];
        S->top_step[i] = S->top_step[i - 1];
    }
    S->top[at] = *pl;
    S->top_step[at] = step;
    S->n_top += S->n_top < MMP_PLANNER_RESCORE;
}

/* Devices the cheapest placement within bound T needs (NO_FIT: none), with
 * its sub-stage counts; leaves the programmes in S->d. */
static long devices_at(search *S, double T, int k[2])
{
    const ctx *c = S->c;
    const sums *fu = &c->unit[2];
    int rf = min_replicas(c, fu, 0, fu->n, 1, T);
    if (rf == NO_FIT) {
        return NO_FIT;
    }
    long total = rf;
    for (int b = 0; b < 2; b++) {
        int need = branch_need(c, b, T, &S->d[b], &k[b]);
        if (need == NO_FIT) {
            return NO_FIT;
        }
        total += need;
    }
    return total;
}

/* The placement devices_at(T) counted. */
static void cheapest_at(search *S, double T, mmp_placement *pl)
{
    int k[2];
    long n = devices_at(S, T, k);
    MMP_ASSERT(n != NO_FIT);
    memset(pl, 0, sizeof *pl);
    for (int b = 0; b < 2; b++) {
        take_cut(S->c, b, k[b], T, &S->d[b], pl);
    }
    const sums *fu = &S->c->unit[2];
    pl->fusion_replicas = min_replicas(S->c, fu, 0, fu->n, 1, T);
}

static double bottleneck_of(const ctx *c, mmp_placement *pl)
{
    flat f;
    flatten(c, pl, &f);
    double B;
    closed_step(c, &f, &B);
    return B;
}

/* Every pair of sub-stage counts that fits within bound T, filled and
 * offered. */
static void try_bound(search *S, double T)
{
    const ctx *c = S->c;
    int kb[2];
    if (devices_at(S, T, kb) == NO_FIT) {
        return;
    }
    const sums *fu = &c->unit[2];
    int rf = min_replicas(c, fu, 0, fu->n, 1, T);
    int K[2];
    for (int b = 0; b < 2; b++) {
        K[b] = c->max_sub < c->unit[b].n ? c->max_sub : c->unit[b].n;
    }
    for (int ki = 1; ki <= K[0]; ki++) {
        int ni = S->d[0].need[ki * S->d[0].width];
        for (int kt = 1; kt <= K[1]; kt++) {
            int nt = S->d[1].need[kt * S->d[1].width];
            if (ni == NO_FIT || nt == NO_FIT || (long)ni + nt + rf > c->in->devices) {
                continue;
            }
            mmp_placement pl;
            memset(&pl, 0, sizeof pl);
            take_cut(c, 0, ki, T, &S->d[0], &pl);
            take_cut(c, 1, kt, T, &S->d[1], &pl);
            pl.fusion_replicas = rf;
            if (seen_before(S, &pl)) {
                continue;
            }
            double step = fill(c, &pl);
            S->candidates++;
            offer(S, &pl, step);
        }
    }
}

static void search_fini(search *S)
{
    for (int b = 0; b < 2; b++) {
        free(S->d[b].need);
        free(S->d[b].cut);
        free(S->d[b].path);
    }
    free(S->seen);
    free(S->used);
}

static mmp_err search_init(search *S, ctx *c)
{
    memset(S, 0, sizeof *S);
    S->c = c;
    for (int b = 0; b < 2; b++) {
        S->d[b].width = c->unit[b].n + 1;
        size_t cells = (size_t)(c->max_sub + 1) * (size_t)S->d[b].width;
        S->d[b].need = malloc(cells * sizeof *S->d[b].need);
        S->d[b].cut = malloc(cells * sizeof *S->d[b].cut);
        S->d[b].path = malloc(cells * sizeof *S->d[b].path);
        if (!S->d[b].need || !S->d[b].cut || !S->d[b].path) {
            return mmp_errorf(MMP_ERR_NOMEM, "planner: %zu programme cells", cells);
        }
    }
    /* every (k_image, k_text) at every bound, at most, twice over */
    S->cap_seen = 2 * (size_t)GRID * (size_t)c->max_sub * (size_t)c->max_sub + 1;
    S->seen = malloc(S->cap_seen * sizeof *S->seen);
    S->used = calloc(S->cap_seen, 1);
    if (!S->seen || !S->used) {
        return mmp_errorf(MMP_ERR_NOMEM, "planner: %zu placements", S->cap_seen);
    }
    return MMP_OK;
}

/* ---- scoring ------------------------------------------------------------------ */

/* Edges the schedule compiler makes for pl: an activation and a gradient
 * edge between every replica pair of consecutive stages. */
static long sched_edges(const mmp_placement *pl)
{
    long n = 0;
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < pl->n_sub[b]; j++) {
            int next = j + 1 < pl->n_sub[b] ? pl->sub[b][j + 1].replicas : pl->fusion_replicas;
            n += 2L * pl->sub[b][j].replicas * next;
        }
    }
    return n;
}

/* Whether pl's replicated stage graph fits one schedule. */
static int simulable(const mmp_placement *pl)
{
    return mmp_placement_procs(pl) <= MMP_SCHED_MAX_STAGES &&
           sched_edges(pl) <= MMP_SCHED_MAX_EDGES;
}

/* Whether AUTO simulates pl: it fits, and its lists are short enough that
 * the simulations stay a small part of planning. */
static int auto_simulates(const ctx *c, const mmp_placement *pl)
{
    return simulable(pl) && (long)mmp_placement_procs(pl) * c->m <= MMP_PLANNER_SIM_BUDGET;
}

/* One step of pl through the schedule compiler and the simulator, every
 * replica a process of its own as the runtime compiles it (micro-batches
 * dealt whole and in turn, equal speeds), each taking a whole micro-batch's
 * time per micro-batch. The schedule (about 1024 stages inline) is the
 * caller's scratch. */
static mmp_err simulate(const ctx *c, const mmp_placement *pl, double ar_ms, mmp_sched *s,
                        double *step_ms)
{
    static const mmp_stage_kind kinds[3] = {MMP_KIND_IMAGE, MMP_KIND_TEXT, MMP_KIND_FUSION};
    mmp_sim_costs *sc = calloc(1, sizeof *sc);
    mmp_sim_result *r = malloc(sizeof *r);
    if (!sc || !r) {
        free(sc);
        free(r);
        return mmp_errorf(MMP_ERR_NOMEM, "planner: simulation costs");
    }
    memset(s, 0, sizeof *s);
    int n = 0;
    for (int u = 0; u < 3; u++) {
        const sums *su = &c->unit[u];
        int subs = u < 2 ? pl->n_sub[u] : 1;
        for (int j = 0; j < subs; j++) {
            int first = u < 2 ? pl->sub[u][j].first : 0, last = u < 2 ? pl->sub[u][j].last : su->n;
            int R = u < 2 ? pl->sub[u][j].replicas : pl->fusion_replicas;
            for (int k = 0; k < R; k++) {
                mmp_sched_stage *st = &s->stages[n];
                if (u < 2) {
                    snprintf(st->name, sizeof st->name, "%s.%d", branch_names[u], j);
                } else {
                    snprintf(st->name, sizeof st->name, "fusion");
                }
                st->kind = kinds[u];
                st->sub = j;
                st->n_sub = subs;
                st->layer_first = u < 2 ? first : 0;
                st->layer_last = u < 2 ? last : 1;
                st->replica = k;
                st->n_replicas = R;
                sc->fwd_ms[n] = c->q0 * range_sum(su, Q_FWD, first, last);
                sc->bwd_ms[n] = c->q0 * range_sum(su, Q_BWD, first, last);
                n++;
            }
        }
    }
    s->n_stages = n;
    sc->send_ms = c->in->send_ms;
    sc->step_overhead_ms = c->in->step_overhead_ms + ar_ms;
    s->batch_loss = c->in->batch_loss;
    mmp_err ret = mmp_sched_compile_stages(s, c->in->schedule, c->m);
    if (ret == MMP_OK) {
        ret = mmp_sched_simulate(s, sc, r);
    }
    mmp_sched_fini(s);
    if (ret == MMP_OK) {
        *step_ms = r->step_ms;
    }
    free(sc);
    free(r);
    return ret == MMP_OK ? MMP_OK : mmp_error_prefix(ret, "planner: simulating the placement");
}

static mmp_err check_placement(const ctx *c, const mmp_placement *pl)
{
    long used = pl->fusion_replicas;
    if (pl->fusion_replicas < 1) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: fusion has %d replicas (at least 1)",
                          pl->fusion_replicas);
    }
    for (int b = 0; b < 2; b++) {
        const char *name = branch_names[b];
        int k = pl->n_sub[b], n = c->unit[b].n;
        if (k < 1 || k > MMP_PLANNER_MAX_SUB) {
            return mmp_errorf(MMP_ERR_INVALID, "planner: %s has %d sub-stages (1 to %d)", name, k,
                              MMP_PLANNER_MAX_SUB);
        }
        int at = 0;
        for (int j = 0; j < k; j++) {
            const mmp_planner_stage *g = &pl->sub[b][j];
            if (g->first != at || g->last <= g->first || g->last > n) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "planner: %s.%d holds [%d, %d): sub-stages must tile the "
                                  "branch's %d layers in order (this one starts at %d)",
                                  name, j, g->first, g->last, n, at);
            }
            if (g->replicas < 1) {
                return mmp_errorf(MMP_ERR_INVALID, "planner: %s.%d has %d replicas (at least 1)",
                                  name, j, g->replicas);
            }
            used += g->replicas;
            at = g->last;
        }
        if (at != n) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "planner: %s's sub-stages end at layer %d, not at its %d", name, at,
                              n);
        }
    }
    if (used > c->in->devices) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: the placement uses %ld devices of %d", used,
                          c->in->devices);
    }
    return MMP_OK;
}

/* Scores pl (already checked) with method; fills *ev. */
static mmp_err score(const ctx *c, const mmp_placement *pl, mmp_planner_method method,
                     mmp_planner_eval *ev)
{
    const mmp_planner_input *in = c->in;
    mmp_planner_eval e;
    memset(&e, 0, sizeof e);
    double cap = in->mem_cap_bytes, ar = 0;
    for (int b = 0; b < 2; b++) {
        const sums *s = &c->unit[b];
        for (int j = 0; j < pl->n_sub[b]; j++) {
            const mmp_planner_stage *g = &pl->sub[b][j];
            e.stage_ms[b][j] = stage_ms(c, s, g->first, g->last);
            e.stage_bytes[b][j] = bytes_at(c, pl, b, j);
            if (cap > 0 && e.stage_bytes[b][j] > cap * (1 + 1e-12)) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "planner: %s.%d (layers [%d, %d), %d replicas) needs %.4g bytes "
                                  "per device, over the cap of %.4g",
                                  branch_names[b], j, g->first, g->last, g->replicas,
                                  e.stage_bytes[b][j], cap);
            }
            e.busy_ms += in->batch * range_sum(s, Q_COST, g->first, g->last);
            double a = allreduce_ms(c, range_sum(s, Q_GRAD, g->first, g->last), g->replicas);
            ar = a > ar ? a : ar;
        }
    }
    const sums *fu = &c->unit[2];
    e.fusion_ms = stage_ms(c, fu, 0, fu->n);
    e.fusion_bytes = bytes_at(c, pl, 2, 0);
    if (cap > 0 && e.fusion_bytes > cap * (1 + 1e-12)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "planner: fusion (%d replicas) needs %.4g bytes per device, over the "
                          "cap of %.4g",
                          pl->fusion_replicas, e.fusion_bytes, cap);
    }
    e.busy_ms += in->batch * range_sum(fu, Q_COST, 0, fu->n);
    double a = allreduce_ms(c, range_sum(fu, Q_GRAD, 0, fu->n), pl->fusion_replicas);
    ar = a > ar ? a : ar;

    mmp_placement copy = *pl;
    flat f;
    flatten(c, &copy, &f);
    e.closed_form_ms = closed_step(c, &f, &e.bottleneck_ms);
    e.devices_used = mmp_placement_procs(pl);
    if (method == MMP_PLANNER_AUTO) {
        method = auto_simulates(c, pl) ? MMP_PLANNER_SIMULATED : MMP_PLANNER_CLOSED_FORM;
    }
    e.method = method;
    e.step_ms = e.closed_form_ms;
    if (method == MMP_PLANNER_SIMULATED) {
        if (!simulable(pl)) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "planner: %d processes (%ld edges) are more than a schedule holds "
                              "(%d, %d)",
                              mmp_placement_procs(pl), sched_edges(pl), MMP_SCHED_MAX_STAGES,
                              MMP_SCHED_MAX_EDGES);
        }
        mmp_sched *sch = malloc(sizeof *sch);
        if (!sch) {
            return mmp_errorf(MMP_ERR_NOMEM, "planner: a schedule to simulate");
        }
        mmp_err ret = simulate(c, pl, ar, sch, &e.step_ms);
        free(sch);
        MMP_TRY(ret);
    }
    e.samples_per_s = e.step_ms > 0 ? in->batch / (e.step_ms / 1000) : 0;
    e.efficiency = e.step_ms > 0 ? e.busy_ms / (in->devices * e.step_ms) : 0;
    *ev = e;
    return MMP_OK;
}

mmp_err mmp_planner_evaluate(const mmp_planner_input *in, const mmp_placement *pl,
                             mmp_planner_eval *ev)
{
    MMP_TRY(mmp_planner_check(in));
    ctx c;
    mmp_err ret = ctx_init(&c, in);
    if (ret == MMP_OK) {
        ret = check_placement(&c, pl);
    }
    if (ret == MMP_OK) {
        ret = score(&c, pl, in->method, ev);
    }
    ctx_fini(&c);
    return ret;
}

/* ---- the planner ---------------------------------------------------------------- */

mmp_err mmp_planner_plan(const mmp_planner_input *in, mmp_planner_result *out)
{
    MMP_TRY(mmp_planner_check(in));
    ctx c;
    search S;
    memset(&S, 0, sizeof S);
    mmp_err ret = ctx_init(&c, in);
    if (ret != MMP_OK) {
        goto exit;
    }
    ret = search_init(&S, &c);
    if (ret != MMP_OK) {
        goto exit;
    }
    int D = in->devices, k[2];

    /* 1. The least bottleneck. With no time bound only memory limits. */
    long floor_devices = devices_at(&S, INFINITY, k);
    if (floor_devices == NO_FIT || floor_devices > D) {
        if (floor_devices == NO_FIT) {
            ret = mmp_errorf(MMP_ERR_INVALID,
                             "planner: no placement fits the memory cap of %.4g bytes per device "
                             "in %d devices (a layer range holds more than the cap, or needs "
                             "more replicas than there are devices or than a stage may have: "
                             "%d, a branch's first sub-stage no more than the %d micro-batches)",
                             in->mem_cap_bytes, D, MMP_MAX_REPLICAS, c.m);
        } else {
            ret = mmp_errorf(MMP_ERR_INVALID,
                             "planner: no placement fits the memory cap of %.4g bytes per device "
                             "in %d devices: it takes at least %ld",
                             in->mem_cap_bytes, D, floor_devices);
        }
        goto exit;
    }
    mmp_placement pl;
    cheapest_at(&S, INFINITY, &pl);
    double hi = bottleneck_of(&c, &pl), loose = hi;
    /* No stage queues less than nothing: with a replica per micro-batch
     * everywhere none queues at all. */
    double lo = 0;
    if (devices_at(&S, lo, k) <= D) {
        hi = lo;
    }
    for (int it = 0; it < 200 && hi - lo > 1e-9 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        long need = devices_at(&S, mid, k);
        if (need != NO_FIT && need <= D) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    cheapest_at(&S, hi, &pl);
    double bound = bottleneck_of(&c, &pl);

    /* 2. Cuts and fills for a grid of bounds from it to the queueing of the
     * cheapest placement: a looser bound takes fewer devices, so more are
     * left for the fill, and cuts the branches differently. */
    for (int j = 0; j < GRID; j++) {
        double x = (double)j / (GRID - 1);
        double T = bound + (loose - bound) * x * x;
        try_bound(&S, T);
        if (loose <= bound) {
            break;
        }
    }
    if (S.n_top == 0) {
        /* the programme's window is a stage's depth; with replicas below
         * it a stage runs further ahead (held_at), and every candidate it
         * cut was over the cap then */
        MMP_ASSERT(in->mem_cap_bytes > 0);
        ret = mmp_errorf(MMP_ERR_INVALID,
                         "planner: no placement found fits the memory cap of %.4g bytes per "
                         "device in %d devices once the stages above replicated ones hold "
                         "their schedule's micro-batches in flight: raise the cap, or plan "
                         "more devices",
                         in->mem_cap_bytes, D);
        goto exit;
    }

    /* 3. Polish the finalists. */
    int finalists = S.n_top;
    mmp_placement polished[MMP_PLANNER_RESCORE];
    double polished_step[MMP_PLANNER_RESCORE];
    for (int i = 0; i < finalists; i++) {
        polished[i] = S.top[i];
        polished_step[i] = polish(&c, &polished[i], S.top_step[i]);
    }
    for (int i = 0; i < finalists; i++) {
        offer(&S, &polished[i], polished_step[i]);
        double t = trim(&c, &polished[i], polished_step[i]);
        offer(&S, &polished[i], t);
    }

    /* 4. The winner, simulated where asked. */
    mmp_planner_result res;
    memset(&res, 0, sizeof res);
    res.bound_ms = bound;
    res.candidates = S.candidates;
    int best = 0;
    mmp_planner_eval best_ev;
    ret = score(&c, &S.top[0], in->method, &best_ev);
    if (ret != MMP_OK) {
        goto exit;
    }
    res.simulated = best_ev.method == MMP_PLANNER_SIMULATED;
    if (best_ev.method == MMP_PLANNER_SIMULATED) {
        for (int i = 1; i < S.n_top; i++) {
            mmp_planner_eval ev;
            ret = score(&c, &S.top[i], MMP_PLANNER_SIMULATED, &ev);
            if (ret != MMP_OK) {
                goto exit;
            }
            res.simulated++;
            if (ranks_before(ev.step_ms, &S.top[i], best_ev.step_ms, &S.top[best])) {
                best = i;
                best_ev = ev;
            }
        }
    }
    res.placement = S.top[best];
    res.eval = best_ev;
    *out = res;
exit:
    search_fini(&S);
    ctx_fini(&c);
    return ret;
}
