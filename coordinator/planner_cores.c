/* The planner on CPU cores (coordinator/planner_cores.h): placements whose
 * processes share cores, scored by per-core load and searched by local
 * moves from the device planner's placements. Pure: no I/O, no globals. */
#include "coordinator/planner_cores.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int max_procs_of(const mmp_cores_input *ci)
{
    if (ci->max_procs > 0) {
        return ci->max_procs;
    }
    long n = 2L * ci->cores + 3;
    return n > MMP_CORES_MAX_PROCS ? MMP_CORES_MAX_PROCS : (int)n;
}

static mmp_err check_cores(const mmp_cores_input *ci)
{
    if (ci->cores < 1 || ci->cores > MMP_PLANNER_MAX_DEVICES) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: cores: %d cores, expected 1 to %d", ci->cores,
                          MMP_PLANNER_MAX_DEVICES);
    }
    if (ci->max_procs != 0 && (ci->max_procs < 3 || ci->max_procs > MMP_CORES_MAX_PROCS)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "planner: cores: max_procs %d, expected 0 (the default) or 3 to %d",
                          ci->max_procs, MMP_CORES_MAX_PROCS);
    }
    mmp_planner_input in = ci->in;
    in.devices = MMP_PLANNER_MAX_DEVICES; /* not read here: any valid count */
    return mmp_planner_check(&in);
}

/* Sum of fwd (bwd when bwd) over layers [first, last) of u. */
static double sum_of(const mmp_planner_layers *u, int first, int last, int bwd)
{
    double s = 0;
    for (int l = first; l < last; l++) {
        s += bwd ? u->bwd_ms[l] : u->fwd_ms[l];
    }
    return s;
}

/* Adds one unit's replicas to the cores, from process *k on; proc (may be
 * NULL) gets each process's load. */
static void pack_unit(const mmp_cores_input *ci, double fwd_mb, double bwd_mb, int replicas,
                      int fusion, int *k, double *fwd, double *bwd, double *fus, double *proc)
{
    int m = ci->in.microbatches;
    for (int r = 0; r < replicas; r++, (*k)++) {
        int c = *k % ci->cores;
        int n = m / replicas + (r < m % replicas);
        fwd[c] += n * fwd_mb;
        /* under the batch-wide loss every fusion replica runs the whole
         * batch's backward (stages/worker_exec.c, batch_scope_bwd) */
        double b = (fusion && ci->in.batch_loss ? m : n) * bwd_mb;
        (fusion ? fus : bwd)[c] += b;
        if (proc && *k < MMP_CORES_MAX_PROCS) {
            proc[*k] = n * fwd_mb + b;
        }
    }
}

/* The three bounds; *ded the planner's evaluation (device per process). */
static mmp_err score(const mmp_cores_input *ci, const mmp_placement *pl, mmp_planner_eval *ded,
                     double *step, double *core_ms, double *proc_ms)
{
    int P = mmp_placement_procs(pl);
    if (P > max_procs_of(ci)) {
        return mmp_errorf(MMP_ERR_INVALID, "planner: cores: %d processes, more than the %d allowed",
                          P, max_procs_of(ci));
    }
    mmp_planner_input in = ci->in;
    in.devices = P < 3 ? 3 : P;
    in.method = MMP_PLANNER_CLOSED_FORM;
    MMP_TRY(mmp_planner_evaluate(&in, pl, ded));
    int C = ci->cores, cmax = C < MMP_CORES_MAX_PROCS ? C : MMP_CORES_MAX_PROCS;
    /* at most MMP_CORES_MAX_PROCS cores ever hold a process */
    double fwd[MMP_CORES_MAX_PROCS] = {0}, bwd[MMP_CORES_MAX_PROCS] = {0},
           fus[MMP_CORES_MAX_PROCS] = {0};
    double q0 = ceil((double)in.batch / in.microbatches);
    int k = 0;
    for (int b = 0; b < 2; b++) {
        const mmp_planner_layers *u = &in.branch[b];
        for (int j = 0; j < pl->n_sub[b]; j++) {
            const mmp_planner_stage *g = &pl->sub[b][j];
            pack_unit(ci, q0 * sum_of(u, g->first, g->last, 0),
                      q0 * sum_of(u, g->first, g->last, 1), g->replicas, 0, &k, fwd, bwd, fus,
                      proc_ms);
        }
    }
    pack_unit(ci, q0 * sum_of(&in.fusion, 0, in.fusion.n, 0),
              q0 * sum_of(&in.fusion, 0, in.fusion.n, 1), pl->fusion_replicas, 1, &k, fwd, bwd, fus,
              proc_ms);
    double most = 0, most_f = 0, most_b = 0, most_z = 0;
    for (int c = 0; c < cmax; c++) {
        double load = fwd[c] + bwd[c] + fus[c];
        most = fmax(most, load);
        most_f = fmax(most_f, fwd[c]);
        most_b = fmax(most_b, bwd[c]);
        most_z = fmax(most_z, fus[c]);
        if (core_ms) {
            core_ms[c] = load;
        }
    }
    for (int c = cmax; core_ms && c < C; c++) {
        core_ms[c] = 0;
    }
    double s = most + in.step_overhead_ms;
    if (in.batch_loss) {
        s = fmax(s, most_f + most_z + most_b + in.step_overhead_ms);
    }
    *step = fmax(s, ded->closed_form_ms);
    return MMP_OK;
}

