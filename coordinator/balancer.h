/* The load balancer: the coordinator's judgement between steps, never on the
 * per-micro-batch path.
 *
 * It is fed, once per step, what each process reported in its StepDone (the
 * compute time of its own micro-batches and how many samples they held, its
 * busy time) and makes two kinds of decision:
 *
 * 1. Routing (balance.routing: weighted): each replica's speed is its
 *    samples per millisecond of compute, the median over the last
 *    balance.window steps. When the replicas of a stage differ by more than
 *    10% from the speeds the current routing was compiled with, the routing
 *    is recompiled with the new speeds (coordinator/schedule.h,
 *    mmp_sched_route): a replica twice as slow gets half the micro-batches.
 *    round_robin keeps equal speeds. Not on a CPU plan whose processes
 *    outnumber its cores: the planner on cores packed them for micro-batches
 *    dealt equally, and there a replica's wall-time speed measures whom it
 *    shares its core with, not the replica (routing by it flapped between
 *    1:3 and 3:1 on the demo, a quarter of the step each time).
 * 2. Placement (balance.mode: dynamic): once balance.window steps have been
 *    measured since the stages were (re)launched, the per-layer costs are
 *    estimated (each stage's time per sample on its fastest replica, spread
 *    evenly over its layers; fusion one unit) and given to the planner
 *    (coordinator/planner.h) with the plan's device slots -- for a CPU plan
 *    (compute: real, one host, launcher local, every slot cpu) the host's
 *    cores instead: train.pin's list, or the cores this process may run on,
 *    with processes sharing cores (coordinator/planner_cores.h). When the planner's
 *    placement is predicted to shorten the step by at least balance.min_gain
 *    over the current placement scored with the same costs, the balancer
 *    proposes it: the coordinator checkpoints, stops the stages, relaunches
 *    them with the new placement and resumes (weights and optimizer state
 *    travel by name through the checkpoint, whatever the new cuts).
 *    A scripted re-placement (balance.force) is proposed at its step whatever
 *    the mode.
 *    `stages: auto` starts with one process per stage and takes the
 *    planner's placement after the first balance.window measured steps,
 *    whatever the gain and the mode.
 *
 *    Memory: where there is a cap (balance.device_memory_gib, or on a GPU
 *    plan its smallest GPU's memory less 1 GiB), the planner is also given
 *    each stage's measured memory (its largest peak since the launch: its
 *    parameter arenas spread over its layers, the rest per micro-batch held,
 *    coordinator/costs.h mmp_costs_per_layer_mem) and the cap, shared by the
 *    processes that share a device, and keeps every stage of its placement
 *    under it (on cores, a placement over it is not taken). When no
 *    placement fits, or a stage has no measured peak, the current placement
 *    stays, with a warning.
 *
 * Balance efficiency, measured: sum over processes of busy time / (device
 * slots x step time) -- the share of the devices' time spent working (for a
 * CPU plan, slots are its cores). Busy time is wall time inside compute;
 * where a CPU plan has more processes than cores, a process counts at most
 * the CPU time it got in the step (its busy wall time also holds the time it
 * waited for a core its neighbour held), so the share stays at most 1. */
#ifndef MMP_COORDINATOR_BALANCER_H
#define MMP_COORDINATOR_BALANCER_H

#include "common/config.h"
#include "coordinator/placement.h" /* mmp_placement_str, for the coordinator */
#include "coordinator/schedule.h"

#define MMP_BAL_WINDOW_MAX 64

/* What one process reported for one step. */
typedef struct mmp_bal_proc {
    double fwd_ms, bwd_ms; /* forward, backward of its micro-batches */
    int samples;           /* samples in them */
    double busy_ms;        /* wall time in compute over the step */
    double cpu_ms;         /* CPU time of the process over the step (0: not known) */
    /* memory (0: not reported): its peak (device memory on a GPU, RSS on the
     * CPU), its parameter arenas, the micro-batches whose activations it
     * keeps room for, and its GPU's memory in all */
    double peak_mem_bytes, state_bytes;
    int act_slots;
    double device_total_bytes;
} mmp_bal_proc;

