/* What the stages cost: the one place that turns measurements (or the plan's
 * nominal model) into the simulator's per-process costs (mmp_sim_costs,
 * coordinator/schedule.h) and the planner's per-layer costs
 * (coordinator/planner.h). Used by `mmpipe simulate`, `mmpipe bench` (its
 * predicted bubble) and the live balancer (coordinator/balancer.h).
 *
 * The estimate, whatever the source: a stage's time per sample is its
 * fastest replica's (forward + backward), spread evenly over the stage's
 * layers; fusion is one unit. Hand-off latency (send_ms) and the step's
 * grad-norm + optimizer overhead are not measured anywhere (metrics.jsonl
 * has no such fields, common/metrics.h): estimates from a run set them to 0. */
#ifndef MMP_COORDINATOR_COSTS_H
#define MMP_COORDINATOR_COSTS_H

#include <stdio.h>

#include "common/config.h"
#include "common/err.h"
#include "common/metrics.h"
#include "coordinator/planner.h"
#include "coordinator/schedule.h"

/* The nominal model: forward this many ms per layer per sample, backward twice that. */
#define MMP_COSTS_NOMINAL_FWD_MS 0.1

/* Per-process costs per micro-batch for s, compiled from p, without a run:
 * under `compute: simulated` the plan's own sim.* costs on the device slot
 * the coordinator gives each process; else the nominal model. Load, send and
 * step overhead 0. */
void mmp_costs_nominal(const mmp_plan *p, const mmp_sched *s, mmp_sim_costs *c);

/* What mmp_costs_measure read. */
typedef struct mmp_costs_run {
    char path[1100];                           /* the metrics.jsonl */
    char placement[MMP_METRICS_PLACEMENT_MAX]; /* the run's last; "" when it records none */
    int n_steps;                               /* steps the medians are over */
    double step_ms;                            /* their median measured step time */
    /* the replicas' micro-batches in the last step where they were routed
     * unevenly ("image.0/0 32, image.0/1 16"), the deal simulated; "" when
     * every replica had as many as the others */
    char routing[256];
} mmp_costs_run;

/* A run's measured costs: run is its directory or its metrics.jsonl. Sets
 * plan's stages.* to the placement of the run's last step (a balanced run
 * re-places; when it records none the plan's stays), compiles *s from plan,
 * and fills *c with the medians over that placement's steps -- the first,
 * a warm-up, left out when there are two or more -- of each process's
 * fwd_ms, bwd_ms and load_ms (a replica without its own entry takes its
 * stage's other replica's); send_ms and step_overhead_ms 0. *info says what
 * was read. Errors (MMP_ERR_IO, MMP_ERR_DATA naming path:line, the compiler's)
 * carry their message; mmp_sched_fini(s) is valid after any return. */
mmp_err mmp_costs_measure(const char *run, mmp_plan *plan, mmp_sched *s, mmp_sim_costs *c,
                          mmp_costs_run *info);

/* Per-layer, per-sample costs for the planner (branch arrays indexed by
 * MMP_PLANNER_IMAGE / MMP_PLANNER_TEXT). */
typedef struct mmp_layer_costs {
    double fwd[2][MMP_PLANNER_MAX_LAYERS], bwd[2][MMP_PLANNER_MAX_LAYERS];
    double fusion_fwd, fusion_bwd;
    /* memory (0: not measured), the planner's state_bytes and act_bytes:
     * see mmp_costs_per_layer_mem */
    double mem[2][MMP_PLANNER_MAX_LAYERS], fusion_mem;
    double act[2][MMP_PLANNER_MAX_LAYERS], fusion_act;
    int have_mem; /* every stage had a measured peak */
} mmp_layer_costs;

/* The estimate above: fwd_ms[i], bwd_ms[i] are process i's forward and
 * backward time per sample (NAN: not measured); each stage of s takes its
 * fastest measured replica's, spread evenly over its layers (layers past
 * MMP_PLANNER_MAX_LAYERS dropped). Fills *out (zeroed first) and returns 1,
 * or 0 when a stage has no measured replica. */
int mmp_costs_per_layer(const mmp_sched *s, const double *fwd_ms, const double *bwd_ms,
                        mmp_layer_costs *out);
/* Adds the memory. Process i reported mem_bytes[i], its peak (0: none);
 * state_bytes[i], its parameter arenas; act_slots[i], the micro-batches of q0
 * samples whose activations it keeps room for (state_bytes and act_slots may
 * be NULL, or 0 for a process: not reported). A stage takes its replica with
 * the largest peak. Where that replica reported both, its state is spread
 * evenly over the stage's layers as state_bytes and the rest of its peak
 * (activations, and whatever else the process holds) per slot and sample,
 * spread evenly too, as act_bytes: the planner then charges a placement
 * state + held * q0 * act, where held is what its schedule lets the stage
 * hold, so the measured placement comes back as measured and a stage given
 * more micro-batches in flight grows. Otherwise the whole peak is state.
 * Sets out->have_mem when every stage had a peak. */
void mmp_costs_per_layer_mem(const mmp_sched *s, const double *mem_bytes, const double *state_bytes,
                             const int *act_slots, int q0, mmp_layer_costs *out);

/* The planner's input for plan p with lc's costs (lc must outlive in's
 * use): the branches' layer counts, fusion as one unit, p's micro-batches
 * and schedule, method MMP_PLANNER_AUTO. devices, batch, send_ms and the
 * rest are zero: the caller's to set. */
void mmp_costs_planner_input(const mmp_plan *p, const mmp_layer_costs *lc, mmp_planner_input *in);

/* The prediction as `mmpipe simulate` prints it: per process its layers,
 * depth, in-flight, costs, busy and idle time, then "predicted step time X
 * ms, Y samples/s, bubble Z%". Writes to f only. */
void mmp_costs_report(FILE *f, const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                      const mmp_sim_result *r);

#endif