mmp_err mmp_planner_cores_evaluate(const mmp_cores_input *ci, const mmp_placement *pl,
                                   mmp_planner_eval *ev, double *core_ms)
{
    MMP_TRY(check_cores(ci));
    mmp_planner_eval e;
    double step = 0;
    MMP_TRY(score(ci, pl, &e, &step, core_ms, NULL));
    int P = mmp_placement_procs(pl);
    e.method = MMP_PLANNER_CLOSED_FORM;
    e.step_ms = step;
    e.closed_form_ms = step;
    e.samples_per_s = step > 0 ? ci->in.batch / (step / 1000) : 0;
    e.efficiency = step > 0 ? fmin(1, e.busy_ms / (ci->cores * step)) : 1;
    e.devices_used = P < ci->cores ? P : ci->cores;
    *ev = e;
    return MMP_OK;
}

int mmp_planner_cores_nice(const mmp_cores_input *ci, const mmp_placement *pl, int *nice)
{
    int P = mmp_placement_procs(pl);
    mmp_planner_eval e;
    double step = 0, load[MMP_CORES_MAX_PROCS] = {0};
    if (check_cores(ci) != MMP_OK || score(ci, pl, &e, &step, NULL, load) != MMP_OK) {
        return -1;
    }
    double most = 0;
    for (int k = 0; k < P; k++) {
        most = fmax(most, load[k]);
    }
    int heavy = 0;
    for (int k = 0; k < P; k++) {
        heavy += load[k] >= most / 2;
    }
    /* nothing to favour when every process is heavy (or each has a core) */
    int on = P > ci->cores && heavy < P;
    for (int k = 0; k < P; k++) {
        nice[k] = on && load[k] >= most / 2 ? MMP_CORES_NICE_HEAVY : 0;
    }
    return P;
}

/* ---- search ----------------------------------------------------------------------- */

/* Whether (sa, a) ranks before (sb, b): a step shorter by more than
 * MMP_CORES_PROC_TOLERANCE when they have different process counts (else
 * fewer processes), then a shorter step, then fewer sub-stages. */
static int better(double sa, const mmp_placement *a, double sb, const mmp_placement *b)
{
    int pa = mmp_placement_procs(a), pb = mmp_placement_procs(b);
    if (pa != pb && isfinite(sa) && isfinite(sb)) {
        double lo = fmin(sa, sb);
        if (fabs(sa - sb) <= MMP_CORES_PROC_TOLERANCE * lo) {
            return pa < pb;
        }
    }
    double tol = 1e-9 * fmax(fabs(sa), fabs(sb));
    if (sa < sb - tol) {
        return 1;
    }
    if (sa > sb + tol) {
        return 0;
    }
    if (pa != pb) {
        return pa < pb;
    }
    return mmp_placement_subs(a) < mmp_placement_subs(b);
}

#define NB_ROOM 4096 /* placements best.nb holds */

typedef struct best {
    const mmp_cores_input *ci;
    int max_sub;
    mmp_placement pl;
    double step;
    int have, candidates;
    mmp_placement *nb; /* room for the neighbours */
} best;

/* Scores pl; 1 and *step when valid. */
static int try_score(best *B, const mmp_placement *pl, double *step)
{
    mmp_planner_eval e;
    B->candidates++;
    return score(B->ci, pl, &e, step, NULL, NULL) == MMP_OK;
}

/* The layer of [first, last) of u (exclusive of first) where a cut halves
 * the cost most evenly; -1 when the range has one layer. */