typedef struct mmp_balancer {
    mmp_plan cur; /* the plan with the placement running now */
    const mmp_sched *sched;
    int slots;      /* device slots (>= 1): for a CPU plan its cores */
    int cores;      /* CPU plans: the host's cores, planned for with mmp_planner_cores_plan; 0 */
    int steps_seen; /* steps observed since the (re)launch */
    /* per process, the last steps' ms per sample (ring of balance.window) */
    double ms_per_sample[MMP_SCHED_MAX_STAGES][MMP_BAL_WINDOW_MAX];
    double fwd_share[MMP_SCHED_MAX_STAGES];    /* forward's share of it, last step */
    double routed_speed[MMP_SCHED_MAX_STAGES]; /* what the routing was compiled with */
    double efficiency;                         /* the last step's, measured */
    const char *plan_json; /* the run's plan.json, which balance.force.set overrides */
    /* after mmp_balancer_replan said go on cores: each new process's nice
     * value (coordinator/planner_cores.h, Priorities), all 0 otherwise */
    int next_nice[MMP_SCHED_MAX_STAGES];
    /* memory since the (re)launch, per process: the largest peak and the
     * state and slots reported with it; the smallest GPU seen (0: none) */
    double mem_peak[MMP_SCHED_MAX_STAGES], mem_state[MMP_SCHED_MAX_STAGES];
    int mem_slots[MMP_SCHED_MAX_STAGES];
    double device_total;
    int mem_warned; /* a memory warning was logged since the (re)launch (once is enough) */
} mmp_balancer;

/* Starts over for a (re)launched placement: cur is copied; sched (its
 * compiled schedule, speeds included) must outlive the next calls. */
void mmp_balancer_reset(mmp_balancer *b, const mmp_plan *cur, const mmp_sched *sched,
                        const char *plan_json);

/* One step's reports, procs[i] for process i of sched; step_ms its wall time. */
void mmp_balancer_observe(mmp_balancer *b, const mmp_bal_proc *procs, double step_ms);

/* Whether the routing should change; if so speed[i] (per process) are the
 * weights to compile it with and why (a sentence) says which stage and how. */
int mmp_balancer_route(mmp_balancer *b, double *speed, char *why, size_t why_n);
/* The coordinator compiled and sent the routing with speed. */
void mmp_balancer_routed(mmp_balancer *b, const double *speed);

/* Whether to re-place after step `done` (steps completed). If so *next is
 * cur with the new stages.*, why says the reason and *gain the predicted
 * step-time gain (current / new - 1; NAN for a scripted one).
 * MMP_ERR_* (with a message) when the planner or a scripted override fails. */
mmp_err mmp_balancer_replan(mmp_balancer *b, int done, mmp_plan *next, int *go, char *why,
                            size_t why_n, double *gain);

/* Whether the balancer may act after step `done` (re-route or re-place), to
 * be asked before that step is observed: 0 means mmp_balancer_route and
 * mmp_balancer_replan will certainly do nothing then (static routing, no
 * dynamic mode or profiling window ending, no scripted move at done), so
 * the coordinator may start step done + 1 before step done's reports are in
 * (coordinator/steps.c). */
int mmp_balancer_may_act(const mmp_balancer *b, int done);

/* The scripted re-placement: plan_json (the run's plan) loaded with the
 * n_sets overrides it was loaded with (none for a plan.json), then cur's
 * balance.force.set overrides, only stages.* keys allowed. launch calls it
 * before it creates the run directory (with the plan file and its --set
 * overrides) and the coordinator at start, so a bad script fails before
 * anything is written. MMP_ERR_CONFIG naming balance.force.set. */
mmp_err mmp_balancer_forced_plan(const mmp_plan *cur, const char *plan_json,
                                 const char *const *sets, int n_sets, mmp_plan *next);

#endif
