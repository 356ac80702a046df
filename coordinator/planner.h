/* The placement planner: given what every layer costs, how much memory it
 * holds and how many devices there are, choose where each branch is cut into
 * sub-stages and how many data-parallel replicas each sub-stage (and the
 * fusion stage) gets, so that the slowest stage -- the bottleneck every
 * micro-batch queues behind -- is as fast as the devices allow.
 *
 * One code path serves the live balancer (per-layer costs measured by the
 * stages) and `mmpipe simulate --plan-devices N` (costs from a plan, for
 * device counts far beyond this machine: 64, 1024). Everything here is pure:
 * no I/O, no clocks, no globals; the same input gives the same placement.
 *
 * The cost model (what "predicted" means below)
 * ---------------------------------------------
 * A step is `batch` samples in m = microbatches micro-batches; q0 =
 * ceil(batch / m) samples are in the largest one. The runtime deals whole
 * micro-batches to a stage's replicas, in turn (mmp_sched_route with equal
 * speeds), so one replica of a sub-stage holding layers [first, last) of its
 * branch takes a whole micro-batch at a time,
 *
 *     t = q0 * sum over its layers of (fwd_ms + bwd_ms)        per micro-batch,
 *
 * however many replicas the stage has, and the busiest of r replicas takes
 * n = ceil(m / r) of the m micro-batches (its rounds). Replicas do not
 * shorten a micro-batch's path; they let micro-batches through side by side.
 * Replicas past m buy nothing. The fusion stage is one unit (never cut) with
 * rf replicas, the same way.
 *
 * Closed form: what each stage alone makes the step, the most of them,
 *
 *     step = max over stages s of v_s + AR + overhead
 *     v_s  = (n_s - 1) t_s + the longest path through s
 *
 * (a flow shop: the busiest replica of s queues its other n_s - 1
 * micro-batches, and the first of them still has to get to s and the last
 * one away). The path of a branch stage is its branch's sum of t plus
 * 2 * send_ms a hop (activations forward, gradients back) plus t_fusion;
 * fusion's is the longer branch's. Under 1F1B (and zb-h1) a replica holds
 * about w = min(depth, n) micro-batches (memory, below); one with n > w runs
 * its (w + 1)-th forward only after its first backward, whose gradient
 * comes back once the step's first micro-batch has crossed the longer
 * branch's forward and fusion, and then alternates forward and backward, so
 * its last micro-batch crosses fusion late and then the longer branch's
 * backward: v_s is at least
 *
 *     Fl + tf + Bd + (n - w)(f + b) + Fd + tf + max(Bl, w b + Bu)
 *
 * (f, b: its forward and backward halves of t; Fl, Bl: the longer branch's
 * forward and backward paths; Fd, Bd: its own branch's after it; Bu: before
 * it). W, the bottleneck (bottleneck_ms, bound_ms), is the most any stage
 * queues, max (n_s - 1) t_s. AR is the slowest stage's gradient all-reduce
 * among its replicas, 2 (r - 1) / r * grad_bytes / allreduce_bytes_per_ms (0
 * when that bandwidth is 0), run after the last backward. With one replica a
 * stage the form is the old (m - 1) B + path, exact for a chain of equal
 * stages; the closed form is within 3% of the simulator on the planner's own
 * placements in tests/test_planner.c, within 17% on random ones.
 *
 * Simulated: the placement's stage graph as the runtime compiles it, every
 * replica a process (mmp_sched_compile_stages(), micro-batches dealt whole
 * and in turn), run by mmp_sched_simulate() with the per-micro-batch times
 * above (AR and overhead as its step overhead): the figure `mmpipe simulate
 * --set` gives for the keys. It applies while the placement fits one
 * schedule (MMP_SCHED_MAX_STAGES processes, MMP_SCHED_MAX_EDGES edges); AUTO
 * falls back to the closed form past that, and past MMP_PLANNER_SIM_BUDGET. It sees what the closed
 * form cannot: a short branch waiting on the long one at fusion, channel slots running out, the
 * replicas' exact 1F1B lists.
 *
 * Busy time is the compute the step needs, sum over stages of
 * batch * (fwd_ms + bwd_ms over its layers) -- the same for every placement.
 * Balance efficiency = busy / (devices * step): the share of the D devices'
 * time spent computing (devices left unused count as idle).
 *
 * Memory per device of a sub-stage at depth d (stages from it to the end of
 * the pipeline inclusive, as the schedule counts them) with r replicas:
 *
 *     sum state_bytes + min(inflight, ceil(m / r)) * q0 * sum act_bytes
 *
 * a replica holds whole micro-batches, no more than it is dealt; inflight =
 * min(d, m) under 1F1B (the compiler warms r replicas up with r d - 1
 * forwards, about d each), m under GPipe, 1 for fusion (it runs each
 * micro-batch's backward right after its forward). Not modelled: a stage
 * with few replicas before one with many is warmed up past r d - 1 (the
 * compiler's warm >= the next stage's + 1), so it can hold more than d.
 *
 * The search
 * ----------
 * 1. Bottleneck: the least W any placement reaches, by bisection on a
 *    queueing bound T (from 0: a replica per micro-batch everywhere). For a
 *    given T, the fewest devices a branch needs with
 *    exactly k sub-stages is a dynamic programme over suffixes of its layers,
 *    need[k][l] = min over cuts e of r(l, e, depth k + 1, T) + need[k - 1][e],
 *    where r(...) is the fewest replicas that make the range queue at most T,
 *    (ceil(m / r) - 1) t <= T, and fit the memory cap (O(1) from prefix
 *    sums); among cuts as cheap in devices it keeps the one with the least
 *    sum of stage times. T is feasible when the two branches' best k plus
 *    fusion's replicas fit in D. Exact: T* is the least W over all
 *    placements with at most max_sub sub-stages per branch (bound_ms).
 * 2. Fill: for a grid of J = 12 bounds from T* to the W of the cheapest
 *    placement (quadratically spaced: a looser bound takes fewer devices and
 *    cuts differently), every pair (k_image, k_text) of sub-stage counts
 *    that fits gives its cheapest cut; spare devices then go, a move at a
 *    time (one round fewer for a stage's busiest replica), to the stage (or
 *    the stages that make the step, together) whose extra replicas shorten
 *    the closed-form step most per device.
 * 3. Polish: the best MMP_PLANNER_RESCORE placements so far are improved by
 *    local search -- move one cut by a layer, alone or with a replica from
 *    one of the two stages it parts to the other; split a layer off either
 *    end of a sub-stage into one of one replica; take a replica off one
 *    stage and give the freed devices to another, or back to the fill --
 *    while the closed-form step shortens. Then each is trimmed: devices its
 *    step does not need (a stage off the longest path may queue more;
 *    replicas past the micro-batches) are given back, and both versions
 *    are candidates (the simulator may tell them apart).
 *    Steps 2 and 3 are a heuristic, not proved optimal; against exhaustive
 *    search on small cases (tests/test_planner.c, 290 of them) it finds the
 *    best closed-form step in every one.
 * Every step keeps within what a plan can hold (common/plan.c): at most
 * MMP_MAX_REPLICAS replicas a stage, and a branch's first sub-stage (it
 * loads the data; the runtime deals it whole micro-batches) at most m. A
 * stage that would need more to meet a bound does not fit that bound; spare
 * devices are left unused rather than given past these limits. (How many
 * processes a schedule holds, MMP_SCHED_MAX_STAGES, is not a limit here:
 * `mmpipe simulate --plan-devices` plans clusters on paper; the live
 * balancer asks for no more devices than a schedule holds.)
 * 4. Ranking: candidates by the closed form; ties (within 1e-9 relative) go
 *    to fewer sub-stages, then fewer devices. With MMP_PLANNER_AUTO or
 *    MMP_PLANNER_SIMULATED the best MMP_PLANNER_RESCORE are simulated (the
 *    replicated graph) and the
 *    best simulated one wins (same tie rules); the reported step is then the
 *    simulator's, with the closed form's beside it.
 *
 * Cost: with L layers in the longer branch, K = max_sub and m micro-batches,
 * O((log(D m) + J) K L^2) for the programmes, plus O(J K^2) fills of at
 * most D moves of O(S^2) each (S = 2K + 1 stages; in practice a few moves),
 * plus MMP_PLANNER_RESCORE polishes and trims, and simulations of the
 * replicated graph, O(m P) for P processes (at most MMP_SCHED_MAX_STAGES),
 * plus its edges. Measured (one core, -O2, 2026-11-28):
 * `mmpipe simulate configs/cluster-1024.yaml --plan-devices all` plans in
 * about 0.1 s, most of it the eight simulations; the figures for larger L
 * and D (L = 258 in 0.15 s, 65536 devices in 30 ms) are from the model
 * before it dealt whole micro-batches and are not re-measured. */