static int halving_cut(const mmp_planner_layers *u, int first, int last)
{
    if (last - first < 2) {
        return -1;
    }
    double total = sum_of(u, first, last, 0) + sum_of(u, first, last, 1), acc = 0, gap = INFINITY;
    int cut = first + 1;
    for (int l = first + 1; l < last; l++) {
        acc += u->fwd_ms[l - 1] + u->bwd_ms[l - 1];
        if (fabs(2 * acc - total) < gap) {
            gap = fabs(2 * acc - total);
            cut = l;
        }
    }
    return cut;
}

/* A unit of pl: sub-stage j of branch b, or fusion (b == 2). */
static int *replicas_of(mmp_placement *pl, int b, int j)
{
    return b == 2 ? &pl->fusion_replicas : &pl->sub[b][j].replicas;
}

/* Splits sub-stage j of branch b at layer cut, replicas ra and rb. */
/* pl with the cut after sub-stage j of branch b moved by d layers: 1 and
 * *out when there is such a cut and both sides keep a layer, else 0. */
static int move_cut(const mmp_placement *pl, int b, int j, int d, mmp_placement *out)
{
    if (j + 1 >= pl->n_sub[b]) {
        return 0;
    }
    int cut = pl->sub[b][j].last + d;
    if (cut <= pl->sub[b][j].first || cut >= pl->sub[b][j + 1].last) {
        return 0;
    }
    *out = *pl;
    out->sub[b][j].last = cut;
    out->sub[b][j + 1].first = cut;
    return 1;
}

static mmp_placement split_at(const mmp_placement *pl, int b, int j, int cut, int ra, int rb)
{
    mmp_placement x = *pl;
    int ns = pl->n_sub[b];
    memmove(&x.sub[b][j + 1], &x.sub[b][j], (size_t)(ns - j) * sizeof x.sub[b][0]);
    x.sub[b][j].last = cut;
    x.sub[b][j].replicas = ra;
    x.sub[b][j + 1].first = cut;
    x.sub[b][j + 1].replicas = rb;
    x.n_sub[b]++;
    return x;
}

/* pl's units in order, as (branch, sub-stage) pairs: image's sub-stages,
 * text's, then fusion as (2, 0); returns how many. */
static int list_units(const mmp_placement *pl, int *ub, int *uj)
{
    int nu = 0;
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < pl->n_sub[b]; j++) {
            ub[nu] = b;
            uj[nu++] = j;
        }
    }
    ub[nu] = 2;
    uj[nu++] = 0;
    return nu;
}

/* The neighbours of pl (the moves above, and a replica moved from one unit
 * to another) into nb; returns how many (at most room). */
static int neighbours(const best *B, const mmp_placement *pl, mmp_placement *nb, int room)
{
    int n = 0, P = mmp_placement_procs(pl), maxp = max_procs_of(B->ci);
#define ADD(x)                                                                                     \
    do {                                                                                           \
        if (n < room) {                                                                            \
            nb[n++] = (x);                                                                         \
        }                                                                                          \
    } while (0)

    int ub[2 * MMP_PLANNER_MAX_SUB + 1], uj[2 * MMP_PLANNER_MAX_SUB + 1];
    int nu = list_units(pl, ub, uj);
    for (int a = 0; a < nu; a++) {
        mmp_placement x = *pl;
        int *r = replicas_of(&x, ub[a], uj[a]);
        if (P < maxp && *r < MMP_MAX_REPLICAS) {
            (*r)++;
            ADD(x);
            (*r)--;
        }
        if (*r > 1) {
            (*r)--;
            ADD(x);
            for (int c = 0; c < nu; c++) { /* the replica to another unit */
                int *rc = replicas_of(&x, ub[c], uj[c]);
                if (c != a && *rc < MMP_MAX_REPLICAS) {
                    (*rc)++;
                    ADD(x);
                    (*rc)--;
                }
            }
        }
    }
    for (int b = 0; b < 2; b++) {
        const mmp_planner_layers *u = &B->ci->in.branch[b];
        int ns = pl->n_sub[b];
        for (int j = 0; j < ns; j++) {
            const mmp_planner_stage *g = &pl->sub[b][j];
            /* the cut after sub-stage j, one layer either way */
            for (int d = -1; d <= 1; d += 2) {
                mmp_placement x;
                if (move_cut(pl, b, j, d, &x)) {
                    ADD(x);
                }
            }
            /* split: at every layer of a short range, else at the halving
             * cut; the replicas kept on both sides or taken from one */
            if (ns < B->max_sub && g->last - g->first >= 2) {
                int half = halving_cut(u, g->first, g->last);
                int short_range = g->last - g->first <= 16;
                for (int cut = g->first + 1; cut < g->last; cut++) {
                    if (!short_range && cut != half) {
                        continue;
                    }
                    int R = g->replicas;
                    const int pairs[4][2] = {{R, R}, {R, 1}, {1, R}, {1, 1}};
                    for (int k = 0; k < 4; k++) {
                        int ra = pairs[k][0], rb = pairs[k][1];
                        if (P - R + ra + rb <= maxp && (k == 0 || ra + rb != 2 * R)) {
                            ADD(split_at(pl, b, j, cut, ra, rb));
                        }
                    }
                }
            }
            if (j + 1 < ns) {
                mmp_placement x = *pl;
                const mmp_planner_stage *h = &pl->sub[b][j + 1];
                x.sub[b][j].last = h->last;
                x.sub[b][j].replicas = g->replicas > h->replicas ? g->replicas : h->replicas;
                memmove(&x.sub[b][j + 1], &x.sub[b][j + 2],
                        (size_t)(ns - j - 2) * sizeof x.sub[b][0]);
                memset(&x.sub[b][ns - 1], 0, sizeof x.sub[b][0]);
                x.n_sub[b]--;
                ADD(x);
            }
        }
    }
#undef ADD
    return n;
}

