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
 * Backward always runs micro-batches in ascending order on every stage, the
 * order the single-process trainer accumulates gradients in, so every
 * schedule gives bit-identical gradients. The same lists drive the
 * discrete-event simulation behind `mmpipe simulate`. */
#ifndef MMP_COORDINATOR_SCHEDULE_H
#define MMP_COORDINATOR_SCHEDULE_H

#include "common/config.h"
#include "common/err.h"

#define MMP_SCHED_MAX_STAGES 32
#define MMP_SCHED_MAX_EDGES 64

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
} mmp_op;

typedef enum mmp_stage_kind { MMP_KIND_IMAGE = 0, MMP_KIND_TEXT = 1, MMP_KIND_FUSION = 2 } mmp_stage_kind;

typedef struct mmp_instr {
    mmp_op op;
    int mb;
    int edge; /* index into mmp_sched.edges, -1 when none */
} mmp_instr;

typedef struct mmp_sched_stage {
    char name[32];       /* "image.0", "text.0", "fusion" */
    mmp_stage_kind kind;
    int sub, n_sub;      /* sub-stage index in its branch, and the branch's count */
    int layer_first, layer_last;
    int depth;           /* stages from this one to the end inclusive (fusion: 1) */
    int inflight_bound;  /* most activations the schedule may hold (1F1B: depth; GPipe: m) */
    int max_inflight;    /* what the compiled list actually holds at most */
    mmp_instr *prog;
    int n_prog;
} mmp_sched_stage;

typedef struct mmp_sched_edge {
    int from, to;  /* stage indices */
    int grad;      /* 0: activations from -> to; 1: gradients from -> to */
    int slots;     /* ring depth this schedule needs on the edge */
} mmp_sched_edge;

typedef struct mmp_sched {
    mmp_schedule kind;
    int microbatches;
    int n_stages, n_edges;
    mmp_sched_stage stages[MMP_SCHED_MAX_STAGES];
    mmp_sched_edge edges[MMP_SCHED_MAX_EDGES];
} mmp_sched;

/* Builds the stage graph from plan->stages (splits) and plan->train
 * (microbatches, schedule) and compiles every stage's list, then validates it.
 * MMP_ERR_CONFIG on a plan it cannot compile, MMP_ERR_INTERNAL (with the
 * stage, instruction index and reason) when validation fails. */
mmp_err mmp_sched_compile(mmp_sched *s, const mmp_plan *plan);
void mmp_sched_fini(mmp_sched *s);

/* Checks a compiled (or hand-made) schedule as described above. */
mmp_err mmp_sched_validate(const mmp_sched *s);

/* "F3" / "RECV_ACT e2 mb3" ... for error messages and --dump. */
const char *mmp_op_name(mmp_op op);
/* Index of the stage named name, or -1. */
int mmp_sched_find(const mmp_sched *s, const char *name);

/* ---- simulation ---------------------------------------------------------------- */
typedef struct mmp_sim_costs {
    double fwd_ms[MMP_SCHED_MAX_STAGES]; /* per micro-batch, per stage */
    double bwd_ms[MMP_SCHED_MAX_STAGES];
    double load_ms[MMP_SCHED_MAX_STAGES]; /* LOAD, first sub-stages of branches */
    double send_ms;                       /* per message hand-off latency */
    double step_overhead_ms;              /* grad-norm round trip + optimizer, per step */
} mmp_sim_costs;

typedef struct mmp_sim_result {
    double step_ms;
    double busy_ms[MMP_SCHED_MAX_STAGES];
    double idle_ms[MMP_SCHED_MAX_STAGES]; /* step_ms - busy */
    double bubble;                        /* sum idle / (stages * step_ms) */
} mmp_sim_result;

/* Runs one step of the lists as a discrete-event simulation: every stage
 * executes its list in order; a RECV waits for its message's arrival
 * (send time + send_ms); a SEND waits for a free slot on its edge. */
mmp_err mmp_sched_simulate(const mmp_sched *s, const mmp_sim_costs *c, mmp_sim_result *r);

#endif