#ifndef MMP_COORDINATOR_PLANNER_H
#define MMP_COORDINATOR_PLANNER_H

#include "common/config.h"
#include "common/err.h"

/* Sub-stages per branch: the default is what a plan can express
 * (stages.*.split has MMP_MAX_SPLITS points); the most is what the schedule
 * compiler holds (two branches and fusion in MMP_SCHED_MAX_STAGES). */
#define MMP_PLANNER_DEFAULT_SUB (MMP_MAX_SPLITS + 1)
#define MMP_PLANNER_MAX_SUB 15
#define MMP_PLANNER_MAX_LAYERS 512 /* per branch */
#define MMP_PLANNER_MAX_DEVICES 65536
#define MMP_PLANNER_RESCORE 8 /* candidates the simulator re-scores */
/* AUTO simulates a placement of P processes and m micro-batches while
 * P m is at most this (1024 processes and 1024 micro-batches take seconds
 * a simulation); past it the closed form is the figure. */
#define MMP_PLANNER_SIM_BUDGET (1L << 17)

enum { MMP_PLANNER_IMAGE = 0, MMP_PLANNER_TEXT = 1 }; /* index of a branch */

typedef enum mmp_planner_method {
    MMP_PLANNER_AUTO = 0,    /* the simulator where it applies, else the closed form */
    MMP_PLANNER_CLOSED_FORM, /* the formula above only */
    MMP_PLANNER_SIMULATED,   /* the simulator, an error where it does not apply */
} mmp_planner_method;