/* Replica counts for the units of pl's cuts, every vector with at most
 * max_procs processes in all, unit u from *at on: the best into *bp. */
static void enum_rec(best *B, mmp_placement *x, const int *ub, const int *uj, int nu, int u,
                     int left, mmp_placement *bp, double *bs)
{
    if (u == nu) {
        double s;
        if (try_score(B, x, &s) && better(s, x, *bs, bp)) {
            *bp = *x;
            *bs = s;
        }
        return;
    }
    int *r = replicas_of(x, ub[u], uj[u]);
    for (int k = 1; k <= left - (nu - u - 1) && k <= MMP_MAX_REPLICAS; k++) {
        *r = k;
        enum_rec(B, x, ub, uj, nu, u + 1, left - k, bp, bs);
    }
}

/* Vectors of nu positive counts with sum <= maxp (capped at cap + 1). */
static double count_vectors(int nu, int maxp)
{
    double total = 0;
    for (int P = nu; P <= maxp; P++) { /* C(P - 1, nu - 1) */
        double c = 1;
        for (int i = 1; i < nu; i++) {
            c = c * (P - nu + i) / i;
        }
        total += c;
    }
    return total;
}

#define ENUM_MAX 20000 /* replica vectors tried exhaustively per cut set */

/* The best replica counts for pl's cuts when there are few enough vectors;
 * 1 and *pl, *step replaced when it beats them. */
static int best_replicas(best *B, mmp_placement *pl, double *step)
{
    int ub[2 * MMP_PLANNER_MAX_SUB + 1], uj[2 * MMP_PLANNER_MAX_SUB + 1];
    int nu = list_units(pl, ub, uj);
    int maxp = max_procs_of(B->ci);
    if (count_vectors(nu, maxp) > ENUM_MAX) {
        return 0;
    }
    mmp_placement x = *pl, bp = *pl;
    double bs = *step;
    enum_rec(B, &x, ub, uj, nu, 0, maxp, &bp, &bs);
    if (memcmp(&bp, pl, sizeof bp) == 0) {
        return 0;
    }
    *pl = bp;
    *step = bs;
    return 1;
}

/* A cut of pl moved by a layer, or a sub-stage split in two, each with its
 * best replica counts (where they can be enumerated): 1 and *pl, *step
 * replaced by the best when it beats them. */
static int moved_cut(best *B, mmp_placement *pl, double *step)
{
    /* B->nb is free here: descend asks for neighbours again after this */
    mmp_placement *cand = B->nb;
    static_assert(2 * MMP_PLANNER_MAX_SUB * (2 + 16) <= NB_ROOM, "room for the moved cuts");
    int n = 0;
    for (int b = 0; b < 2; b++) {
        int ns = pl->n_sub[b];
        for (int j = 0; j < ns; j++) {
            const mmp_planner_stage *g = &pl->sub[b][j];
            for (int d = -1; d <= 1; d += 2) {
                n += move_cut(pl, b, j, d, &cand[n]);
            }
            for (int cut = g->first + 1;
                 ns < B->max_sub && g->last - g->first <= 16 && cut < g->last; cut++) {
                cand[n++] = split_at(pl, b, j, cut, 1, 1);
            }
        }
    }
    mmp_placement bp = *pl;
    double bs = *step;
    for (int i = 0; i < n; i++) {
        double s;
        if (mmp_placement_procs(&cand[i]) > max_procs_of(B->ci) || !try_score(B, &cand[i], &s)) {
            s = INFINITY; /* best_replicas may still find counts that fit */
        }
        if (best_replicas(B, &cand[i], &s) || isfinite(s)) {
            if (better(s, &cand[i], bs, &bp)) {
                bp = cand[i];
                bs = s;
            }
        }
    }
    if (memcmp(&bp, pl, sizeof bp) == 0) {
        return 0;
    }
    *pl = bp;
    *step = bs;
    return 1;
}

