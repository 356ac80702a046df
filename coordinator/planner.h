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
 * ceil(batch / m) samples are in the largest one. A sub-stage holding layers
 * [first, last) of its branch with r replicas splits every micro-batch among
 * its replicas, so one replica handles q = ceil(q0 / r) samples and takes
 *
 *     t = q * sum over its layers of (fwd_ms + bwd_ms)        per micro-batch.
 *
 * The fusion stage is one unit (never cut) with rf replicas, the same way.
 * Replicas past q0 buy nothing: a replica cannot take part of a sample.
 *
 * Closed form (1F1B and GPipe alike; exact for a chain of equal stages):
 *
 *     step = (m - 1) * B + max(P_image, P_text) + t_fusion + AR + overhead
 *
 * B is the bottleneck max t over every stage; P_branch is the sum of the
 * branch's sub-stage times plus 2 * send_ms per hop (activations forward,
 * gradients back) -- the fill and drain of the longest path; AR is the
 * slowest stage's gradient all-reduce among its replicas, 2 (r - 1) / r *
 * grad_bytes / allreduce_bytes_per_ms (0 when that bandwidth is 0), run after
 * the last backward.
 *
 * Simulated: the placement's stage graph, each replicated stage folded into
 * one stage with the per-replica times above, compiled by
 * mmp_sched_compile_stages() and run by mmp_sched_simulate() (AR and overhead
 * as its step overhead). It sees what the closed form cannot: a short branch
 * waiting on the long one at fusion, channel slots running out.
 *
 * Busy time is the compute the step needs, sum over stages of
 * batch * (fwd_ms + bwd_ms over its layers) -- the same for every placement.
 * Balance efficiency = busy / (devices * step): the share of the D devices'
 * time spent computing (devices left unused count as idle).
 *
 * Memory per device of a sub-stage at depth d (stages from it to the end of
 * the pipeline inclusive, as the schedule counts them):
 *
 *     sum state_bytes + inflight * q * sum act_bytes
 *
 * inflight = min(d, m) under 1F1B, m under GPipe, 1 for fusion (it runs each
 * micro-batch's backward right after its forward).
 *
 * The search
 * ----------
 * 1. Bottleneck: the least B any placement reaches, by bisection on a
 *    bottleneck bound T. For a given T, the fewest devices a branch needs with
 *    exactly k sub-stages is a dynamic programme over suffixes of its layers,
 *    need[k][l] = min over cuts e of r(l, e, depth k + 1, T) + need[k - 1][e],
 *    where r(...) is the fewest replicas that make the range meet T and fit
 *    the memory cap (O(1) from prefix sums); among cuts as cheap in devices
 *    it keeps the one with the least sum of stage times. T is feasible when
 *    the two branches' best k plus fusion's replicas fit in D. Exact: T* is
 *    the least bottleneck over all placements with at most max_sub
 *    sub-stages per branch (bound_ms in the result).
 * 2. Fill and drain: for a grid of J = 12 bounds from T* to T* (1 + K / m)
 *    (a larger bottleneck cannot win: step >= m B), every pair (k_image,
 *    k_text) of sub-stage counts that fits gives its cheapest cut; spare
 *    devices then go, a move at a time, to the stage (or the stages tied at
 *    the bottleneck, together) whose extra replicas shorten the closed-form
 *    step most per device.
 * 3. Polish: the best MMP_PLANNER_RESCORE placements so far are improved by
 *    local search -- move one cut by a layer; take a replica off one stage
 *    and give the freed devices to another, or back to the fill -- while
 *    the closed-form step shortens.
 *    Steps 2 and 3 are a heuristic, not proved optimal in the fill/drain
 *    term; against exhaustive search on small cases (tests/test_planner.c)
 *    it finds the best closed-form step in more than 99% of cases and is
 *    within 1% in the rest.
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
 *    MMP_PLANNER_SIMULATED the best MMP_PLANNER_RESCORE are simulated and the
 *    best simulated one wins (same tie rules); the reported step is then the
 *    simulator's, with the closed form's beside it.
 *
 * Cost: with L layers in the longer branch, K = max_sub and q0 samples per
 * micro-batch, O((log(D q0) + J) K L^2) for the programmes, plus
 * O(J K^2) fills of at most D moves of O(S^2) each (S = 2K + 1 stages; in
 * practice a few moves), plus MMP_PLANNER_RESCORE polishes and simulations of
 * O(m S). Measured (one core, -O2): 1024 devices with L = 50 in about 20 ms,
 * L = 258 (the most a plan's model has) in 0.15 s, L = 512 in 0.5 s
 * (K = 15: 0.9 s); 65536 devices with L = 100 in 30 ms. */
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
    double bottleneck_ms;                       /* B: the slowest stage per micro-batch */
    int devices_used;                           /* sum of replicas, <= devices */
    double stage_ms[2][MMP_PLANNER_MAX_SUB];    /* t per micro-batch, one replica */
    double stage_bytes[2][MMP_PLANNER_MAX_SUB]; /* memory per device */
    double fusion_ms, fusion_bytes;
} mmp_planner_eval;

typedef struct mmp_planner_result {
    mmp_placement placement;
    mmp_planner_eval eval;
    double bound_ms; /* T*: the least bottleneck any allowed placement reaches */
    int candidates;  /* distinct placements scored with the closed form */
    int simulated;   /* of them, scored again by the simulator */
} mmp_planner_result;

/* Checks in (every rule in the comments above): MMP_OK, or MMP_ERR_INVALID
 * with "planner: <what>: <why>" in mmp_last_error(). */
mmp_err mmp_planner_check(const mmp_planner_input *in);

/* Scores placement pl for in with method (AUTO: the simulator when the
 * folded graph compiles, which with at most MMP_PLANNER_MAX_SUB sub-stages
 * per branch is always). Writes *ev only on success. MMP_ERR_INVALID when in
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