/* One branch's layers (or the fusion unit's), in order. Arrays are the
 * caller's, read during the call only. */
typedef struct mmp_planner_layers {
    int n;                     /* layers, 1 to MMP_PLANNER_MAX_LAYERS */
    const double *fwd_ms;      /* [n] forward time per sample; finite, >= 0 */
    const double *bwd_ms;      /* [n] backward time per sample; finite, >= 0 */
    const double *state_bytes; /* [n] or NULL (0): weights, gradients, optimizer state */
    const double *act_bytes;   /* [n] or NULL (0): per sample, kept from FWD to BWD */
    const double *grad_bytes;  /* [n] or NULL (0): all-reduced among a stage's replicas */
} mmp_planner_layers;

typedef struct mmp_planner_input {
    mmp_planner_layers branch[2];  /* [MMP_PLANNER_IMAGE], [MMP_PLANNER_TEXT] */
    mmp_planner_layers fusion;     /* one unit, never cut: only its sums count */
    int devices;                   /* D, 3 to MMP_PLANNER_MAX_DEVICES */
    int batch;                     /* samples per step, >= 1 */
    int microbatches;              /* m, 1 to batch */
    mmp_schedule schedule;         /* GPipe or 1F1B: in-flight activations, simulation */
    int batch_loss;                /* model.fusion.itc_scope: batch: every stage holds all m */
    int max_sub;                   /* sub-stages per branch at most; 0: MMP_PLANNER_DEFAULT_SUB */
    double mem_cap_bytes;          /* per device; 0: no cap */
    double send_ms;                /* one message's hand-off between stages */
    double allreduce_bytes_per_ms; /* replicas' gradient all-reduce; 0: free */
    double step_overhead_ms;       /* grad-norm barrier + optimizer, per step */
    mmp_planner_method method;     /* how the final candidates are scored */
} mmp_planner_input;

