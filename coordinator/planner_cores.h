/* The planner on CPU cores: placements whose stage processes share cores.
 *
 * coordinator/planner.h gives every process a device of its own. On a CPU
 * host the devices are its cores, and a pipeline of 3 processes on 2 cores
 * (or 5 on 2) is a fine placement as long as every core's work per step is
 * about the same: a small stage shares a core with a replica of a big one.
 * This module scores and chooses such placements for C cores. Pure, like
 * the planner: no I/O, no clocks, no globals; the same input gives the same
 * placement.
 *
 * Packing
 * -------
 * Process k of a placement (image sub-stages, then text sub-stages, then
 * fusion; replicas in order -- the order the schedule compiler and
 * mmp_placement_format use) runs on core k % C: train.pin's rule
 * (common/pin.h), which is what makes a pinned run do what was planned (an
 * unpinned one is placed by the OS, usually as well or better).
 *
 * The cost model (the planner's per-layer costs and input, in->devices
 * ignored)
 * ------------------------------------------------------------------------
 * The runtime deals whole micro-batches to a stage's replicas, so replica r
 * of R handles n_r = m / R micro-batches, one more for r < m % R; one
 * micro-batch of a sub-stage costs q0 * (its layers' fwd_ms + bwd_ms), q0 =
 * ceil(batch / m). A core's load per step is the sum over its processes of
 * n_r times that -- except that under the batch-wide loss (in->batch_loss)
 * every fusion replica runs the whole batch's backward (replicas gather the
 * batch's rows and each computes the loss), so its backward counts m
 * micro-batches. The predicted step is the largest of three lower bounds,
 *
 *   1. cores:    the most loaded core + step_overhead_ms;
 *   2. flush:    (in->batch_loss only: no branch backward starts before the
 *                last forward) the most forward work on a core + the most
 *                fusion backward on a core + the most branch backward on a
 *                core + step_overhead_ms;
 *   3. pipeline: the planner's closed form for the same placement with a
 *                device per process (mmp_planner_evaluate, fill and drain,
 *                the replicas' all-reduce) -- sharing cores never makes a
 *                chain shorter.
 *
 * Busy time and efficiency as in planner.h, over C cores:
 * busy / (C * step).
 *
 * The search
 * ----------
 * Seeds: one process per stage, and for every process count P from 3 to
 * max_procs the planner's own placement for P devices. Each seed is then
 * improved by steepest descent over the moves: a replica more or less on
 * one sub-stage (or fusion), a cut moved by one layer, a sub-stage split in
 * two at the layer that halves its cost, two neighbouring sub-stages merged
 * -- while the predicted step shortens. A placement with more processes
 * must predict a step more than MMP_CORES_PROC_TOLERANCE shorter to win:
 * every process adds what the model does not count (a replica's share of
 * the reduce and, for fusion under the batch-wide loss, the gather; context
 * switches). Ties (within 1e-9 relative) go to fewer sub-stages. Each
 * local optimum is then tried with every replica count vector for its cuts
 * and for its cuts moved by one layer (where there are at most 20000) before
 * the descent goes on. Not proved optimal:
 * tests/test_planner_cores.c compares it with exhaustive search on small
 * cases. */
#ifndef MMP_COORDINATOR_PLANNER_CORES_H
#define MMP_COORDINATOR_PLANNER_CORES_H

#include "coordinator/planner.h"

/* Processes a cores placement has at most. Its own limit, below the
 * schedule's (MMP_SCHED_MAX_STAGES, 1024): the search's cost grows steeply
 * with the processes it may use (configs/cluster-64.yaml --plan-cores 64:
 * 40 s on a loaded 2-core machine at this limit, over 100 s at 131). */
#define MMP_CORES_MAX_PROCS 64
/* More processes must buy a step this much shorter (see The search). */
#define MMP_CORES_PROC_TOLERANCE 0.03

typedef struct mmp_cores_input {
    mmp_planner_input in; /* costs, batch, schedule...; in.devices is not read */
    int cores;            /* C, 1 to MMP_PLANNER_MAX_DEVICES */
    int max_procs;        /* 0: min(2 C + 3, MMP_CORES_MAX_PROCS); else 3 to that limit */
} mmp_cores_input;

/* Scores pl on ci->cores cores as above (method CLOSED_FORM; devices_used
 * the cores with a process; stage_ms and the rest as the planner's per
 * process). *core_ms (may be NULL, room for ci->cores) gets each core's
 * load. Writes *ev only on success; MMP_ERR_INVALID (message
 * "planner: cores: ...") for an invalid input or placement. Never blocks. */
mmp_err mmp_planner_cores_evaluate(const mmp_cores_input *ci, const mmp_placement *pl,
                                   mmp_planner_eval *ev, double *core_ms);

/* Priorities
 * ----------
 * Where a placement's processes outnumber the cores, the kernel's fair
 * share between the processes of a core decides what runs first: a light
 * stage's short piece of work that the others wait on (the fusion's
 * backward after the batch-wide flush, a text forward) then waits behind a
 * replica of the big stage for a slice, while the other core idles. So the
 * processes that carry the big shares run at a lower priority (nice
 * MMP_CORES_NICE_HEAVY) and the light ones, and the coordinator's control
 * messages, go first; the big stage still gets every cycle they leave.
 * (Measured on the demo, 2 cores: README "The pipeline on the cores there
 * are".) */
#define MMP_CORES_NICE_HEAVY 10

/* The nice value of each process of pl on ci's cores, in packing order,
 * into nice[0..P): MMP_CORES_NICE_HEAVY for a process whose step load (as
 * the packing counts it) is at least half the largest, 0 for the others;
 * all 0 when the processes do not outnumber the cores or every process is
 * heavy (nothing light to go first). Returns P, or -1
 * (nice untouched) when ci or pl is invalid. Pure. */
int mmp_planner_cores_nice(const mmp_cores_input *ci, const mmp_placement *pl, int *nice);

/* Chooses the placement for ci as described above. Writes *out only on
 * success (bound_ms: the least load any core can have, total work / C;
 * candidates: placements scored). MMP_ERR_INVALID for an invalid input;
 * the planner's errors as they are. Deterministic; never blocks; what it
 * allocates is freed before it returns. */
mmp_err mmp_planner_cores_plan(const mmp_cores_input *ci, mmp_planner_result *out);

#endif
