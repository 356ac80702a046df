/* Pipeline schedules, compiled into one instruction list per stage process.
 *
 * The stage graph is a DAG: the image branch (sub-stages image.0 ... image.I-1,
 * cut at stages.image.split) and the text branch (text.0 ... text.J-1) run
 * concurrently and both feed `fusion`. Edges carry activations forward
 * (image.k -> image.k+1, last sub-stage -> fusion) and gradients back on a
 * paired edge. A compiled schedule is checked before anything runs: every
 * receive has its send and vice versa, each micro-batch's F precedes its B,
 * the lists can run to the end with the channels' slot counts (no cycle of
 * waits: checked by executing them), and no stage holds more micro-batches'
 * activations than the schedule's bound (1F1B: its depth, the number of
 * stages from it to the end of the pipeline inclusive; GPipe: all m).
 *
 * Replicas: a stage may run as R replica processes (data parallel inside
 * the stage). Every process is one entry of the compiled schedule (replicas
 * of a stage are consecutive, replica 0 first). Each micro-batch is handled by
 * exactly one replica of every stage; which one is the routing table
 * (`owns`), compiled from the replicas' relative speeds (mmp_sched_route):
 * equal speeds deal micro-batches in turn, a replica half as fast gets half
 * as many. Consecutive stages are joined by an edge pair between every
 * replica pair, so a new routing changes the lists but never the channels.
 * Replicas of a stage sum their gradients before GRAD_NORM (the worker does
 * it; the lists do not name it).
 *
 * A replica's list is its micro-batches' part of one order for the whole
 * stage: `warm` forwards, then forward / backward pairs, then the remaining
 * backwards. 1F1B warms up with max(R depth - 1, warm of the next stage +
 * 1), at most m (R = 1: depth - 1, the textbook); GPipe with m. Every
 * replica runs a sub-sequence of the stage's order, so the replicated lists
 * finish whenever the one-process lists do (the checker proves it anyway),
 * and R replicas keep about depth micro-batches each in flight (one more
 * than a lone stage's depth - 1 warm-up each: a replica that is slow or
 * routed unevenly does not stall the others at every hand-off).
 *
 * Batch-wide loss (model.fusion.itc_scope: batch, mmp_sched.batch_loss):
 * the fusion's backward of any micro-batch needs the whole step's features,
 * so it waits for the step's last forward on every fusion replica. The
 * compiler then warms every stage up with all m forwards (fusion: F0 .. Fm-1
 * B0 .. Bm-1; a branch's 1F1B order F0 F1 B0 F2 ... would wait for B0's
 * gradient while fusion waits for F2: a deadlock), so 1F1B and GPipe give
 * the same lists and every stage holds all m micro-batches' activations.
 * The checker rejects a fusion list with a BWD before its last FWD, and the
 * executor (hence the deadlock check and `mmpipe simulate`) holds every
 * fusion BWD until all fusion FWDs of the step have run.
 *
 * Zero bubble (zb-h1; Qi et al., 2023, "Zero Bubble Pipeline Parallelism",
 * schedule H1): every stage's backward is split into BWD_INPUT (B: the
 * input gradient, which the stage before waits for, and the gradients that
 * are not linear/conv weight GEMMs) and BWD_WEIGHT (W: the deferred weight
 * gradients, which nobody waits for). F and B run in 1F1B's order; W(i)
 * follows the B that leaves more than `defer` weight passes pending, and
 * the rest end the list. defer = P - bound, P the largest 1F1B bound of any
 * stage (the first image sub-stage's depth), so fusion and the last branch
 * sub-stages defer the most and the first none, and a micro-batch is held
 * from its F to its W: every stage holds at most P, 1F1B's peak. Along the
 * chain the gradients travel by B alone (W is off the critical path), and
 * the deferred W's fill warm-up and cool-down, where 1F1B waits: with
 * F = B = W the bubble is a third of 1F1B's. Under the batch-wide loss
 * every bound is m and a branch's defer is 0 (each W follows its B: the W's
 * still run while a stage waits for its next gradient); the fusion splits
 * too and defers all its W's to the end of its list (its first B runs the
 * whole batch's loss and input gradients, its first W the batch's weight
 * gradients; in simulated compute each costs half the micro-batch's
 * backward), so the gradients reach the branches without the fusion's
 * weight GEMMs ahead of them and those fill the drain, where the fusion
 * would wait for the branches' last backwards.
 *
 * Backward always runs micro-batches in ascending order on every process, the
 * order the single-process trainer accumulates gradients in, so every
 * schedule without replicas gives bit-identical gradients (with replicas, the
 * replica sums are added in replica order: equal up to float rounding). The
 * same lists drive the discrete-event simulation behind `mmpipe simulate`.
 *
 * One file per job: schedule_compile.c (mmp_sched_compile*, mmp_sched_route),
 * schedule_validate.c (mmp_sched_validate), schedule_simulate.c
 * (mmp_sched_simulate), schedule.c (instruction names, mmp_sched_find). */