typedef struct mmp_planner_stage {
    int first, last; /* the half-open layer range [first, last) of its branch */
    int replicas;    /* >= 1 */
} mmp_planner_stage;

/* Sub-stage j of branch b holds sub[b][j]; entries past n_sub[b] are zero
 * (so two placements compare with memcmp). */
typedef struct mmp_placement {
    int n_sub[2];
    mmp_planner_stage sub[2][MMP_PLANNER_MAX_SUB];
    int fusion_replicas;
} mmp_placement;

/* Processes (devices) placement pl runs: every sub-stage's replicas and the
 * fusion's. */
int mmp_placement_procs(const mmp_placement *pl);
/* Its sub-stages, both branches (fusion not counted). */
int mmp_placement_subs(const mmp_placement *pl);

typedef struct mmp_planner_eval {
    mmp_planner_method method;                  /* CLOSED_FORM or SIMULATED: which step_ms is */
    double step_ms;                             /* predicted step time */
    double closed_form_ms;                      /* the closed form's figure, whichever method */
    double samples_per_s;                       /* batch / step */
    double busy_ms;                             /* compute the step needs, over all devices */
    double efficiency;                          /* busy / (devices * step), in [0, 1] */
    double bottleneck_ms;                       /* W: the most a stage queues, (n - 1) t */
    int devices_used;                           /* sum of replicas, <= devices */
    double stage_ms[2][MMP_PLANNER_MAX_SUB];    /* t per micro-batch, one replica */
    double stage_bytes[2][MMP_PLANNER_MAX_SUB]; /* memory per device */
    double fusion_ms, fusion_bytes;
} mmp_planner_eval;

typedef struct mmp_planner_result {
    mmp_placement placement;
    mmp_planner_eval eval;
    double bound_ms; /* T*: the least W any allowed placement reaches */
    int candidates;  /* distinct placements scored with the closed form */
    int simulated;   /* of them, scored again by the simulator */
} mmp_planner_result;

/* Checks in (every rule in the comments above): MMP_OK, or MMP_ERR_INVALID
 * with "planner: <what>: <why>" in mmp_last_error(). */
mmp_err mmp_planner_check(const mmp_planner_input *in);

/* Scores placement pl for in with method (AUTO: the simulator when the
 * replicated graph fits one schedule and MMP_PLANNER_SIM_BUDGET, else the
 * closed form; SIMULATED: an
 * error past that). Writes *ev only on success. MMP_ERR_INVALID when in
 * or pl is invalid (ranges that do not tile a branch, replicas < 1 or more
 * than in->devices in all, a stage over in->mem_cap_bytes -- named in the
 * message); the simulator's errors as they are. Never blocks; allocates only
 * inside the simulator, freed before it returns. */
mmp_err mmp_planner_evaluate(const mmp_planner_input *in, const mmp_placement *pl,
                             mmp_planner_eval *ev);

/* Chooses the placement for in as described above and scores it with
 * in->method. Writes *out only on success. MMP_ERR_INVALID for an invalid
 * input, or when no placement fits the memory cap in in->devices (the message
 * gives the fewest devices that would do); MMP_ERR_NOMEM. Deterministic;
 * never blocks; its allocations are freed before it returns. */
mmp_err mmp_planner_plan(const mmp_planner_input *in, mmp_planner_result *out);

const char *mmp_planner_method_name(mmp_planner_method m);

#endif