/* Steepest descent from pl (valid, scored step); offers the end to B. */
static void descend(best *B, mmp_placement pl, double step)
{
    enum { ROOM = NB_ROOM };
    /* replica moves: units x (2 + other units); per sub-stage 2 cuts, 15 x 4 splits, 1 merge */
    static_assert(ROOM >= (2 * MMP_PLANNER_MAX_SUB + 1) * (2 * MMP_PLANNER_MAX_SUB + 2) +
                              2 * MMP_PLANNER_MAX_SUB * (2 + 15 * 4 + 1),
                  "room for every neighbour");
    mmp_placement *nb = B->nb;
    for (int iter = 0; iter < 10000; iter++) {
        int n = neighbours(B, &pl, nb, ROOM), pick = -1;
        double pick_step = step;
        const mmp_placement *pick_pl = &pl;
        for (int i = 0; i < n; i++) {
            double s;
            if (try_score(B, &nb[i], &s) && better(s, &nb[i], pick_step, pick_pl)) {
                pick = i;
                pick_step = s;
                pick_pl = &nb[i];
            }
        }
        if (pick < 0) {
            if (best_replicas(B, &pl, &step) || moved_cut(B, &pl, &step)) {
                continue; /* better counts for these or nearby cuts: descend from there */
            }
            break;
        }
        pl = nb[pick];
        step = pick_step;
    }
    if (!B->have || better(step, &pl, B->step, &B->pl)) {
        B->pl = pl;
        B->step = step;
        B->have = 1;
    }
}

mmp_err mmp_planner_cores_plan(const mmp_cores_input *ci, mmp_planner_result *out)
{
    MMP_TRY(check_cores(ci));
    best B = {.ci = ci, .max_sub = ci->in.max_sub > 0 ? ci->in.max_sub : MMP_PLANNER_DEFAULT_SUB};
    B.nb = malloc(NB_ROOM * sizeof *B.nb);
    if (!B.nb) {
        return mmp_errorf(MMP_ERR_NOMEM, "planner: cores: neighbours");
    }
    mmp_placement one;
    memset(&one, 0, sizeof one);
    for (int b = 0; b < 2; b++) {
        one.n_sub[b] = 1;
        one.sub[b][0] = (mmp_planner_stage){.first = 0, .last = ci->in.branch[b].n, .replicas = 1};
    }
    one.fusion_replicas = 1;
    double step = 0;
    mmp_err first_err = MMP_OK;
    if (try_score(&B, &one, &step)) {
        descend(&B, one, step);
    }
    for (int P = 3; P <= max_procs_of(ci); P++) {
        mmp_planner_input in = ci->in;
        in.devices = P;
        in.method = MMP_PLANNER_CLOSED_FORM;
        mmp_planner_result r;
        mmp_err e = mmp_planner_plan(&in, &r);
        if (e != MMP_OK) {
            first_err = first_err == MMP_OK ? e : first_err;
            continue; /* e.g. nothing fits the memory cap on P devices */
        }
        if (try_score(&B, &r.placement, &step)) {
            descend(&B, r.placement, step);
        }
    }
    free(B.nb);
    if (!B.have) {
        return first_err != MMP_OK
                   ? mmp_error_prefix(first_err, "planner: cores: no placement on %d cores",
                                      ci->cores)
                   : mmp_errorf(MMP_ERR_INVALID, "planner: cores: no placement on %d cores",
                                ci->cores);
    }
    mmp_planner_result r;
    memset(&r, 0, sizeof r);
    r.placement = B.pl;
    MMP_TRY(mmp_planner_cores_evaluate(ci, &B.pl, &r.eval, NULL));
    r.bound_ms = r.eval.busy_ms / ci->cores;
    r.candidates = B.candidates;
    *out = r;
    return MMP_OK;
}