#ifndef MMP_COORDINATOR_SCHEDULE_H
#define MMP_COORDINATOR_SCHEDULE_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"

/* Processes: sub-stages x replicas, fusion's included. A schedule holds its
 * stages inline (about 160 bytes each) and its edges on the heap: every
 * replica pair of consecutive stages has two, so the edges grow with the
 * product of the replica counts (at most 2 (3 x 256^2 + 256) with
 * MMP_MAX_REPLICAS = 256, well under MMP_SCHED_MAX_EDGES). */
#define MMP_SCHED_MAX_STAGES 1024
#define MMP_SCHED_MAX_EDGES (1 << 20)

/* Values equal the proto's mmpipe.Op. */
typedef enum mmp_op {
    MMP_OP_LOAD = 1,
    MMP_OP_RECV_ACT = 2,
    MMP_OP_FWD = 3,
    MMP_OP_SEND_ACT = 4,
    MMP_OP_RECV_GRAD = 5,
    MMP_OP_BWD = 6,
    MMP_OP_SEND_GRAD = 7,
    MMP_OP_GRAD_NORM = 8,
    MMP_OP_OPT_STEP = 9,
    MMP_OP_BWD_INPUT = 10,  /* zb-h1's B: input gradients; the weight part is recorded */
    MMP_OP_BWD_WEIGHT = 11, /* zb-h1's W: the recorded weight gradients of mb */
} mmp_op;

typedef enum mmp_stage_kind {
    MMP_KIND_IMAGE = 0,
    MMP_KIND_TEXT = 1,
    MMP_KIND_FUSION = 2
} mmp_stage_kind;

typedef struct mmp_instr {
    mmp_op op;
    int mb;
    int edge; /* index into mmp_sched.edges, -1 when none */
} mmp_instr;

typedef struct mmp_sched_stage {
    char name[32];           /* "image.0", "text.0", "fusion": the stage, shared by its replicas */
    char proc[40];           /* "image.0/1": this process (set by the compiler) */
    int replica, n_replicas; /* 0 .. n_replicas-1; 0 and 0 are read as 0 of 1 */
    double speed;            /* routing weight, > 0 (0 is read as 1): relative throughput */
    unsigned char *owns;     /* [microbatches] 1 where this replica handles mb (compiled) */
    int n_owned;
    mmp_stage_kind kind;
    int sub, n_sub;              /* sub-stage index in its branch, and the branch's count */
    int layer_first, layer_last; /* the half-open range [first, last) of the branch's layers */
    int depth;                   /* stages from this one to the end inclusive (fusion: 1) */
    int inflight_bound;          /* most activations the schedule may hold (1F1B: depth; GPipe: m;
                                    of its own micro-batches) */
    int stage_bound;             /* the same for any routing and replica: warm + 1 (at most m) */
    int warm;                    /* forwards before the first backward in the stage's order */
    int defer;                   /* zb-h1: weight passes a split stage leaves pending (else 0) */
    int max_inflight;            /* what the compiled list actually holds at most */
    mmp_instr *prog;
    int n_prog;
} mmp_sched_stage;

typedef struct mmp_sched_edge {
    int from, to; /* stage indices */
    int grad;     /* 0: activations from -> to; 1: gradients from -> to */
    int slots;    /* ring depth this schedule needs on the edge */
} mmp_sched_edge;

typedef struct mmp_sched {
    mmp_schedule kind;
    int microbatches;
    /* 1: the fusion's backwards wait for the step's last forward (ITC over
     * the whole batch, model.fusion.itc_scope: batch). Set from the plan by
     * mmp_sched_compile*; callers of mmp_sched_compile_stages set it (0:
     * per-micro-batch loss) before the call. */
    int batch_loss;
    int n_stages, n_edges;
    mmp_sched_stage stages[MMP_SCHED_MAX_STAGES];
    /* [n_edges], malloc'ed by the compiler (mmp_sched_fini frees it; a
     * hand-made schedule sets a malloc'ed array, or its own and NULLs it
     * before mmp_sched_fini). A struct copy moves it with the lists. */
    mmp_sched_edge *edges;
} mmp_sched;

/* Builds the stage graph from plan->stages (splits, replicas), plan->train
 * (microbatches, schedule) and model.fusion.itc_scope, and compiles every process's list, then
 * validates it. MMP_ERR_CONFIG on a plan it cannot compile, MMP_ERR_INTERNAL (with the stage,
 * instruction index and reason) when validation fails. */
mmp_err mmp_sched_compile(mmp_sched *s, const mmp_plan *plan);
/* The same with routing weights: speed[i] for process i in the order
 * mmp_sched_compile gives (NULL: all equal). */
mmp_err mmp_sched_compile_routed(mmp_sched *s, const mmp_plan *plan, const double *speed);
void mmp_sched_fini(mmp_sched *s);

/* Deals micro-batches 0..m-1 to R replicas of relative speeds speed[0..R-1]
 * (each > 0): in order, each goes to the replica that would finish it first,
 * the least (count + 1) / speed, ties to the lower index, except that every
 * replica gets at least one when m >= R (the last micro-batches go to
 * replicas that have none): a replica measured very slow once still takes
 * part and is measured again. owner[mb] gets the replica. Equal speeds deal
 * in turn (round robin). */
