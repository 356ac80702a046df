/* What the schedule's own files share (coordinator/schedule*.c) and nobody
 * else includes: the instruction predicates, the routing lookups, and the
 * executor that both the checker (deadlock freedom, by running the lists) and
 * the simulator (the same run with costs) use. The contract for everyone
 * else is coordinator/schedule.h.
 *
 * Files: schedule.c (instruction names and these helpers), schedule_compile.c
 * (stage graph, routing, lists), schedule_validate.c (the checker),
 * schedule_simulate.c (the executor and the step simulator). */
#ifndef MMP_COORDINATOR_SCHEDULE_INTERNAL_H
#define MMP_COORDINATOR_SCHEDULE_INTERNAL_H

#include "coordinator/schedule.h"

/* ---- instructions (schedule.c) -------------------------------------------------- */

int mmp_op_valid(int op);
int mmp_op_is_send(mmp_op op);
int mmp_op_is_recv(mmp_op op);
int mmp_op_is_grad(mmp_op op); /* RECV_GRAD, SEND_GRAD */
int mmp_op_is_step(mmp_op op); /* GRAD_NORM, OPT_STEP: no micro-batch, no edge */
int mmp_op_is_bwd(mmp_op op);  /* BWD, BWD_INPUT: the backward other stages wait for */

/* Whether process g handles micro-batch mb (a hand-made schedule without a
 * routing table: every one). */
int mmp_sched_owns(const mmp_sched_stage *g, int mb);
/* Whether micro-batch mb travels on edge e: both ends handle it. */
int mmp_sched_edge_carries(const mmp_sched *s, int e, int mb);
/* Each process's edges, in edge order, by role: with R replicas on both
 * sides of a stage pair there are 2 R^2 edges, so the compiler and the
 * checker must not scan them all for every process (1024 processes:
 * hundreds of thousands of edges). CSR: process st's incoming edges are
 * in[in_at[st] .. in_at[st+1]), its outgoing out[out_at[st] .. out_at[st+1]).
 * The edges' ends must be in range (0 .. n_stages-1). MMP_ERR_NOMEM;
 * mmp_sched_adj_fini is valid after a failure. */
typedef struct mmp_sched_adj {
    int *in_at, *in, *out_at, *out;
} mmp_sched_adj;
mmp_err mmp_sched_adj_init(mmp_sched_adj *a, const mmp_sched *s);
void mmp_sched_adj_fini(mmp_sched_adj *a);
/* The process's name for messages ("image.0/1"), or the stage's. */
const char *mmp_sched_pname(const mmp_sched_stage *g);
/* Most micro-batches forwarded and not yet backwarded at any point of g's
 * list; *at is the FWD that first exceeds bound (-1 if none). */
int mmp_sched_list_inflight(const mmp_sched_stage *g, int bound, int *at);

/* ---- the executor (schedule_simulate.c) ------------------------------------------ */

/* Runs every list together, one instruction at a time, with bounded
 * channels. Its channel model must stay at least as strict as the runtime's
 * ring (transport/channel.h): message k on an edge takes slot k % slots, so it
 * can be sent only once message k - slots has been released, and a message is
 * released when the receiving stage finishes the first FWD or BWD (or
 * BWD_INPUT; never BWD_WEIGHT, which receives nothing) after its RECV (that
 * compute reads it in place). GRAD_NORM is a barrier over all
 * stages. Times follow the costs; with all-zero costs it is the plain
 * lock-step check. With s->batch_loss a fusion BWD waits until every fusion
 * process has run all the step's FWDs (m in all). The result does not depend on the order stages
 * are visited in: every instruction's time is a max over its own predecessors. */
typedef struct mmp_sched_exec_edge {
    int n_msgs; /* sends on the edge in the lists */
    int sent, received, released;
    double *arrive; /* [n_msgs] when message k can be received */
    double *freed;  /* [n_msgs] when message k's slot was released */
} mmp_sched_exec_edge;

typedef struct mmp_sched_exec_stage {
    int pc;
    double t, busy;
    int *held; /* edges of received messages not released yet, in receive order */
    int n_held;
    int at_barrier;
    int fwds; /* FWDs run */
} mmp_sched_exec_stage;

typedef struct mmp_sched_exec {
    const mmp_sched *s;
    const mmp_sim_costs *c;
    mmp_sched_exec_edge *edges; /* [s->n_edges] */
    mmp_sched_exec_stage stages[MMP_SCHED_MAX_STAGES];
    int n_at_barrier;
    double barrier_t;
    /* batch_loss: FWDs run on fusion processes and when the last ended */
    int fusion_fwds;
    double fusion_fwd_t;
    double *times; /* backs every edge's arrive and freed */
    int *held;     /* backs every stage's held */
} mmp_sched_exec;

/* Prepares x to run s's lists with costs c (both must outlive x's use).
 * s must have passed the checker's structure checks (edges and ops in range).
 * MMP_ERR_NOMEM; mmp_sched_exec_fini is valid after a failure. */
mmp_err mmp_sched_exec_init(mmp_sched_exec *x, const mmp_sched *s, const mmp_sim_costs *c);
/* Runs until every list ends (1) or no stage can move (0: a deadlock). */
int mmp_sched_exec_run(mmp_sched_exec *x);
void mmp_sched_exec_fini(mmp_sched_exec *x);

/* ---- the checker (schedule_validate.c) --------------------------------------------- */

/* MMP_ERR_INTERNAL naming the cycle of waits that stopped x (or, failing
 * one, every blocked stage). */
mmp_err mmp_sched_deadlock_err(const mmp_sched *s, const mmp_sched_exec *x);

#endif