void mmp_sched_route(const double *speed, int R, int m, int *owner);

/* The lower half of mmp_sched_compile, for stage graphs no plan can express
 * (tests, what-if placements): the caller fills s->n_stages and, per
 * process, name, kind, sub, n_sub, the layer range, and replica, n_replicas
 * and speed (zeros: one replica) -- exactly one FUSION stage; each branch's
 * subs 0..n_sub-1 once each; a stage's replicas consecutive, in order. Builds
 * the routing, edges, depths, bounds, slot counts and every list, then
 * validates. Overwrites (does not free) the stages' lists, routing and the
 * edges; mmp_sched_fini frees what it made, also after a failure.
 * MMP_ERR_CONFIG for a graph it cannot compile. */
mmp_err mmp_sched_compile_stages(mmp_sched *s, mmp_schedule kind, int microbatches);

/* Checks a compiled (or hand-made) schedule as described above. */
mmp_err mmp_sched_validate(const mmp_sched *s);

/* "RECV_ACT", "FWD", ...; "?" for a value that is no op. */
const char *mmp_op_name(mmp_op op);
/* "RECV_ACT e2 mb3", "FWD mb3", "GRAD_NORM": one instruction for error
 * messages. Writes at most n bytes to buf and returns buf. */
const char *mmp_instr_str(const mmp_instr *in, char *buf, size_t n);
/* The compact form --dump prints: "L3" load, "Ra3"/"Sa3" receive/send
 * activation, "F3" forward, "Rg3"/"Sg3" receive/send gradient, "B3" backward,
 * "NORM", "OPT"; zb-h1's split backward "Bi3" (BWD_INPUT) and "W3" (BWD_WEIGHT). A receive or send
 * gets ":e<k>" appended when stage has more than one edge in that role (fusion's two inputs).
 * Returns buf. */
const char *mmp_instr_compact(const mmp_sched *s, int stage, const mmp_instr *in, char *buf,
                              size_t n);
/* Index of the first process (replica 0) of the stage named name, or of the
 * process named name ("image.0/1"), or -1. */
int mmp_sched_find(const mmp_sched *s, const char *name);

/* ---- simulation ---------------------------------------------------------------- */
typedef struct mmp_sim_costs {
    double fwd_ms[MMP_SCHED_MAX_STAGES]; /* per micro-batch, per stage */
    double bwd_ms[MMP_SCHED_MAX_STAGES];
    /* The weight-gradient pass's share of bwd_ms, where a list splits the
     * backward (BWD_INPUT costs bwd_ms - wgt_ms, BWD_WEIGHT wgt_ms); 0: half
     * of bwd_ms (GEMM-bound layers: dX and dW are GEMMs of the same size).
     * Measured costs of a zb-h1 run carry it (metrics.jsonl's wgt_ms). */
    double wgt_ms[MMP_SCHED_MAX_STAGES];
    double load_ms[MMP_SCHED_MAX_STAGES]; /* LOAD, first sub-stages of branches */
    double send_ms;                       /* per message hand-off latency */
    double step_overhead_ms;              /* grad-norm round trip + optimizer, per step */
    /* Peak memory per process (device memory on a GPU stage, RSS on a CPU
     * one), the most any measured step recorded; 0 when not measured. The
     * simulator ignores it; the planner's memory cap reads it. */
    double mem_bytes[MMP_SCHED_MAX_STAGES];
    /* With it (0: not reported): the process's parameter arenas, and the
     * micro-batches whose activations it keeps room for (coordinator/costs.h,
     * mmp_costs_per_layer_mem). */
    double state_bytes[MMP_SCHED_MAX_STAGES];
    int act_slots[MMP_SCHED_MAX_STAGES];
} mmp_sim_costs;

typedef struct mmp_sim_result {
    double step_ms;
    double busy_ms[MMP_SCHED_MAX_STAGES];
    double idle_ms[MMP_SCHED_MAX_STAGES]; /* step_ms - busy */
    double bubble;                        /* sum idle / (stages * step_ms) */
} mmp_sim_result;

/* Runs one step of the lists as a discrete-event simulation: every stage
 * executes its list in order; a RECV waits for its message's arrival
 * (send time + send_ms); a SEND waits for a free slot on its edge. A message
 * holds its slot until the receiving stage finishes the first FWD or BWD
 * after the RECV (that compute reads it in place). GRAD_NORM is a barrier
 * over all stages, after which step_overhead_ms passes (counted as busy: it is
 * every stage's own clip + optimizer work, not pipeline idle). Validates s
 * first (its errors are returned as they are); MMP_ERR_INVALID for a cost
 * that is negative or not finite. Never blocks, allocates O(list lengths). */
mmp_err mmp_sched_simulate(const mmp_sched *s, const mmp_sim_costs *c, mmp_sim_result *r);

#endif
